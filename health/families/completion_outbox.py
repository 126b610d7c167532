"""The ``completion_outbox`` family: every terminal scoring job must have its outbox event.

This module holds the rule itself (:data:`TERMINAL_JOB_WITHOUT_EVENT`) and the full check,
which ``check``, ``status`` and the sidecar's first evaluation run. The sidecar then checks
incrementally (:mod:`health.families.completion_tracker`), with the same rule.
"""

from __future__ import annotations

import asyncpg

from contracts.health import CompletionOutboxEvidence
from contracts.policy import CompletionOutboxPolicy
from health.families.base import FamilySpec, Gauge, Measurement, ProbeContext, age
from health.probing import CLOCK, fetch_probe, unix_ms, without_newest
from health.rules import Verdict, count_over, timestamp_problems, verdict

# The rule, written once: the terminal scoring job `job` (a scoring_job_state row) has no
# event. An event covers the job while pending in `outbox` and, once the relay published
# it, by its delivery receipt. The state list matches the partial index
# scoring_job_state_terminal_updated_idx (migration 0003) and both lookups read the
# `aggregateid` partial indexes (migration 0001). A conjunction: AND it with the rest.
# Its parts are named for the sidecar's incremental check, which writes the two lookups as
# per-row probes (health/families/completion_tracker.py).
TERMINAL_JOB = "job.scoring_state IN ('completed', 'quarantined')"
PENDING_EVENT_OF_JOB = """SELECT 1 FROM outbox AS event
          WHERE event.aggregatetype = 'scoring_job' AND event.aggregateid = job.scoring_job_ref"""
RECEIPT_OF_JOB = """SELECT 1 FROM outbox_receipt AS receipt
          WHERE receipt.aggregatetype = 'scoring_job'
            AND receipt.aggregateid = job.scoring_job_ref"""
TERMINAL_JOB_WITHOUT_EVENT = f"""{TERMINAL_JOB}
      AND NOT EXISTS (
          {PENDING_EVENT_OF_JOB}
      )
      AND NOT EXISTS (
          {RECEIPT_OF_JOB}
      )"""

# The newest terminal job's updated_at when it lies after the clock (else NULL): such a job
# is above the window and would never be counted, so it only guards the classification
# (see without_newest). A range scan of the terminal partial index from the clock up,
# empty when all is well (two index pages). A LATERAL over `clock`.
NEWEST_TERMINAL = f"""
CROSS JOIN LATERAL (
    SELECT {unix_ms("max(job.updated_at)")} AS newest_terminal_updated_at_unix_ms
    FROM scoring_job_state AS job
    WHERE job.scoring_state IN ('completed', 'quarantined')
      AND job.updated_at > clock.now
) AS newest
"""

NEWEST_TERMINAL_FIELD = "newest_terminal_updated_at_unix_ms"

# $1 = grace_ms, $2 = lookback_ms: the window [clock - lookback, clock - grace).
COMPLETION_OUTBOX_PROBE = (
    CLOCK
    + f"""
SELECT clock.now_ms AS observed_at_unix_ms,
       missing.missing_count,
       missing.oldest_missing_updated_at_unix_ms,
       newest.newest_terminal_updated_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS missing_count,
           {unix_ms("min(job.updated_at)")}
               AS oldest_missing_updated_at_unix_ms
    FROM scoring_job_state AS job
    WHERE job.updated_at >= clock.now - $2::bigint::double precision * interval '1 millisecond'
      AND job.updated_at < clock.now - $1::bigint::double precision * interval '1 millisecond'
      AND {TERMINAL_JOB_WITHOUT_EVENT}
) AS missing
{NEWEST_TERMINAL}"""
)


async def probe_completion_outbox(
    conn: asyncpg.Connection, policy: CompletionOutboxPolicy, *, receipt_retention_ms: int | None
) -> CompletionOutboxEvidence:
    """Evidence for the ``completion_outbox`` family: the full check of the look-back window."""
    row = await fetch_probe(conn, COMPLETION_OUTBOX_PROBE, policy.grace_ms, policy.lookback_ms)
    # The SQL aliases are the field names: a drift fails here, loudly.
    return CompletionOutboxEvidence(
        **without_newest(row, NEWEST_TERMINAL_FIELD),
        grace_ms=policy.grace_ms,
        lookback_ms=policy.lookback_ms,
        receipt_retention_ms=receipt_retention_ms,
    )


async def _probe(
    conn: asyncpg.Connection, policy: CompletionOutboxPolicy, context: ProbeContext
) -> CompletionOutboxEvidence:
    retention = context.receipt_retention_ms
    if context.completion is None:  # one-shot: the full check
        return await probe_completion_outbox(conn, policy, receipt_retention_ms=retention)
    # The sidecar: only what changed since its last evaluation.
    return await context.completion.probe(conn, policy, receipt_retention_ms=retention)


def classify_completion_outbox(
    evidence: CompletionOutboxEvidence, policy: CompletionOutboxPolicy
) -> Verdict:
    """Terminal jobs with no outbox event; unknown when receipts are kept shorter than the window."""
    unknown = timestamp_problems(
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
    counts = count_over(
        "missing_count", evidence.missing_count, "max_missing_count", policy.max_missing_count
    )
    return verdict(unknown, counts, [])


def completion_outbox_measurements(evidence: CompletionOutboxEvidence) -> list[Measurement]:
    """What the ``completion_outbox`` family shows."""
    now = evidence.observed_at_unix_ms
    return [
        Measurement(
            "missing_count",
            evidence.missing_count,
            "jobs",
            bound="max_missing_count",
            trend="backlog",
        ),
        Measurement(
            "oldest_missing_age",
            age(now, evidence.oldest_missing_updated_at_unix_ms),
            "ms",
            trend="oldest",
        ),
    ]


SPEC: FamilySpec[CompletionOutboxPolicy, CompletionOutboxEvidence] = FamilySpec(
    policy_type=CompletionOutboxPolicy,
    evidence_type=CompletionOutboxEvidence,
    probe=_probe,
    classify=classify_completion_outbox,
    measurements=completion_outbox_measurements,
    gauges=(
        Gauge(
            "outbox_relay_completion_outbox_missing_events",
            "Terminal scoring jobs past the grace period with no outbox event.",
            "missing_count",
        ),
    ),
)
