"""Every relative link in README.md, CHANGELOG.md and docs/**/*.md resolves: the file or
directory exists, and an ``#anchor`` names a heading of the target as GitHub spells its id
(or an explicit ``<a id>``). README and docs/benchmarks.md stay reference-sized."""

from __future__ import annotations

import re
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
