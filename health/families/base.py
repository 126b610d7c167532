"""What every health family provides, as one typed value: :class:`FamilySpec`.

A spec ties a policy section type ``P`` to an evidence type ``E`` and carries the family's
probe (SQL → ``E``), its pure classification (``E`` and ``P`` → verdict), what it shows
(``E`` → measurements, for ``/health``, the status table and page) and which of those
measurements are Prometheus gauges. Every field is required, so a spec that forgets one of
them, or whose functions disagree on ``P`` or ``E``, fails the type check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

import asyncpg

from contracts.health import CompletionOutboxEvidence, Evidence
from contracts.policy import CompletionOutboxPolicy, FamilyPolicy
from health.rules import Verdict

P = TypeVar("P", bound=FamilyPolicy)
E = TypeVar("E", bound=Evidence)


@dataclass(frozen=True)
class Measurement:
    """One observed value with its unit; ages are derived from the evidence's own clock."""

    name: str
    value: int | None
    unit: str
    bound: str | None = None
    """The field of the family's policy section this value is held to, if any."""
    trend: Literal["backlog", "oldest"] | None = None
    """Kept in the status page's history: the family's backlog count or its oldest age."""


def age(observed_at: int | None, oldest: int | None) -> int | None:
    """Milliseconds from ``oldest`` to the observation, or None when either is unknown."""
    if observed_at is None or oldest is None:
        return None
    return observed_at - oldest


@dataclass(frozen=True)
class Gauge:
    """One Prometheus gauge fed by one measurement of a family."""

    metric: str
    help: str
    measurement: str
    """A :attr:`Measurement.name` of the same family."""
    seconds: bool = False
    """The measurement is in ms and the gauge in seconds."""


class CompletionProbe(Protocol):
    """What a probe asks of the sidecar's incremental completion check
    (health/families/completion_tracker.py, ``CompletionTracker``). Named here, not
    imported: the tracker builds on the completion family, which builds on this module."""

    async def probe(
        self,
        conn: asyncpg.Connection,
        policy: CompletionOutboxPolicy,
        *,
        receipt_retention_ms: int | None,
    ) -> CompletionOutboxEvidence: ...


@dataclass(frozen=True)
class ProbeContext:
    """What a probe may need beyond its own policy section."""

    receipt_retention_ms: int | None
    """How long the relay keeps delivery receipts; None when nobody said."""
    completion: CompletionProbe | None = None
    """The sidecar's incremental completion check; None for one-shot evaluations."""


@dataclass(frozen=True, kw_only=True)
class FamilySpec(Generic[P, E]):
    """One family: probe, classify, measurements and gauges, typed by its policy and evidence."""

    policy_type: type[P]
    evidence_type: type[E]
    probe: Callable[[asyncpg.Connection, P, ProbeContext], Awaitable[E]]
    classify: Callable[[E, P], Verdict]
    measurements: Callable[[E], list[Measurement]]
    gauges: tuple[Gauge, ...]

    async def evaluate(
        self, conn: asyncpg.Connection, section: FamilyPolicy, context: ProbeContext
    ) -> tuple[E, Verdict]:
        """Probe and classify; ``section`` must be this family's policy section."""
        if not isinstance(section, self.policy_type):
            raise AssertionError(f"{type(section).__name__} is not {self.policy_type.__name__}")
        evidence = await self.probe(conn, section, context)
        return evidence, self.classify(evidence, section)

    def measure(self, evidence: Evidence) -> list[Measurement]:
        """The values this family shows, in a stable order; ``evidence`` must be its own."""
        if not isinstance(evidence, self.evidence_type):
            raise AssertionError(f"{type(evidence).__name__} is not {self.evidence_type.__name__}")
        return self.measurements(evidence)
