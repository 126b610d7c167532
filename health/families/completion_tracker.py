"""Incremental ``completion_outbox`` check for the long-running sidecar.

The one-shot probe (:data:`health.families.completion_outbox.COMPLETION_OUTBOX_PROBE`)
re-checks every terminal job in the look-back window. The tracker remembers what it
proved instead: a watermark ``W`` (database clock, to the microsecond) below which every
terminal job has been checked, and the refs of the jobs below it found missing or covered
only by a pending event. Each evaluation reads the horizon (the clock and the oldest other
open transaction, before the check's snapshot: nothing with ``updated_at`` below it can
still appear), then checks the jobs new since ``W``, a rolling slice of the settled window
and the remembered refs, and moves ``W`` to the horizon. Whenever the state cannot be
trusted it does the full check instead.

The bounds and the decisions are health/families/completion_window.py (no I/O); the rules,
their bounds and their cost are docs/health.md, "How the completion check scales". The
remembered refs are internal state: never logged, served or put in evidence.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from contracts.health import CompletionOutboxEvidence
from contracts.policy import CompletionOutboxPolicy
from health.families.completion_outbox import (
    NEWEST_TERMINAL,
    NEWEST_TERMINAL_FIELD,
    PENDING_EVENT_OF_JOB,
    RECEIPT_OF_JOB,
    TERMINAL_JOB,
    probe_completion_outbox,
)
from health.families.completion_window import (
    Horizon,
    TrackerState,
    WithoutReceipt,
    conclude,
    horizon_margin_ms,
    plan_window,
)
from health.probing import (
    CLOCK,
    fetch_probe_rows,
    unix_ms,
    unix_us,
    without_newest,
)
from pgconnect import DB_ERRORS, is_open

MAX_REMEMBERED = 10_000
"""Over this many missing jobs the family is far out of bounds: fall back to the full check."""

MAX_PROVISIONAL = 10_000
"""Over this many jobs covered only by a pending event (their events wait to be published
past the grace: a relay far behind) the re-check of each on every evaluation is no longer
small: fall back to the full check."""

HORIZON_MARGIN_MS = 1000
"""Kept below the horizon: absorbs the instant between a transaction taking its start time
and ``pg_stat_activity`` showing it. Jobs in the margin are simply checked again. The grace
already keeps the horizon that far below the clock, so only the part of the margin the
grace does not cover is taken (:func:`horizon_margin_ms`)."""


# Statement 1, before the check's snapshot: the database clock (floored, so every bound
# derived from it is at or before the true instant), the start of the oldest other open
# transaction in this database (floored), and whether a transaction exists whose start
# this role cannot see (another role's session without pg_read_all_stats) or that was
# prepared (two-phase: not in pg_stat_activity, may still commit).
COMPLETION_HORIZON = (
    CLOCK
    + f"""
SELECT clock.now_ms AS observed_at_unix_ms,
       {unix_us("clock.now")} AS clock_us,
       open.oldest_xact_start_us,
       open.hidden_count,
       (SELECT count(*) FROM pg_catalog.pg_prepared_xacts
        WHERE database = current_database()) AS prepared_count,
       newest.newest_terminal_updated_at_unix_ms
FROM clock
{NEWEST_TERMINAL}
CROSS JOIN (
    SELECT {unix_us("min(activity.xact_start)")}
               AS oldest_xact_start_us,
           count(*) FILTER (
               WHERE activity.usesysid IS NOT NULL
                 AND NOT pg_catalog.pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
                 AND NOT pg_catalog.pg_has_role(current_user, activity.usesysid, 'USAGE')
           ) AS hidden_count
    FROM pg_catalog.pg_stat_activity AS activity
    WHERE activity.pid <> pg_backend_pid()
      AND activity.datid = (SELECT oid FROM pg_catalog.pg_database
                            WHERE datname = current_database())
      AND activity.backend_type IS DISTINCT FROM 'autovacuum worker'
) AS open
"""
)

# Statement 2, one snapshot: the terminal jobs without a receipt, each flagged `pending`
# when an event in `outbox` covers it (provisionally) and otherwise missing (the family's
# one rule), in [$1, $2) (new since the watermark, through clock - grace; at most $4
# rows), each flagged `settled` when it is below the horizon $3, and the rolling
# re-check's slice [$5, $6) below the watermark (at most $4 rows); with remembered refs,
# also those of $7 that still have no receipt and are still inside the window [$8, $2).
# Bounds are unix microseconds, exactly the database's timestamp precision, so the window
# is the full check's to the microsecond.
#
# It runs on one cached generic plan per connection (see GENERIC_PLAN_TRANSACTION), so it must have
# a plan that is right whatever the bounds and the table sizes: an index range scan of the
# terminal partial index, each row probed by index for its receipt, then its pending
# event. The probes are scalar subqueries, which PostgreSQL never turns into hash or merge
# joins (NOT EXISTS becomes an anti-join, or a hashed subplan, that a plan built for one
# state would keep for another).
_EPOCH = "timestamptz 'epoch' + {}::bigint::double precision * interval '1 microsecond'"

# A terminal job without a receipt: missing, or covered only provisionally by a pending
# event, which the select list then asks for (only for such a job: a published one, the
# usual case, costs its receipt lookup alone).
_WITHOUT_RECEIPT = f"""{TERMINAL_JOB}
   AND ({RECEIPT_OF_JOB}
        LIMIT 1) IS NULL"""
_PENDING = f"""({PENDING_EVENT_OF_JOB}
          LIMIT 1) IS NOT NULL"""


def _without_receipt_between(lower: str, upper: str, settled: str) -> str:
    """SQL: at most $4 terminal jobs without a receipt with ``updated_at`` in [lower, upper)."""
    return f"""
(SELECT job.scoring_job_ref AS ref,
        {settled} AS settled,
        {_PENDING} AS pending,
        {unix_ms("job.updated_at")} AS updated_at_unix_ms
 FROM scoring_job_state AS job
 WHERE job.updated_at >= {_EPOCH.format(lower)}
   AND job.updated_at < {_EPOCH.format(upper)}
   AND {_WITHOUT_RECEIPT}
 LIMIT $4)"""


COMPLETION_INCREMENT = f"""
{_without_receipt_between("$1", "$2", f"job.updated_at < {_EPOCH.format('$3')}")}
UNION ALL
{_without_receipt_between("$5", "$6", "true")}
"""

# The remembered refs are looked up by primary key; OFFSET 0 keeps the window test out of
# that scan, so that no plan reads the whole window through the range index to find them.
COMPLETION_INCREMENT_WITH_REMEMBERED = f"""{COMPLETION_INCREMENT}
UNION ALL
(SELECT remembered.ref, true AS settled, remembered.pending,
        {unix_ms("remembered.updated_at")} AS updated_at_unix_ms
 FROM (SELECT job.scoring_job_ref AS ref, job.updated_at, {_PENDING} AS pending
       FROM scoring_job_state AS job
       WHERE job.scoring_job_ref = ANY($7::text[])
         AND {_WITHOUT_RECEIPT}
       OFFSET 0) AS remembered
 WHERE remembered.updated_at >= {_EPOCH.format("$8")}
   AND remembered.updated_at < {_EPOCH.format("$2")})
"""

# Both statements run in a read-only transaction of their own, on their generic plans.
# With the bounds as parameters PostgreSQL would otherwise plan statement 2 on every
# evaluation: it prices the generic plan for an unknown range (a share of the whole table)
# above a custom plan for the few rows actually in range, and planning would cost many
# times more than running it: the whole difference between an empty and a million-job
# history. A generic plan is built once per connection (again after ANALYZE or a schema
# change), from statistics that may be stale or from a table still empty, so sequential
# scans are ruled out: the index paths are then the cheapest whatever the statistics say
# (statement 1's newest-terminal guard included, which on a small table's statistics read
# it whole). Each statement of a READ COMMITTED transaction takes its own snapshot,
# statement 2's after statement 1, as the xact_start rule needs; SET LOCAL ends with the
# transaction, also behind a transaction pooler.
GENERIC_PLAN_TRANSACTION = (
    "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY;"
    " SET LOCAL plan_cache_mode = force_generic_plan;"
    " SET LOCAL enable_seqscan = off"
)


@contextlib.asynccontextmanager
async def _generic_plan_transaction(conn: asyncpg.Connection) -> AsyncIterator[None]:
    """A read-only transaction whose statements run on their generic plans; ended always."""
    try:
        await conn.execute(GENERIC_PLAN_TRANSACTION)
        yield
        await conn.execute("COMMIT")
    except BaseException:  # a failure or a cancellation: leave no transaction behind
        if is_open(conn) and conn.is_in_transaction():
            with contextlib.suppress(*DB_ERRORS):  # a broken connection ends it anyway
                await conn.execute("ROLLBACK")
        raise


class CompletionTracker:
    """Per-sidecar incremental state for ``completion_outbox``; see the module docstring."""

    def __init__(
        self,
        *,
        recheck_period_ms: int,
        max_remembered: int = MAX_REMEMBERED,
        max_provisional: int = MAX_PROVISIONAL,
        margin_ms: int = HORIZON_MARGIN_MS,
        session_plans: bool = False,
    ) -> None:
        """``recheck_period_ms``: the sidecar's (health/config.py holds its default and range).
        ``session_plans``: the connections it is given already run on generic plans with
        sequential scans ruled out, as session settings (the sidecar's direct connections,
        :data:`health.sidecar.SIDECAR_SESSION_SETTINGS`). Its two statements then run as
        they are, each in its own snapshot, in order, as in the transaction otherwise
        opened for its ``SET LOCAL`` (:data:`GENERIC_PLAN_TRANSACTION`): two round trips
        fewer per evaluation. Behind a transaction pooler session settings do not stick,
        so there it stays off."""
        self._max = max_remembered
        self._max_provisional = max_provisional
        self._margin_ms = margin_ms
        self._recheck_period_ms = recheck_period_ms
        self._session_plans = session_plans
        self._state: TrackerState | None = None
        self.full_checks = 0
        """How many evaluations fell back to (or started with) the full check."""
        self.incremental_checks = 0

    def __repr__(self) -> str:
        return f"CompletionTracker({self._state!r})"

    @property
    def remembered_count(self) -> int:
        """How many missing jobs are remembered (a number only; the refs stay inside)."""
        return 0 if self._state is None else len(self._state.missing)

    @property
    def provisional_count(self) -> int:
        """How many jobs covered only by a pending event are re-checked (a number only)."""
        return 0 if self._state is None else len(self._state.provisional)

    @property
    def watermark_ms(self) -> int | None:
        """Unix ms (database clock) below which every terminal job has been checked."""
        return None if self._state is None else self._state.watermark_us // 1000

    def reset(self) -> None:
        """Forget everything: the next evaluation is a full check."""
        self._state = None

    async def probe(
        self,
        conn: asyncpg.Connection,
        policy: CompletionOutboxPolicy,
        *,
        receipt_retention_ms: int | None,
    ) -> CompletionOutboxEvidence:
        """Evidence for ``completion_outbox``, the same as the full probe would give."""
        try:
            return await self._probe(conn, policy, receipt_retention_ms)
        except BaseException:  # a failure, a timeout or a cancellation: start over
            self._state = None
            raise

    async def _probe(
        self,
        conn: asyncpg.Connection,
        policy: CompletionOutboxPolicy,
        receipt_retention_ms: int | None,
    ) -> CompletionOutboxEvidence:
        state, self._state = self._state, None  # restored only when the check succeeds
        if conn.is_in_transaction():
            # One snapshot for both statements would defeat the horizon read.
            return await self._full(conn, policy, receipt_retention_ms)
        # Each statement takes its own snapshot, the check's after the horizon read, as the
        # xact_start rule needs: outside a transaction when the session already runs them on
        # their generic plans, else in one READ COMMITTED transaction that sets them.
        planned = (
            contextlib.nullcontext() if self._session_plans else _generic_plan_transaction(conn)
        )
        async with planned:
            evidence = await self._incremental(conn, policy, receipt_retention_ms, state)
        if evidence is None:
            return await self._full(conn, policy, receipt_retention_ms)
        return evidence

    async def _incremental(
        self,
        conn: asyncpg.Connection,
        policy: CompletionOutboxPolicy,
        receipt_retention_ms: int | None,
        state: TrackerState | None,
    ) -> CompletionOutboxEvidence | None:
        """The incremental evidence, or None when only the full check can be trusted."""
        (row,) = await fetch_probe_rows(conn, COMPLETION_HORIZON)
        horizon = without_newest(row, NEWEST_TERMINAL_FIELD)
        plan = plan_window(
            state,
            Horizon(
                clock_us=horizon["clock_us"],
                oldest_open_us=horizon["oldest_xact_start_us"],
                blind=bool(horizon["hidden_count"] or horizon["prepared_count"]),
            ),
            grace_ms=policy.grace_ms,
            lookback_ms=policy.lookback_ms,
            margin_ms=self._margin_ms,
            recheck_period_ms=self._recheck_period_ms,
        )
        if plan is None:
            return None
        args: tuple[object, ...] = (
            plan.scan_from_us,
            plan.upper_us,
            plan.settle_us,
            # Rows of either kind: a statement part cut at this limit holds more of one
            # kind than its bound, so the cut never hides a state that would fit.
            self._max + self._max_provisional + 1,
            plan.sweep_from_us,
            plan.sweep_to_us,
        )
        if plan.remembered:
            statement = COMPLETION_INCREMENT_WITH_REMEMBERED
            args += (list(plan.remembered), plan.window_start_us)
        else:
            statement = COMPLETION_INCREMENT
        rows = await fetch_probe_rows(conn, statement, *args)
        checked = conclude(
            plan,
            (
                WithoutReceipt(r["ref"], r["settled"], r["pending"], r["updated_at_unix_ms"])
                for r in rows
            ),
            max_remembered=self._max,
            max_provisional=self._max_provisional,
        )
        if checked is None:
            return None
        if plan.kept:
            self.incremental_checks += 1
        else:
            self.full_checks += 1
        self._state = checked.state
        return CompletionOutboxEvidence(
            observed_at_unix_ms=horizon["observed_at_unix_ms"],
            missing_count=checked.missing_count,
            oldest_missing_updated_at_unix_ms=checked.oldest_missing_updated_at_unix_ms,
            grace_ms=policy.grace_ms,
            lookback_ms=policy.lookback_ms,
            receipt_retention_ms=receipt_retention_ms,
        )

    async def _full(
        self,
        conn: asyncpg.Connection,
        policy: CompletionOutboxPolicy,
        receipt_retention_ms: int | None,
    ) -> CompletionOutboxEvidence:
        self.full_checks += 1
        return await probe_completion_outbox(
            conn, policy, receipt_retention_ms=receipt_retention_ms
        )


__all__ = [
    "HORIZON_MARGIN_MS",
    "MAX_PROVISIONAL",
    "MAX_REMEMBERED",
    "CompletionTracker",
    "horizon_margin_ms",
]
