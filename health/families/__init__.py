"""The health families: one module each, and :data:`REGISTRY` mapping every ``Family`` to it.

Evaluation, rendering, metrics and policy loading loop over :data:`REGISTRY`; none of them
names a family. To add a family:

1. ``contracts/policy.py``: a ``Family`` member, its ``XPolicy`` section (added to the
   ``FamilyPolicy`` union) and its ``Policy`` field (plus the ``case`` in
   ``Policy.family``).
2. ``contracts/health.py``: its ``XEvidence`` (tag = the family's name), added to the
   ``Evidence`` union.
3. ``health/families/x.py``: its SQL, probe, classify, measurements and gauges, as one
   ``SPEC: FamilySpec[XPolicy, XEvidence]``.
4. The ``case`` for it in :func:`_spec` below.

Then ``docs/health.md``, ``docs/policy.example.toml`` and the test policies. The type
checker holds the rest together: a ``Family`` member without a ``case`` here or in
``Policy.family`` fails ``assert_never``; a section or evidence outside its union, or a
spec missing its probe, classify, measurements or gauges, fails the ``FamilySpec`` type.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, assert_never

from contracts.policy import Family
from health.families import completion_outbox, outbox, relay, scoring_jobs
from health.families.base import FamilySpec

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
