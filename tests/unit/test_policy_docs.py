"""The docs say what the code declares, both ways: every policy field (contracts/policy.py)
is in the example and demo policy files and deploy/'s, every setting those files or the prose
(docs/health.md, docs/operations.md) name is declared, the families documented are the
families declared, and every flag and variable docs/operations.md names is declared in
``outbox_relay.options`` (docs/cli.md's tables are held by test_options_docs.py)."""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from types import NoneType

import msgspec
import pytest

from contracts.policy import Family, Policy
from health.policy import load_policy
from outbox_relay.options import OPTIONS

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
POLICY_FILES = [
    DOCS / "policy.example.toml",
    DOCS / "policy.demo.toml",
    REPO / "deploy" / "base" / "policy.toml",
]
PROSE = [DOCS / "health.md", DOCS / "operations.md"]

# The key that disables a family; it replaces the family's settings, so no struct has it.
ENABLED = "enabled"


def _fields(struct: type[msgspec.Struct]) -> set[str]:
    return set(struct.__struct_fields__)


def declared_sections() -> dict[str, set[str]]:
    """Every policy section and its settings, read from the types."""
    hints = typing.get_type_hints(Policy)
    sections: dict[str, set[str]] = {}
    for name in Policy.__struct_fields__:
        structs = [t for t in typing.get_args(hints[name]) or (hints[name],) if t is not NoneType]
        assert len(structs) == 1 and issubclass(structs[0], msgspec.Struct), name
        sections[name] = _fields(structs[0])
    return sections


SECTIONS = declared_sections()
EVERY_SETTING = set().union(*SECTIONS.values()) | {ENABLED}


def test_the_declared_sections_are_every_family_and_the_evaluation() -> None:
    assert set(SECTIONS) == {f.value for f in Family} | {"evaluation"}
    assert SECTIONS["evaluation"] == {"interval_ms", "timeout_ms", "max_evidence_age_ms"}


@pytest.mark.parametrize("path", POLICY_FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_policy_file_has_every_setting_and_only_declared_ones(path: Path) -> None:
    document = tomllib.loads(path.read_text())
    assert set(document) == set(SECTIONS), path.name
    for section, keys in document.items():
        assert set(keys) == SECTIONS[section], (path.name, section)
    # And the product loads it.
    policy = load_policy(str(path))
    assert policy.enabled_families() == tuple(Family)


def test_the_example_shows_how_to_disable_a_family() -> None:
    assert re.search(r"^# enabled = false", (DOCS / "policy.example.toml").read_text(), re.M)


# A setting named in prose: `max_…`, `…_ms` (not a column's `…_unix_ms`), `gates_readiness`,
# alone in a code span or as `[section] name` / `name = value`.
_SPAN = re.compile(r"`([^`\n]+)`")
_SETTING = re.compile(
    r"^(?:\[(?P<section>[a-z_]+)\] )?(?P<name>max_[a-z_]+|[a-z_]+_ms|gates_readiness)(?: = .*)?$"
)


def named_settings(text: str) -> list[tuple[str | None, str]]:
    """(section or None, setting) for every policy-looking code span."""
    found = []
    for span in _SPAN.findall(text):
        match = _SETTING.match(span.strip())
        if match and not match["name"].endswith("_unix_ms"):
            found.append((match["section"], match["name"]))
    return found


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (
            "`max_pending_count` and `grace_ms = 0`",
            [(None, "max_pending_count"), (None, "grace_ms")],
        ),
        ("`[evaluation] max_evidence_age_ms`", [("evaluation", "max_evidence_age_ms")]),
        ("`active_lease_expires_at_unix_ms`, `HealthSidecar(x_ms=1)`", []),
    ],
)
def test_named_settings_finds_policy_names_only(
    text: str, found: list[tuple[str | None, str]]
) -> None:
    assert named_settings(text) == found


# Names in prose that look like settings but belong to the code, not the policy file.
NOT_POLICY = frozenset({"completion_recheck_period_ms", "database_retry_max_ms"})


@pytest.mark.parametrize("path", PROSE, ids=lambda p: p.name)
def test_every_setting_the_prose_names_is_declared(path: Path) -> None:
    named = named_settings(path.read_text())
    assert named, path.name
    for section, name in named:
        if name in NOT_POLICY:
            continue
        if section is None:
            assert name in EVERY_SETTING, (path.name, name)
        else:
            assert name in SECTIONS.get(section, set()), (path.name, section, name)


def test_health_md_documents_exactly_the_declared_families() -> None:
    text = (DOCS / "health.md").read_text()
    families = text.split("## Families", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|", families, re.M)
    assert rows == [f.value for f in Family]


def test_operations_md_has_a_section_for_every_family() -> None:
    text = (DOCS / "operations.md").read_text()
    anchors = re.findall(r'<a id="family-([a-z_]+)"></a>', text)
    assert anchors == [f.value for f in Family]


_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")
_VARIABLE = re.compile(r"\b((?:OUTBOX_RELAY|KAFKA|HEALTH)_[A-Z0-9_]+|DATABASE_URL)\b")
# Flags of other programs the runbook quotes.
FOREIGN_FLAGS = frozenset({"--alter", "--partitions", "--for", "--timeout"})


def test_every_flag_and_variable_operations_md_names_is_declared() -> None:
    text = (DOCS / "operations.md").read_text()
    flags = {option.flag for option in OPTIONS}
    variables = {v for option in OPTIONS for v in (option.env, option.fallback_env) if v}
    named_flags = set(_FLAG.findall(text)) - FOREIGN_FLAGS
    assert named_flags, "the runbook names flags"
    assert named_flags - flags == set()
    assert set(_VARIABLE.findall(text)) - variables == set()
