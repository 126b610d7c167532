"""Pure classification: ``(evidence, policy) → (classification, reasons)`` and composition.

Rule order follows the scoring service: unknown when the observation time is missing or
any stored timestamp is non-positive or later than it; else stalled when a count is
strictly over its bound; else stalled when an age is strictly over its bound; else
within bounds. Reasons name fields and numbers only, never identities.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts.health import (
    Classification,
    CompletionOutboxEvidence,
    FamilyResult,
    HealthReport,
    OutboxEvidence,
    RelayEvidence,
    ScoringJobsEvidence,
)
from contracts.policy import CompletionOutboxPolicy, OutboxPolicy, RelayPolicy, ScoringJobsPolicy

Verdict = tuple[Classification, tuple[str, ...]]

_SEVERITY = {
    Classification.WITHIN_BOUNDS: 0,
    Classification.UNKNOWN: 1,
    Classification.STALLED: 2,
}


def _timestamp_problems(
    observed_at: int | None, stored: Iterable[tuple[str, int | None]]
) -> list[str]:
    if observed_at is None or observed_at <= 0:
        return ["observation time is missing"]
    problems = []
    for name, value in stored:
        if value is None:
            continue
        if value <= 0:
            problems.append(f"stored {name} is {value}, not a positive time")
        elif value > observed_at:
            problems.append(f"{name} is {value - observed_at} ms later than the observation time")
    return problems


def _count_over(name: str, value: int, bound_name: str, bound: int) -> list[str]:
    return [f"{name} {value} > {bound_name} {bound}"] if value > bound else []


def _age_over(
    name: str, observed_at: int, oldest: int | None, bound_name: str, bound: int
) -> list[str]:
    if oldest is None:
        return []
    age = observed_at - oldest
    return [f"{name} {age} ms > {bound_name} {bound} ms"] if age > bound else []


def _verdict(unknown: list[str], counts: list[str], ages: list[str]) -> Verdict:
    if unknown:
        return Classification.UNKNOWN, tuple(unknown)
    if counts or ages:
        return Classification.STALLED, (*counts, *ages)
    return Classification.WITHIN_BOUNDS, ()


def classify_outbox(evidence: OutboxEvidence, policy: OutboxPolicy) -> Verdict:
    """The relay's backlog: pending and quarantined counts, oldest pending age from write time."""
    unknown = _timestamp_problems(
        evidence.observed_at_unix_ms,
        [("oldest_pending_created_at_unix_ms", evidence.oldest_pending_created_at_unix_ms)],
    )
    if unknown:
        return _verdict(unknown, [], [])
    assert evidence.observed_at_unix_ms is not None  # checked above
    counts = [
        *_count_over(
            "pending_count", evidence.pending_count, "max_pending_count", policy.max_pending_count
        ),
        *_count_over(
            "quarantined_count",
            evidence.quarantined_count,
            "max_quarantined_count",
            policy.max_quarantined_count,
        ),
    ]
    ages = _age_over(
        "oldest pending age",
        evidence.observed_at_unix_ms,
        evidence.oldest_pending_created_at_unix_ms,
        "max_pending_age_ms",
        policy.max_pending_age_ms,
    )
    return _verdict([], counts, ages)


def classify_scoring_jobs(evidence: ScoringJobsEvidence, policy: ScoringJobsPolicy) -> Verdict:
    """The scoring queue, including leases that expired by the database clock (dead workers)."""
    unknown = _timestamp_problems(
        evidence.observed_at_unix_ms,
        [
            ("oldest_active_created_at_unix_ms", evidence.oldest_active_created_at_unix_ms),
            (
                "oldest_expired_lease_expires_at_unix_ms",
                evidence.oldest_expired_lease_expires_at_unix_ms,
            ),
        ],
    )
    if unknown:
        return _verdict(unknown, [], [])
    assert evidence.observed_at_unix_ms is not None  # checked above
    counts = [
        *_count_over(
            "active_count",
            evidence.active_count,
            "max_active_job_count",
            policy.max_active_job_count,
        ),
        *_count_over(
            "quarantined_count",
            evidence.quarantined_count,
            "max_quarantined_job_count",
            policy.max_quarantined_job_count,
        ),
        *_count_over(
            "expired_lease_count",
            evidence.expired_lease_count,
            "max_expired_lease_count",
            policy.max_expired_lease_count,
        ),
    ]
    ages = _age_over(
        "oldest active job age",
        evidence.observed_at_unix_ms,
        evidence.oldest_active_created_at_unix_ms,
        "max_active_job_age_ms",
        policy.max_active_job_age_ms,
    )
    return _verdict([], counts, ages)


def classify_completion_outbox(
    evidence: CompletionOutboxEvidence, policy: CompletionOutboxPolicy
) -> Verdict:
    """Terminal jobs with no outbox event; unknown when receipts are kept shorter than the window."""
    unknown = _timestamp_problems(
        evidence.observed_at_unix_ms,
        [("oldest_missing_updated_at_unix_ms", evidence.oldest_missing_updated_at_unix_ms)],
    )
    # Published events survive only as receipts; once those are pruned a covered job
    # looks uncovered, so a window longer than the retention cannot be judged.
    if evidence.receipt_retention_ms is None:
        unknown.append("receipt retention is not known (set --receipt-retention-ms)")
    elif policy.lookback_ms > evidence.receipt_retention_ms:
        unknown.append(
            f"lookback_ms {policy.lookback_ms} > receipt retention "
            f"{evidence.receipt_retention_ms} ms: published events may have no receipt left"
        )
    counts = _count_over(
        "missing_count", evidence.missing_count, "max_missing_count", policy.max_missing_count
    )
    return _verdict(unknown, counts, [])


def classify_relay(evidence: RelayEvidence, policy: RelayPolicy) -> Verdict:
    """The relay's progress: fresh heartbeat, owned lanes, publishing when work is due."""
    unknown = _timestamp_problems(
        evidence.observed_at_unix_ms,
        [
            ("newest_heartbeat_at_unix_ms", evidence.newest_heartbeat_at_unix_ms),
            ("newest_publish_at_unix_ms", evidence.newest_publish_at_unix_ms),
            ("oldest_ready_created_at_unix_ms", evidence.oldest_ready_created_at_unix_ms),
            (
                "oldest_blocking_transaction_started_at_unix_ms",
                evidence.oldest_blocking_transaction_started_at_unix_ms,
            ),
        ],
    )
    if unknown:
        return _verdict(unknown, [], [])
    now = evidence.observed_at_unix_ms
    assert now is not None  # checked above
    counts = _count_over(
        "unowned_lane_count",
        evidence.unowned_lane_count,
        "max_unowned_lane_count",
        policy.max_unowned_lane_count,
    )
    if evidence.newest_heartbeat_at_unix_ms is None:
        counts.append("no relay instance has recorded a heartbeat")
    ages = _age_over(
        "newest heartbeat age",
        now,
        evidence.newest_heartbeat_at_unix_ms,
        "max_heartbeat_age_ms",
        policy.max_heartbeat_age_ms,
    )
    if evidence.oldest_ready_created_at_unix_ms is not None:
        # Work has waited since the later of its write and the last publish.
        waiting_since = max(
            evidence.oldest_ready_created_at_unix_ms, evidence.newest_publish_at_unix_ms or 0
        )
        stall = now - waiting_since
        if stall > policy.max_publish_stall_ms:
            ages.append(
                f"ready events unpublished for {stall} ms > max_publish_stall_ms "
                f"{policy.max_publish_stall_ms} ms"
            )
    ages += _age_over(
        "oldest blocking transaction age",
        now,
        evidence.oldest_blocking_transaction_started_at_unix_ms,
        "max_blocking_transaction_age_ms",
        policy.max_blocking_transaction_age_ms,
    )
    return _verdict([], counts, ages)


def compose(classifications: Iterable[Classification]) -> Classification:
    """Worst wins: stalled > unknown > within_bounds; nothing to compose is within bounds."""
    return max(classifications, key=_SEVERITY.__getitem__, default=Classification.WITHIN_BOUNDS)


def build_report(results: Sequence[FamilyResult], evaluated_at_unix_ms: int) -> HealthReport:
    """Compose family results into a report (overall and readiness-gating classifications)."""
    return HealthReport(
        classification=compose(r.classification for r in results),
        readiness=compose(r.classification for r in results if r.gates_readiness),
        evaluated_at_unix_ms=evaluated_at_unix_ms,
        families=tuple(results),
    )


def mark_stale(report: HealthReport, age_ms: int, max_age_ms: int) -> HealthReport:
    """The report as served when its evidence is older than ``max_age_ms``: every family unknown."""
    if age_ms <= max_age_ms:
        return report
    reason = f"evidence is {age_ms} ms old > max_evidence_age_ms {max_age_ms} ms"
    results = [
        FamilyResult(
            family=r.family,
            classification=Classification.UNKNOWN,
            reasons=(reason,),
            gates_readiness=r.gates_readiness,
            evidence=r.evidence,
        )
        for r in report.families
    ]
    return build_report(results, report.evaluated_at_unix_ms)
