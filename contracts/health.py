"""Health evidence, classifications and reports.

Evidence is aggregates only: counts, oldest timestamps in unix milliseconds and the
database clock they were read against. No identity of any job, event, worker, lease,
request or tenant ever appears here.
"""

from __future__ import annotations

import enum

import msgspec

from contracts.policy import Family


class Classification(enum.StrEnum):
    """What a family's evidence says, per the scoring service's semantics."""

    WITHIN_BOUNDS = "within_bounds"
    STALLED = "stalled"
    UNKNOWN = "unknown"


class OutboxEvidence(msgspec.Struct, frozen=True, kw_only=True, tag="outbox", tag_field="kind"):
    """The relay's backlog: the outbox table holds only rows not yet published."""

    observed_at_unix_ms: int | None
    pending_count: int
    oldest_pending_created_at_unix_ms: int | None
    retrying_count: int
    """Pending rows whose last attempt failed."""
    quarantined_count: int


class ScoringJobsEvidence(
    msgspec.Struct, frozen=True, kw_only=True, tag="scoring_jobs", tag_field="kind"
):
    """The scoring-job queue; active = queued + leased + retry_scheduled."""

    observed_at_unix_ms: int | None
    active_count: int
    oldest_active_created_at_unix_ms: int | None
    quarantined_count: int
    expired_lease_count: int
    oldest_expired_lease_expires_at_unix_ms: int | None


class CompletionOutboxEvidence(
    msgspec.Struct, frozen=True, kw_only=True, tag="completion_outbox", tag_field="kind"
):
    """Terminal jobs past the grace period, within the look-back window, with no event."""

    observed_at_unix_ms: int | None
    missing_count: int
    oldest_missing_updated_at_unix_ms: int | None
    grace_ms: int
    lookback_ms: int
    receipt_retention_ms: int | None
    """How long the relay keeps delivery receipts; None when nobody said."""


class RelayEvidence(msgspec.Struct, frozen=True, kw_only=True, tag="relay", tag_field="kind"):
    """The relay's progress as recorded in its heartbeat and lane tables."""

    observed_at_unix_ms: int | None
    instance_count: int
    live_instance_count: int
    newest_heartbeat_at_unix_ms: int | None
    newest_publish_at_unix_ms: int | None
    lane_count: int
    unowned_lane_count: int
    oldest_ready_created_at_unix_ms: int | None
    """Oldest pending row that is due now (not backing off, not quarantined)."""
    blocking_transaction_count: int
    oldest_blocking_transaction_started_at_unix_ms: int | None
    """Start of the oldest other open transaction holding a lock on ``outbox``."""


Evidence = OutboxEvidence | ScoringJobsEvidence | CompletionOutboxEvidence | RelayEvidence


class FamilyResult(msgspec.Struct, frozen=True, kw_only=True):
    """One family's classification, the reasons that fired and the evidence behind them."""

    family: Family
    classification: Classification
    reasons: tuple[str, ...]
    gates_readiness: bool
    evidence: Evidence | None
    """None when the probe failed; the reasons then say why, without driver text."""


class HealthReport(msgspec.Struct, frozen=True, kw_only=True):
    """One evaluation of every enabled family."""

    classification: Classification
    """Worst over every enabled family."""
    readiness: Classification
    """Worst over the families that gate readiness."""
    evaluated_at_unix_ms: int
    """Wall clock of the evaluator when the evaluation finished."""
    families: tuple[FamilyResult, ...]
