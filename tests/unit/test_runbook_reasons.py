"""docs/operations.md explains every reason each family's classify can give, in that
family's section: the reasons are produced here from evidence that breaks every bound."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts.health import Classification
from contracts.policy import Family
from health.families import REGISTRY

RUNBOOK = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()

OBSERVED_AT = 10_000_000
LONG_AGO = 1_000  # every stored time: valid, and older than any bound of 0
COUNT = 5  # every count: over any bound of 0
WINDOW_MS = 1_000
# The one setting that is no count, age or time: the relay's receipt retention, under,
# over and not given.
RETENTIONS = (None, 1, 10**12)


def _setting(name: str) -> int | bool:
    if name == "gates_readiness":
        return True
    # Every bound 0: anything counted or aged is over it. A window (grace, look-back) is
    # no bound: longer than the shortest receipt retention below.
    return 0 if name.startswith("max_") else WINDOW_MS


def _policy(policy_type: type[Any]) -> Any:
    """A section with every bound 0."""
    fields = msgspec.structs.fields(policy_type)
    return msgspec.convert({f.name: _setting(f.name) for f in fields}, policy_type)


def _evidence_variants(evidence_type: type[Any]) -> list[Any]:
    """Evidence breaking every bound, and the same with each optional time missing, and
    each receipt retention."""
    base: dict[str, Any] = {}
    optional = []
    for field in msgspec.structs.fields(evidence_type):
        if field.name == "observed_at_unix_ms":
            base[field.name] = OBSERVED_AT
        elif field.name == "receipt_retention_ms":
            base[field.name] = None
        elif field.name.endswith("_unix_ms"):
            base[field.name] = LONG_AGO
            optional.append(field.name)
        else:
            base[field.name] = COUNT if field.name.endswith("_count") else 0
    variants = [base] + [{**base, name: None} for name in optional]
    if "receipt_retention_ms" in base:
        variants = [{**v, "receipt_retention_ms": r} for v in variants for r in RETENTIONS]
    return [msgspec.convert(v, evidence_type) for v in variants]


def reasons_of(family: Family) -> set[str]:
    """Every stalled or (non-time) unknown reason the family's classify gives."""
    spec = REGISTRY[family]
    policy = _policy(spec.policy_type)
    found: set[str] = set()
    for evidence in _evidence_variants(spec.evidence_type):
        classification, reasons = spec.classify(evidence, policy)
        if classification is not Classification.WITHIN_BOUNDS:
            found.update(reasons)
    return found


def _shape(text: str) -> str:
    """Numbers and the runbook's placeholders alike, and only the part before a colon."""
    text = text.split(": ", 1)[0]
    return re.sub(r"\b(?:\d+|N|M|X|Y)\b", "#", text)


def family_section(family: Family) -> str:
    start = RUNBOOK.index(f'<a id="family-{family.value}"></a>')
    end = RUNBOOK.find('<a id="', start + 1)
    return RUNBOOK[start : end if end >= 0 else len(RUNBOOK)]


@pytest.mark.parametrize("family", list(Family), ids=lambda f: f.value)
def test_every_reason_of_a_family_is_explained_in_its_section(family: Family) -> None:
    reasons = reasons_of(family)
    assert reasons, family
    section = _shape(family_section(family).replace(": ", " "))
    for reason in reasons:
        assert _shape(reason) in section, (family.value, reason)


def test_the_shapes_match_placeholders_and_numbers() -> None:
    assert _shape("missing_count 3 > max_missing_count 0") == _shape(
        "missing_count N > max_missing_count M"
    )
    assert _shape("a 1: b") == "a #"
