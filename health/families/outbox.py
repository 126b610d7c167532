"""The ``outbox`` family: the relay's backlog (the outbox table holds only unpublished rows)."""

from __future__ import annotations

import asyncpg

from contracts.health import OutboxEvidence
from contracts.policy import OutboxPolicy
from health.families.base import FamilySpec, Gauge, Measurement, age
from health.probing import CLOCK, fetch_probe, unix_ms, without_newest
from health.rules import Verdict, age_over, count_over, timestamp_problems, verdict

# Pending means not quarantined; each side reads its partial index (migration 0001).
# The newest pending time only guards against times in the future (see without_newest).
# The pending rows are read in write-time order: with sorts ruled out in the sidecar's
# sessions the one plan for that is a plain scan of outbox_pending_created_idx, whatever
# the minute's statistics say. It marks the entries of the rows the relay deleted since as
# dead (no insert touches those pages), so each deleted row costs one probe, not every
# probe until vacuum; a bitmap scan marks nothing (docs/health.md, "What the probes read").
OUTBOX_PROBE = (
    CLOCK
    + f"""
SELECT clock.now_ms AS observed_at_unix_ms,
       pending.pending_count,
       pending.oldest_pending_created_at_unix_ms,
       pending.newest_pending_created_at_unix_ms,
       pending.retrying_count,
       quarantined.quarantined_count
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS pending_count,
           {unix_ms("min(created_at)")}
               AS oldest_pending_created_at_unix_ms,
           {unix_ms("max(created_at)")}
               AS newest_pending_created_at_unix_ms,
           count(*) FILTER (WHERE last_error_class IS NOT NULL) AS retrying_count
    FROM (
        SELECT created_at, last_error_class
        FROM outbox
        WHERE quarantined_at IS NULL
        ORDER BY created_at
    ) AS pending_row
) AS pending
CROSS JOIN LATERAL (
    SELECT count(*) AS quarantined_count FROM outbox WHERE quarantined_at IS NOT NULL
) AS quarantined
"""
)


async def probe_outbox(conn: asyncpg.Connection) -> OutboxEvidence:
    """Evidence for the ``outbox`` family."""
    # The SQL aliases are the field names: a drift fails here, loudly.
    row = await fetch_probe(conn, OUTBOX_PROBE)
    return OutboxEvidence(
        **without_newest(
            row, "newest_pending_created_at_unix_ms", oldest="oldest_pending_created_at_unix_ms"
        )
    )


def classify_outbox(evidence: OutboxEvidence, policy: OutboxPolicy) -> Verdict:
    """The relay's backlog: pending and quarantined counts, oldest pending age from write time."""
    unknown = timestamp_problems(
        evidence.observed_at_unix_ms,
        [("oldest_pending_created_at_unix_ms", evidence.oldest_pending_created_at_unix_ms)],
    )
    if unknown:
        return verdict(unknown, [], [])
    assert evidence.observed_at_unix_ms is not None  # checked above
    counts = [
        *count_over(
            "pending_count", evidence.pending_count, "max_pending_count", policy.max_pending_count
        ),
        *count_over(
            "quarantined_count",
            evidence.quarantined_count,
            "max_quarantined_count",
            policy.max_quarantined_count,
        ),
    ]
    ages = age_over(
        "oldest pending age",
        evidence.observed_at_unix_ms,
        evidence.oldest_pending_created_at_unix_ms,
        "max_pending_age_ms",
        policy.max_pending_age_ms,
    )
    return verdict([], counts, ages)


def outbox_measurements(evidence: OutboxEvidence) -> list[Measurement]:
    """What the ``outbox`` family shows."""
    now = evidence.observed_at_unix_ms
    return [
        Measurement(
            "pending_count",
            evidence.pending_count,
            "events",
            bound="max_pending_count",
            trend="backlog",
        ),
        Measurement(
            "oldest_pending_age",
            age(now, evidence.oldest_pending_created_at_unix_ms),
            "ms",
            bound="max_pending_age_ms",
            trend="oldest",
        ),
        Measurement("retrying_count", evidence.retrying_count, "events"),
        Measurement(
            "quarantined_count",
            evidence.quarantined_count,
            "events",
            bound="max_quarantined_count",
        ),
    ]


SPEC: FamilySpec[OutboxPolicy, OutboxEvidence] = FamilySpec(
    policy_type=OutboxPolicy,
    evidence_type=OutboxEvidence,
    probe=lambda conn, _policy, _context: probe_outbox(conn),
    classify=classify_outbox,
    measurements=outbox_measurements,
    gauges=(
        Gauge(
            "outbox_relay_outbox_pending_events",
            "Outbox rows not yet published (not quarantined).",
            "pending_count",
        ),
        Gauge(
            "outbox_relay_outbox_oldest_pending_age_seconds",
            "Age of the oldest pending outbox row, from its write time.",
            "oldest_pending_age",
            seconds=True,
        ),
        Gauge(
            "outbox_relay_outbox_retrying_events",
            "Pending outbox rows whose last attempt failed.",
            "retrying_count",
        ),
        Gauge(
            "outbox_relay_outbox_quarantined_events",
            "Quarantined outbox rows.",
            "quarantined_count",
        ),
    ),
)
