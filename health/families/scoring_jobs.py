"""The ``scoring_jobs`` family: the scoring-job queue, including leases of dead workers."""

from __future__ import annotations

import asyncpg

from contracts.health import ScoringJobsEvidence
from contracts.policy import ScoringJobsPolicy
from health.families.base import FamilySpec, Gauge, Measurement, age
from health.probing import CLOCK, fetch_probe, unix_ms, without_newest
from health.rules import Verdict, age_over, count_over, timestamp_problems, verdict

# Active = queued + leased + retry_scheduled; each state set reads its partial index
# (migration 0003), so terminal history costs nothing. A lease is expired by the database
# clock, never the sidecar's. The newest active time only guards against times in the
# future (see without_newest); an expired lease is in the past by definition.
SCORING_JOBS_PROBE = (
    CLOCK
    + f"""
SELECT clock.now_ms AS observed_at_unix_ms,
       active.active_count,
       active.oldest_active_created_at_unix_ms,
       active.newest_active_created_at_unix_ms,
       quarantined.quarantined_count,
       expired.expired_lease_count,
       expired.oldest_expired_lease_expires_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS active_count,
           {unix_ms("min(created_at)")}
               AS oldest_active_created_at_unix_ms,
           {unix_ms("max(created_at)")}
               AS newest_active_created_at_unix_ms
    FROM scoring_job_state
    WHERE scoring_state IN ('queued', 'leased', 'retry_scheduled')
) AS active
CROSS JOIN LATERAL (
    SELECT count(*) AS quarantined_count
    FROM scoring_job_state
    WHERE scoring_state = 'quarantined'
) AS quarantined
CROSS JOIN LATERAL (
    SELECT count(*) AS expired_lease_count,
           min(active_lease_expires_at_unix_ms) AS oldest_expired_lease_expires_at_unix_ms
    FROM scoring_job_state
    WHERE scoring_state = 'leased' AND active_lease_expires_at_unix_ms < clock.now_ms
) AS expired
"""
)


async def probe_scoring_jobs(conn: asyncpg.Connection) -> ScoringJobsEvidence:
    """Evidence for the ``scoring_jobs`` family."""
    # The SQL aliases are the field names: a drift fails here, loudly.
    row = await fetch_probe(conn, SCORING_JOBS_PROBE)
    return ScoringJobsEvidence(
        **without_newest(
            row, "newest_active_created_at_unix_ms", oldest="oldest_active_created_at_unix_ms"
        )
    )


def classify_scoring_jobs(evidence: ScoringJobsEvidence, policy: ScoringJobsPolicy) -> Verdict:
    """The scoring queue, including leases that expired by the database clock (dead workers)."""
    unknown = timestamp_problems(
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
        return verdict(unknown, [], [])
    assert evidence.observed_at_unix_ms is not None  # checked above
    counts = [
        *count_over(
            "active_count",
            evidence.active_count,
            "max_active_job_count",
            policy.max_active_job_count,
        ),
        *count_over(
            "quarantined_count",
            evidence.quarantined_count,
            "max_quarantined_job_count",
            policy.max_quarantined_job_count,
        ),
        *count_over(
            "expired_lease_count",
            evidence.expired_lease_count,
            "max_expired_lease_count",
            policy.max_expired_lease_count,
        ),
    ]
    ages = age_over(
        "oldest active job age",
        evidence.observed_at_unix_ms,
        evidence.oldest_active_created_at_unix_ms,
        "max_active_job_age_ms",
        policy.max_active_job_age_ms,
    )
    return verdict([], counts, ages)


def scoring_jobs_measurements(evidence: ScoringJobsEvidence) -> list[Measurement]:
    """What the ``scoring_jobs`` family shows."""
    now = evidence.observed_at_unix_ms
    return [
        Measurement(
            "active_count",
            evidence.active_count,
            "jobs",
            bound="max_active_job_count",
            trend="backlog",
        ),
        Measurement(
            "oldest_active_age",
            age(now, evidence.oldest_active_created_at_unix_ms),
            "ms",
            bound="max_active_job_age_ms",
            trend="oldest",
        ),
        Measurement(
            "quarantined_count",
            evidence.quarantined_count,
            "jobs",
            bound="max_quarantined_job_count",
        ),
        Measurement(
            "expired_lease_count",
            evidence.expired_lease_count,
            "leases",
            bound="max_expired_lease_count",
        ),
        Measurement(
            "oldest_expired_lease_age",
            age(now, evidence.oldest_expired_lease_expires_at_unix_ms),
            "ms",
        ),
    ]


SPEC: FamilySpec[ScoringJobsPolicy, ScoringJobsEvidence] = FamilySpec(
    policy_type=ScoringJobsPolicy,
    evidence_type=ScoringJobsEvidence,
    probe=lambda conn, _policy, _context: probe_scoring_jobs(conn),
    classify=classify_scoring_jobs,
    measurements=scoring_jobs_measurements,
    gauges=(
        Gauge(
            "outbox_relay_scoring_jobs_active",
            "Scoring jobs queued, leased or retry_scheduled.",
            "active_count",
        ),
        Gauge(
            "outbox_relay_scoring_jobs_oldest_active_age_seconds",
            "Age of the oldest active scoring job, from its created_at.",
            "oldest_active_age",
            seconds=True,
        ),
        Gauge(
            "outbox_relay_scoring_jobs_quarantined",
            "Quarantined scoring jobs.",
            "quarantined_count",
        ),
        Gauge(
            "outbox_relay_scoring_jobs_expired_leases",
            "Leased scoring jobs whose lease expired by the database clock.",
            "expired_lease_count",
        ),
        Gauge(
            "outbox_relay_scoring_jobs_oldest_expired_lease_age_seconds",
            "Time since the oldest expired lease expired.",
            "oldest_expired_lease_age",
            seconds=True,
        ),
    ),
)
