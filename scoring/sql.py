"""The scoring writer's and worker's SQL, as named constants. Values are always bound, never
formatted in; the only composition is of the fixed fragments below."""

from __future__ import annotations

from typing import Final

# -- fragments ---------------------------------------------------------------------------


def _unix_ms(timestamp: str) -> str:
    return f"floor(extract(epoch FROM {timestamp}) * 1000)::bigint"


# The database clock in unix ms is always clock_timestamp(), never now(): a caller's
# transaction may have started long before the outcome arrived.
NOW_UNIX_MS: Final = _unix_ms("clock_timestamp()")
UPDATED_AT_UNIX_MS: Final = _unix_ms("updated_at")

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

# -- the writer: lock, transition, event -------------------------------------------------

# The aliases are JobRow's field names: the row becomes a JobRow by name, and a column
# added to one but not the other fails at once.
LOCK_JOB_SQL: Final = f"""
SELECT scoring_state AS state, attempt_count, max_attempts, active_fencing_token,
       active_lease_expires_at_unix_ms AS lease_expires_at_unix_ms, next_attempt_at_unix_ms,
       result_ref, completed_fencing_token, last_failure_code,
       {UPDATED_AT_UNIX_MS} AS updated_at_unix_ms,
       {NOW_UNIX_MS} AS now_unix_ms
FROM scoring_job_state
WHERE scoring_job_ref = $1
FOR UPDATE
"""

DATABASE_CLOCK_SQL: Final = f"SELECT {NOW_UNIX_MS}"

# The WHERE clause repeats the fence and re-reads the clock: the row is locked, so only
# the clock can have moved since the decision, and an expired lease must not complete.
COMPLETE_JOB_SQL: Final = f"""
UPDATE scoring_job_state
SET scoring_state = 'completed',
    result_ref = $3,
    completed_fencing_token = $2,
    {_END_JOB}
WHERE scoring_job_ref = $1
  AND scoring_state = 'leased'
  AND active_fencing_token = $2
  AND active_lease_expires_at_unix_ms >= {NOW_UNIX_MS}
RETURNING {UPDATED_AT_UNIX_MS}
"""

# $4: true when the lease must have expired (the sweeper), false when it must be live.
QUARANTINE_JOB_SQL: Final = f"""
UPDATE scoring_job_state
SET scoring_state = 'quarantined',
    last_failure_code = $3,
    {_END_JOB}
WHERE scoring_job_ref = $1
  AND scoring_state = 'leased'
  AND active_fencing_token = $2
  AND (active_lease_expires_at_unix_ms < {NOW_UNIX_MS}) = $4::boolean
RETURNING {UPDATED_AT_UNIX_MS}
"""

# An event is present when it is pending in outbox or already published (outbox_receipt,
# same id). A receipt keeps no payload, so only its identity columns can be compared.
FIND_EVENT_SQL: Final = """
SELECT false AS published, aggregatetype, aggregateid, type, tenant_ref, schema_version,
       payload #>> '{envelope,payload_digest}' AS payload_digest
FROM outbox
WHERE id = $1
UNION ALL
SELECT true, aggregatetype, aggregateid, type, NULL, NULL, NULL
FROM outbox_receipt
WHERE id = $1
"""

INSERT_EVENT_SQL: Final = """
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant_ref,
                    schema_version, correlation_ref, causation_ref, traceparent, tracestate)
VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11)
ON CONFLICT (id) DO NOTHING
RETURNING id
"""

# Puts a caller-owned transaction into the aborted state, so that after a conflicting
# replay its COMMIT can only roll back: the transition already written in it must never
# commit without its event. Our own transactions simply roll back instead.
ABORT_CALLER_TRANSACTION_SQL: Final = """
DO $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'P0001',
        MESSAGE = 'outbox-relay scoring writer: conflicting outbox replay; '
                  'this transaction must roll back';
END
$$
"""

# -- the worker: enqueue, claim, retry, expire, cancel -----------------------------------

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

# Fenced and clock-checked like COMPLETE_JOB_SQL; the budget test repeats the decision's.
RETRY_JOB_SQL: Final = f"""
UPDATE scoring_job_state
SET scoring_state = 'retry_scheduled',
    last_failure_code = $3,
    next_attempt_at_unix_ms = {NOW_UNIX_MS} + $4::bigint,
    {_RELEASE_LEASE}
WHERE scoring_job_ref = $1
  AND scoring_state = 'leased'
  AND active_fencing_token = $2
  AND attempt_count < max_attempts
  AND active_lease_expires_at_unix_ms >= {NOW_UNIX_MS}
RETURNING next_attempt_at_unix_ms
"""

# Expired leases with budget left go back to retry_scheduled, due now, in this one
# statement; the rest are returned so each is quarantined with its event.
EXPIRE_LEASES_SQL: Final = f"""
WITH clock AS MATERIALIZED (
    SELECT {NOW_UNIX_MS} AS now_unix_ms
),
expired AS (
    SELECT j.scoring_job_ref, j.attempt_count, j.max_attempts, j.active_fencing_token
    FROM scoring_job_state j
    WHERE j.scoring_state = 'leased'
      AND j.active_lease_expires_at_unix_ms < (SELECT now_unix_ms FROM clock)
    ORDER BY j.active_lease_expires_at_unix_ms, j.scoring_job_ref
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
rescheduled AS (
    UPDATE scoring_job_state j
    SET scoring_state = 'retry_scheduled',
        last_failure_code = $2,
        next_attempt_at_unix_ms = clock.now_unix_ms,
        {_RELEASE_LEASE}
    FROM expired, clock
    WHERE j.scoring_job_ref = expired.scoring_job_ref
      AND expired.attempt_count < expired.max_attempts
    RETURNING j.scoring_job_ref
)
SELECT e.scoring_job_ref, e.active_fencing_token,
       e.scoring_job_ref IN (SELECT r.scoring_job_ref FROM rescheduled r) AS rescheduled
FROM expired e
ORDER BY e.scoring_job_ref
"""

CANCEL_JOB_SQL: Final = f"""
UPDATE scoring_job_state
SET scoring_state = 'cancelled',
    {_END_JOB}
WHERE scoring_job_ref = $1
  AND scoring_state IN ('queued', 'leased', 'retry_scheduled')
"""
