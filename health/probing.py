"""Probes: one aggregate SQL statement per family, returning counts and oldest timestamps.

Each statement reads the database clock once (``statement_timestamp()``, so a probe run
inside a caller's long transaction is still current) and compares every stored time with
it. Times are unix milliseconds, rounded (not truncated) as the scoring service does.
Every table predicate matches a partial index, so cost follows the active sets and the
look-back window, never the terminal history.
"""

from __future__ import annotations

import asyncpg

from contracts.health import (
    CompletionOutboxEvidence,
    OutboxEvidence,
    RelayEvidence,
    ScoringJobsEvidence,
)
from contracts.policy import CompletionOutboxPolicy, RelayPolicy
from health.errors import ProbeFailure
from pgconnect import unavailable_cause

# `clock` is evaluated once per statement; every comparison below reads it.
_CLOCK = """
WITH clock AS (
    SELECT statement_timestamp() AS now,
           round(extract(epoch FROM statement_timestamp()) * 1000)::bigint AS now_ms
)
"""

OUTBOX_PROBE = (
    _CLOCK
    + """
SELECT clock.now_ms AS observed_at_unix_ms,
       pending.pending_count,
       pending.oldest_pending_created_at_unix_ms,
       pending.retrying_count,
       quarantined.quarantined_count
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS pending_count,
           round(extract(epoch FROM min(created_at)) * 1000)::bigint
               AS oldest_pending_created_at_unix_ms,
           count(*) FILTER (WHERE last_error_class IS NOT NULL) AS retrying_count
    FROM outbox
    WHERE quarantined_at IS NULL
) AS pending
CROSS JOIN LATERAL (
    SELECT count(*) AS quarantined_count FROM outbox WHERE quarantined_at IS NOT NULL
) AS quarantined
"""
)

SCORING_JOBS_PROBE = (
    _CLOCK
    + """
SELECT clock.now_ms AS observed_at_unix_ms,
       active.active_count,
       active.oldest_active_created_at_unix_ms,
       quarantined.quarantined_count,
       expired.expired_lease_count,
       expired.oldest_expired_lease_expires_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS active_count,
           round(extract(epoch FROM min(created_at)) * 1000)::bigint
               AS oldest_active_created_at_unix_ms
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

# $1 = grace_ms, $2 = lookback_ms. A job is covered by its event pending in `outbox` or,
# once published, by its delivery receipt.
COMPLETION_OUTBOX_PROBE = (
    _CLOCK
    + """
SELECT clock.now_ms AS observed_at_unix_ms,
       missing.missing_count,
       missing.oldest_missing_updated_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS missing_count,
           round(extract(epoch FROM min(job.updated_at)) * 1000)::bigint
               AS oldest_missing_updated_at_unix_ms
    FROM scoring_job_state AS job
    WHERE job.scoring_state IN ('completed', 'quarantined')
      AND job.updated_at >= clock.now - $2::bigint * interval '1 millisecond'
      AND job.updated_at < clock.now - $1::bigint * interval '1 millisecond'
      AND NOT EXISTS (
          SELECT 1 FROM outbox AS event
          WHERE event.aggregatetype = 'scoring_job' AND event.aggregateid = job.scoring_job_ref
      )
      AND NOT EXISTS (
          SELECT 1 FROM outbox_receipt AS receipt
          WHERE receipt.aggregatetype = 'scoring_job'
            AND receipt.aggregateid = job.scoring_job_ref
      )
) AS missing
"""
)

# $1 = max_heartbeat_age_ms (what counts as a live instance). Lock holders: pid and
# transaction start only; the query text of other sessions is never read.
RELAY_PROBE = (
    _CLOCK
    + """
SELECT clock.now_ms AS observed_at_unix_ms,
       instances.instance_count,
       instances.live_instance_count,
       instances.newest_heartbeat_at_unix_ms,
       instances.newest_publish_at_unix_ms,
       lanes.lane_count,
       lanes.unowned_lane_count,
       ready.oldest_ready_created_at_unix_ms,
       blocking.blocking_transaction_count,
       blocking.oldest_blocking_transaction_started_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS instance_count,
           count(*) FILTER (
               WHERE heartbeat_at >= clock.now - $1::bigint * interval '1 millisecond'
           ) AS live_instance_count,
           round(extract(epoch FROM max(heartbeat_at)) * 1000)::bigint
               AS newest_heartbeat_at_unix_ms,
           round(extract(epoch FROM max(last_publish_at)) * 1000)::bigint
               AS newest_publish_at_unix_ms
    FROM relay_instance
) AS instances
CROSS JOIN LATERAL (
    SELECT count(*) AS lane_count,
           count(*) FILTER (
               WHERE lease_expires_at IS NULL OR lease_expires_at < clock.now
           ) AS unowned_lane_count
    FROM relay_lane
) AS lanes
CROSS JOIN LATERAL (
    SELECT round(extract(epoch FROM min(created_at)) * 1000)::bigint
               AS oldest_ready_created_at_unix_ms
    FROM outbox
    WHERE quarantined_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= clock.now)
) AS ready
CROSS JOIN LATERAL (
    SELECT count(DISTINCT activity.pid) AS blocking_transaction_count,
           round(extract(epoch FROM min(activity.xact_start)) * 1000)::bigint
               AS oldest_blocking_transaction_started_at_unix_ms
    FROM pg_catalog.pg_locks AS lock
    JOIN pg_catalog.pg_stat_activity AS activity ON activity.pid = lock.pid
    WHERE lock.locktype = 'relation'
      AND lock.granted
      AND lock.relation = 'outbox'::regclass
      AND lock.database = (SELECT oid FROM pg_catalog.pg_database
                           WHERE datname = current_database())
      AND activity.pid <> pg_backend_pid()
      AND activity.xact_start IS NOT NULL
) AS blocking
"""
)


def probe_failure(exc: BaseException) -> ProbeFailure:
    """Map a driver error to a :class:`ProbeFailure` whose reason carries no driver text."""
    if isinstance(exc, ProbeFailure):
        return exc
    if isinstance(exc, asyncpg.UndefinedTableError):
        return ProbeFailure("a table the probe reads is missing (42P01)")
    if isinstance(exc, asyncpg.UndefinedColumnError):
        return ProbeFailure("a column the probe reads is missing (42703)")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return ProbeFailure("permission denied on a table the probe reads (42501)")
    if isinstance(exc, asyncpg.QueryCanceledError | TimeoutError):
        return ProbeFailure("probe timed out")
    if isinstance(exc, asyncpg.PostgresError):
        return ProbeFailure(f"database refused the probe ({exc.sqlstate})")
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        return ProbeFailure("database connection failed")
    if isinstance(exc, ValueError):  # asyncpg's DSN parser
        return ProbeFailure("database URL could not be parsed")
    return ProbeFailure(f"database unavailable: {unavailable_cause(exc)}")


_SAVEPOINT = "SAVEPOINT outbox_relay_health_probe"
_RELEASE = "RELEASE SAVEPOINT outbox_relay_health_probe"
_ROLLBACK = "ROLLBACK TO SAVEPOINT outbox_relay_health_probe"


async def _fetch_in_savepoint(
    conn: asyncpg.Connection, query: str, *args: object
) -> asyncpg.Record | None:
    # Plain SQL rather than conn.transaction(): the caller may have begun its
    # transaction with BEGIN, which asyncpg's nested transactions refuse.
    await conn.execute(_SAVEPOINT)
    try:
        row: asyncpg.Record | None = await conn.fetchrow(query, *args)
    except asyncpg.PostgresError:
        await conn.execute(_ROLLBACK)
        await conn.execute(_RELEASE)
        raise
    await conn.execute(_RELEASE)
    return row


async def fetch_probe(conn: asyncpg.Connection, query: str, *args: object) -> asyncpg.Record:
    """The one row of a probe statement; driver errors become :class:`ProbeFailure`."""
    try:
        # Inside a caller's transaction a failed statement would poison it; a savepoint
        # keeps the caller's transaction usable and the other probes running.
        if conn.is_in_transaction():
            row = await _fetch_in_savepoint(conn, query, *args)
        else:
            row = await conn.fetchrow(query, *args)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
        raise probe_failure(exc) from exc
    if row is None:  # an aggregate over `clock` always yields one row
        raise ProbeFailure("probe returned no row")
    return row


async def fetch_probe_rows(
    conn: asyncpg.Connection, query: str, *args: object
) -> list[asyncpg.Record]:
    """Every row of a statement run outside a transaction; errors become :class:`ProbeFailure`."""
    try:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args)
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
        raise probe_failure(exc) from exc
    return rows


async def probe_outbox(conn: asyncpg.Connection) -> OutboxEvidence:
    """Evidence for the ``outbox`` family."""
    row = await fetch_probe(conn, OUTBOX_PROBE)
    return OutboxEvidence(
        observed_at_unix_ms=row["observed_at_unix_ms"],
        pending_count=row["pending_count"],
        oldest_pending_created_at_unix_ms=row["oldest_pending_created_at_unix_ms"],
        retrying_count=row["retrying_count"],
        quarantined_count=row["quarantined_count"],
    )


async def probe_scoring_jobs(conn: asyncpg.Connection) -> ScoringJobsEvidence:
    """Evidence for the ``scoring_jobs`` family."""
    row = await fetch_probe(conn, SCORING_JOBS_PROBE)
    return ScoringJobsEvidence(
        observed_at_unix_ms=row["observed_at_unix_ms"],
        active_count=row["active_count"],
        oldest_active_created_at_unix_ms=row["oldest_active_created_at_unix_ms"],
        quarantined_count=row["quarantined_count"],
        expired_lease_count=row["expired_lease_count"],
        oldest_expired_lease_expires_at_unix_ms=row["oldest_expired_lease_expires_at_unix_ms"],
    )


async def probe_completion_outbox(
    conn: asyncpg.Connection, policy: CompletionOutboxPolicy, *, receipt_retention_ms: int | None
) -> CompletionOutboxEvidence:
    """Evidence for the ``completion_outbox`` family."""
    row = await fetch_probe(conn, COMPLETION_OUTBOX_PROBE, policy.grace_ms, policy.lookback_ms)
    return CompletionOutboxEvidence(
        observed_at_unix_ms=row["observed_at_unix_ms"],
        missing_count=row["missing_count"],
        oldest_missing_updated_at_unix_ms=row["oldest_missing_updated_at_unix_ms"],
        grace_ms=policy.grace_ms,
        lookback_ms=policy.lookback_ms,
        receipt_retention_ms=receipt_retention_ms,
    )


async def probe_relay(conn: asyncpg.Connection, policy: RelayPolicy) -> RelayEvidence:
    """Evidence for the ``relay`` family."""
    row = await fetch_probe(conn, RELAY_PROBE, policy.max_heartbeat_age_ms)
    return RelayEvidence(
        observed_at_unix_ms=row["observed_at_unix_ms"],
        instance_count=row["instance_count"],
        live_instance_count=row["live_instance_count"],
        newest_heartbeat_at_unix_ms=row["newest_heartbeat_at_unix_ms"],
        newest_publish_at_unix_ms=row["newest_publish_at_unix_ms"],
        lane_count=row["lane_count"],
        unowned_lane_count=row["unowned_lane_count"],
        oldest_ready_created_at_unix_ms=row["oldest_ready_created_at_unix_ms"],
        blocking_transaction_count=row["blocking_transaction_count"],
        oldest_blocking_transaction_started_at_unix_ms=row[
            "oldest_blocking_transaction_started_at_unix_ms"
        ],
    )
