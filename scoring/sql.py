"""The scoring writer's and worker's SQL, as named constants. Values are always bound, never
formatted in; the only composition is of the fixed fragments below."""

from __future__ import annotations

from typing import Final

# -- fragments ---------------------------------------------------------------------------


def _unix_ms(timestamp: str) -> str:
    return f"floor(extract(epoch FROM {timestamp}) * 1000::numeric)::bigint"


# The database clock in unix ms is always clock_timestamp(), never now(): a caller's
# transaction may have started long before the outcome arrived.
NOW_UNIX_MS: Final = _unix_ms("clock_timestamp()")

# Every transition out of 'leased' drops the lease as a whole: the table's CHECK wants the
# four active_* columns set exactly when the job is leased.
_RELEASE_LEASE: Final = """active_worker_ref = NULL,
    active_lease_ref = NULL,
    active_fencing_token = NULL,
    active_lease_expires_at_unix_ms = NULL,
    updated_at = clock_timestamp()"""

# A job that ends (completed, quarantined, cancelled) keeps no lease and no retry time.
_END_JOB: Final = f"""next_attempt_at_unix_ms = NULL,
    {_RELEASE_LEASE}"""

# -- the writer: the SQL functions of migration 0012 ------------------------------------
# One call each: the functions decide, write, and return rows of outbox_relay_outcome
# (migrations/0012_scoring_functions.sql; docs/writer.md, "From any language"). Named
# arguments, so the call does not depend on the order of the functions' parameters.

_EVENT_ARGUMENTS: Final = """source => $5, tenant_ref => $6, correlation_ref => $7,
    schema_version => $8, causation_ref => $9, event_type => $10, traceparent => $11,
    tracestate => $12, event_id => $13, max_event_bytes => $14"""

COMPLETE_JOB_SQL: Final = f"""
SELECT * FROM outbox_relay_complete_job(
    job_ref => $1, fencing_token => $2, result_ref => $3, payload => $4::jsonb,
    {_EVENT_ARGUMENTS})
"""

FAIL_JOB_PERMANENTLY_SQL: Final = f"""
SELECT * FROM outbox_relay_fail_job_permanently(
    job_ref => $1, fencing_token => $2, cause_code => $3, detail => $4::jsonb,
    {_EVENT_ARGUMENTS})
"""

FAIL_RETRYABLE_SQL: Final = f"""
SELECT * FROM outbox_relay_fail_retryable(
    job_ref => $1, fencing_token => $2, cause_code => $3, detail => $4::jsonb,
    {_EVENT_ARGUMENTS}, retry_delay_ms => $15)
"""

# $2..$10 NULL: no event details, so a spent job comes back as needs_event_details.
EXPIRE_LEASES_SQL: Final = """
SELECT * FROM outbox_relay_expire_leases(
    "limit" => $1, source => $2, tenant_ref => $3, correlation_ref => $4,
    schema_version => $5, causation_ref => $6, event_type => $7, traceparent => $8,
    tracestate => $9, max_event_bytes => $10, job_refs => $11)
"""

# -- the worker: enqueue, claim, cancel (no event: plain statements) ---------------------

ENQUEUE_JOB_SQL: Final = """
INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state, max_attempts)
VALUES ($1, $2, 'queued', $3)
ON CONFLICT (scoring_job_ref) DO NOTHING
RETURNING true
"""

# The clock is read once (a materialised CTE) so the due test and the expiry agree.
# SKIP LOCKED lets concurrent workers pass over each other's candidates; the state
# filter matches the claimable partial index.
CLAIM_NEXT_DUE_SQL: Final = f"""
WITH clock AS MATERIALIZED (
    SELECT {NOW_UNIX_MS} AS now_unix_ms
),
next_job AS (
    SELECT j.scoring_job_ref
    FROM scoring_job_state j
    WHERE j.scoring_state IN ('queued', 'retry_scheduled')
      AND (j.scoring_state = 'queued'
           OR j.next_attempt_at_unix_ms <= (SELECT now_unix_ms FROM clock))
    ORDER BY j.created_at, j.scoring_job_ref
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE scoring_job_state j
SET scoring_state = 'leased',
    attempt_count = j.attempt_count + 1,
    active_worker_ref = $1,
    active_lease_ref = $2,
    active_fencing_token = j.attempt_count + 1,
    active_lease_expires_at_unix_ms = clock.now_unix_ms + $3::bigint,
    next_attempt_at_unix_ms = NULL,
    updated_at = clock_timestamp()
FROM next_job, clock
WHERE j.scoring_job_ref = next_job.scoring_job_ref
RETURNING j.scoring_job_ref, j.scoring_request_ref, j.attempt_count, j.max_attempts,
          j.active_lease_expires_at_unix_ms
"""

# A job's state, locked for the rest of the transaction (cancel decides on it).
LOCK_JOB_STATE_SQL: Final = """
SELECT scoring_state FROM scoring_job_state WHERE scoring_job_ref = $1 FOR UPDATE
"""

CANCEL_JOB_SQL: Final = f"""
UPDATE scoring_job_state
SET scoring_state = 'cancelled',
    {_END_JOB}
WHERE scoring_job_ref = $1
  AND scoring_state IN ('queued', 'leased', 'retry_scheduled')
"""
