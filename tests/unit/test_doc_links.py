"""Every relative link in README.md, CHANGELOG.md and docs/**/*.md resolves: the file or
directory exists, and an ``#anchor`` names a heading of the target as GitHub spells its id
(or an explicit ``<a id>``). README and docs/benchmarks.md stay reference-sized. What the
code's comments and docstrings point at is there too: an anchor, a file of the repository,
a section named by its heading."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?")
_HTML_TARGET = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"")
_HTML_ID = re.compile(r"<a\s[^>]*?(?:id|name)=\"([^\"]+)\"")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:|^//")
_LINE_ANCHOR = re.compile(r"L\d+(-L\d+)?")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def heading_text(markdown: str) -> str:
    """What a heading renders as: code spans' content, links' text, no tags."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), markdown)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"<[^>]+>", "", text)


def github_slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation and symbols dropped except ``-``
    and ``_``, each space a hyphen (runs are not merged)."""
    kept = (
        c
        for c in heading_text(heading).strip().lower()
        if c in "-_ " or unicodedata.category(c)[0] in "LMN"
    )
    return "".join(kept).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every id a link may name in a markdown file: headings, numbered as GitHub numbers
    repeats, and explicit ``<a id>`` / ``<a name>``."""
    seen: dict[str, int] = {}
    ids = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        ids.update(_HTML_ID.findall(line))
        if heading := _HEADING.match(line):
            slug = github_slug(heading.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            ids.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(ids)


@dataclass(frozen=True)
class Link:
    document: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}: {self.target}"


def links(document: Path) -> list[Link]:
    """The relative link targets of a document, code spans and blocks left out."""
    found = []
    for number, line in prose_lines(document.read_text(encoding="utf-8")):
        line = _CODE_SPAN.sub("code", line)
        targets = [
            *_LINK.findall(line),
            *_REFERENCE.findall(line),
            *_HTML_TARGET.findall(line),
        ]
        found += [
            Link(document, number, target)
            for target in targets
            if target and not _SCHEME.match(target)
        ]
    return found


def broken(link: Link) -> str | None:
    """Why a link does not resolve, or None."""
    path_part, _, fragment = link.target.partition("#")
    target = (link.document.parent / unquote(path_part)).resolve() if path_part else link.document
    if not target.exists():
        return "no such file"
    if not fragment:
        return None
    if target.suffix != ".md":
        return None if _LINE_ANCHOR.fullmatch(fragment) else "an anchor into a file that has none"
    if target.is_dir() or unquote(fragment) not in anchors(target):
        return f"no heading or anchor #{fragment} in {target.relative_to(ROOT)}"
    return None


ALL_LINKS = [link for document in DOCUMENTS for link in links(document)]


def test_the_documents_and_their_links_were_found() -> None:
    assert ROOT / "docs" / "cli.md" in DOCUMENTS
    assert len(ALL_LINKS) > 50


def test_every_relative_link_resolves() -> None:
    failures = [f"{link} ({why})" for link in ALL_LINKS if (why := broken(link))]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("document", "bound"), [("README.md", 150), ("docs/benchmarks.md", 300)])
def test_the_reference_documents_stay_short(document: str, bound: int) -> None:
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    assert len(lines) < bound, f"{document} has {len(lines)} lines"


# -- the reader itself -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Health: probe → classify → compose", "health-probe--classify--compose"),
        ("`created_at` in binary (2026-12-03)", "created_at-in-binary-2026-12-03"),
        ("The relay's own CPU is the drain's bound", "the-relays-own-cpu-is-the-drains-bound"),
        ("`unknown`: `starting`", "unknown-starting"),
        ("Family `scoring_jobs`", "family-scoring_jobs"),
        ("`migrate` and the database's privileges", "migrate-and-the-databases-privileges"),
        ("Peer comparison [docs](x.md)", "peer-comparison-docs"),
        ("Latency ≤ 1.2 \u00d7 Debezium, µs", "latency--12--debezium-µs"),
    ],
)
def test_headings_get_githubs_ids(heading: str, slug: str) -> None:
    assert github_slug(heading) == slug


def test_a_repeated_heading_is_numbered_and_links_in_code_are_not_links(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    document.write_text(
        '# Title\n\n## Notes\n\n## Notes\n\n<a id="here"></a>\n\n'
        "See [it](#notes-1), `[not](#nowhere)` and [gone](missing.md).\n\n"
        "```\n[nor](#this)\n```\n\n[ref]: other.md#x\n"
    )
    assert anchors(document) == {"title", "notes", "notes-1", "here"}
    assert [link.target for link in links(document)] == ["#notes-1", "missing.md", "other.md#x"]
    assert [broken(link) for link in links(document)] == [None, "no such file", "no such file"]


_CODE_ROOTS = ("relay", "health", "outbox_relay", "scoring", "pgconnect", "contracts")
_CODE_ROOTS += ("migrations", "scripts", "tests", "bench")
_DOC_ANCHOR = re.compile(r"\b(docs/[\w/.-]+\.md)#([\w-]+)")


def test_anchors_that_code_points_at_exist() -> None:
    """A comment or docstring that sends the reader to ``docs/x.md#anchor`` names a heading
    that is there."""
    failures = []
    for root in _CODE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for document, anchor in _DOC_ANCHOR.findall(line):
                    target = ROOT / document
                    if not target.is_file() or anchor not in anchors(target):
                        failures.append(f"{path.relative_to(ROOT)}:{number}: {document}#{anchor}")
    assert not failures, "\n".join(failures)


# -- pointers from code: the files and sections a comment or docstring names --------------
_ROOTS = "|".join((*_CODE_ROOTS, "docs", "deploy", "examples", "release"))
_REPO_PATH = re.compile(
    rf"(?<![\w/.-])((?:{_ROOTS})/[\w/.-]*\w\.(?:py|md|sql|toml|yaml|json|jsonl|sh))\b"
)
_SECTION = re.compile(
    r"\b(docs/[\w/.-]+\.md)(?:'s)?(?:,| \(|\s+\()\s*\"(\w[^\"]*)\"((?:\s+and\s+\"[^\"]+\")*)"
)
_MORE_SECTIONS = re.compile(r"\"([^\"]+)\"")
_BOLD_LEAD = re.compile(r"\*\*([^*]+?)\.?\*\*")
# Stale pointers in relay/, which the relay-core part of issue 53 rewrites: each is still
# stale (the test says so once it is not), and no other pointer may be.
_AWAITING_RELAY_CORE = frozenset({("relay/producer.py", "tests/soak/test_found_stall_exit.py")})


def code_prose(path: Path) -> list[tuple[int, str]]:
    """A Python file's comments (a run of comment lines as one text) and its string
    statements (docstrings, and those that document an attribute), each with its first line."""
    text = path.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    run: list[str] = []
    start = last = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            if run and token.start[0] != last + 1:
                found.append((start, " ".join(run)))
                run = []
            if not run:
                start = token.start[0]
            run.append(token.string.lstrip("#").strip())
            last = token.start[0]
    if run:
        found.append((start, " ".join(run)))
    for node in ast.walk(ast.parse(text)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.append((node.lineno, " ".join(node.value.value.split())))
    return found


@cache
def sections(path: Path) -> frozenset[str]:
    """What a pointer may call a section of a markdown file: its headings' text and the
    bold words that lead a paragraph (``**Passes and late commits.**``)."""
    names = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        if heading := _HEADING.match(line):
            names.add(heading_text(heading.group(1)).strip())
        names.update(lead.strip() for lead in _BOLD_LEAD.findall(line))
    return frozenset(names)


def stale_pointers(path: Path) -> list[str]:
    """Each file or section that ``path``'s comments and docstrings name and that is not
    there (a file git ignores is an output a run writes, and counts as there)."""
    failures = []
    where = path.relative_to(ROOT)
    for line, text in code_prose(path):
        for target in _REPO_PATH.findall(text):
            if not (ROOT / target).exists() and not _ignored(target):
                failures.append(f"{where}:{line}: {target}")
        for document, title, more in _SECTION.findall(text):
            target = ROOT / document
            for name in (title, *_MORE_SECTIONS.findall(more)):
                if not target.is_file() or name not in sections(target):
                    failures.append(f'{where}:{line}: {document}, "{name}"')
    return failures


def _ignored(target: str) -> bool:
    checked = subprocess.run(
        ["git", "check-ignore", "-q", target], cwd=ROOT, capture_output=True, check=False
    )
    return checked.returncode == 0


def test_files_and_sections_that_code_points_at_exist() -> None:
    """A comment or docstring that names a file of the repository (``tests/x/test_y.py``,
    ``docs/x.md``) or a section (``docs/x.md, "Heading"``) names one that is there."""
    failures, awaiting = [], set()
    for root in _CODE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            if path == Path(__file__).resolve():
                continue
            for failure in stale_pointers(path):
                where, _, target = failure.partition(": ")
                key = (where.rsplit(":", 1)[0], target)
                if key in _AWAITING_RELAY_CORE:
                    awaiting.add(key)
                else:
                    failures.append(failure)
    assert not failures, "\n".join(failures)
    assert awaiting == _AWAITING_RELAY_CORE, "fixed: take it off _AWAITING_RELAY_CORE"


def test_a_stale_file_or_section_in_a_comment_or_docstring_is_found(tmp_path: Path) -> None:
    module = ROOT / "tests" / "unit" / f"planted_{tmp_path.name}.py"
    module.write_text(
        '"""See docs/relay.md, "Topics" and "No such section", and tests/unit/test_gone.py."""\n'
        '# docs/relay.md ("Publishing") and docs/relay.md, "Passes and late\n'
        '# commits" hold; docs/nowhere.md does not.\n'
        'X = "docs/missing.md, \\"Nowhere\\""  # a string in code is not prose\n'
        "Y = 1\n"
        '"""The attribute\'s docs: docs/health.md, "Not there"."""\n'
    )
    try:
        assert stale_pointers(module) == [
            f"{module.relative_to(ROOT)}:2: docs/nowhere.md",
            f"{module.relative_to(ROOT)}:1: tests/unit/test_gone.py",
            f'{module.relative_to(ROOT)}:1: docs/relay.md, "No such section"',
            f'{module.relative_to(ROOT)}:6: docs/health.md, "Not there"',
        ]
    finally:
        module.unlink()
