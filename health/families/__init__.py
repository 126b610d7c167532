"""The health families: one module each, and :data:`REGISTRY` mapping every ``Family`` to it.

Evaluation, rendering, metrics and policy loading loop over :data:`REGISTRY`; none of them
names a family. Adding one: the checklist in docs/architecture.md#add-a-health-family. The
type checker holds the code together: a ``Family`` member without its ``case`` here or in
``Policy.family`` fails ``assert_never``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, assert_never

from contracts.health import FamilyResult
from contracts.policy import Family, Policy
from health.families import completion_outbox, outbox, relay, scoring_jobs
from health.families.base import FamilySpec, Measurement

AnyFamilySpec = FamilySpec[Any, Any]


def _spec(family: Family) -> AnyFamilySpec:
    match family:
        case Family.OUTBOX:
            return outbox.SPEC
        case Family.SCORING_JOBS:
            return scoring_jobs.SPEC
        case Family.COMPLETION_OUTBOX:
            return completion_outbox.SPEC
        case Family.RELAY:
            return relay.SPEC
        case _:
            assert_never(family)


REGISTRY: Mapping[Family, AnyFamilySpec] = MappingProxyType({f: _spec(f) for f in Family})
"""Every family's spec, in report order (``Family`` order)."""


def measurements(result: FamilyResult) -> list[Measurement]:
    """The values a family's result shows, in a stable order; none without evidence."""
    if result.evidence is None:
        return []
    return REGISTRY[result.family].measure(result.evidence)


def bound_of(policy: Policy | None, result: FamilyResult, m: Measurement) -> int | None:
    """The policy's bound on one measurement, or None when it has none."""
    section = policy.family(result.family) if policy is not None else None
    if section is None or m.bound is None:
        return None
    value: int = getattr(section, m.bound)
    return value
