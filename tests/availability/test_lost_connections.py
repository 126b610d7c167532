"""A pooled connection the server closed says why it failed, not how asyncpg tidied up.

``pgconnect.pooled`` throws a connection away when anything went wrong on it. When the
server closed the connection while it was out of the pool, asyncpg has already taken it
back, and every call on it (``is_closed()`` too) raises ``InterfaceError``. The error that
leaves ``pooled`` must still be the one the block raised: the lanes' keeper, the schema
wait and the sidecar log its cause, and a cancellation must stay a cancellation.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from contracts.policy import CompletionOutboxPolicy
from health.errors import ProbeFailure
from health.families.completion_tracker import CompletionTracker
from pgconnect import DB_ERRORS, create_pool, pooled
from tests.support.policies import RECEIPT_RETENTION_MS, SIDECAR_RECHECK_MS
from tests.support.waiting import wait_until

APPLICATION = "pooled-lost-connection-test"
BACKENDS = (
    f"SELECT pid FROM pg_stat_activity WHERE application_name = '{APPLICATION}' "
    "AND datname = current_database()"
)


async def _terminate_the_pools_backends(db: asyncpg.Connection) -> None:
    await db.execute(f"SELECT pg_terminate_backend(pid) FROM ({BACKENDS}) AS b")
    await wait_until(lambda: _none_left(db), what="the pool's backends to end")


async def _none_left(db: asyncpg.Connection) -> bool:
    return not await _any(db, BACKENDS)


async def _pool(database_url: str) -> asyncpg.Pool:
    return await create_pool(
        database_url, min_size=1, max_size=1, server_settings={"application_name": APPLICATION}
    )


async def test_a_statement_the_server_ended_fails_with_its_own_error(
    db: asyncpg.Connection, database_url: str
) -> None:
    pool = await _pool(database_url)
    try:
        async with asyncio.TaskGroup() as both:
            terminating = both.create_task(
                _terminate_when(db, f"{BACKENDS} AND wait_event = 'PgSleep'")
            )
            with pytest.raises(DB_ERRORS) as failed:
                async with pooled(pool) as conn:
                    await conn.fetchval("SELECT pg_sleep(30)")
            await terminating
        # The server's own word (57P01), or the connection's end as the client saw it;
        # not asyncpg refusing the tidy-up call on a connection it already took back.
        assert isinstance(
            failed.value, asyncpg.AdminShutdownError | asyncpg.ConnectionDoesNotExistError
        ), repr(failed.value)
        async with pooled(pool) as conn:  # the pool opens a fresh connection
            assert await conn.fetchval("SELECT 1") == 1
    finally:
        await pool.close()


async def _terminate_when(db: asyncpg.Connection, doing: str) -> None:
    """Terminate the pool's backends once one of them runs ``doing`` (a query of them)."""
    await wait_until(lambda: _any(db, doing), what="the pool's statement to start")
    await _terminate_the_pools_backends(db)


async def _any(db: asyncpg.Connection, query: str) -> bool:
    return bool(await db.fetch(query))


async def test_a_cancellation_on_a_connection_the_server_closed_stays_a_cancellation(
    db: asyncpg.Connection, database_url: str
) -> None:
    pool = await _pool(database_url)
    entered = asyncio.Event()

    async def hold() -> None:
        async with pooled(pool) as conn:
            await conn.fetchval("SELECT 1")
            entered.set()
            await asyncio.sleep(60)

    try:
        holder = asyncio.create_task(hold())
        await entered.wait()
        await _terminate_the_pools_backends(db)
        await asyncio.sleep(0.2)
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
    finally:
        await pool.close()


async def test_the_completion_probe_on_a_connection_the_server_ended_fails_with_its_own_error(
    db: asyncpg.Connection, database_url: str
) -> None:
    """Behind a transaction pooler the completion tracker opens a transaction of its own
    and, when it fails, ends it unless the connection is gone: asking must not hide why
    (a probe failure that says the connection failed, as the sidecar reports it)."""
    pool = await _pool(database_url)
    watcher = await asyncpg.connect(database_url)  # sees pg_stat_activity change; db's
    # transaction holding the lock would keep reading the snapshot it took first
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS)  # no session plans
    policy = CompletionOutboxPolicy(
        grace_ms=0, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
    )
    try:
        async with db.transaction():
            await db.execute("LOCK TABLE scoring_job_state IN ACCESS EXCLUSIVE MODE")
            waiting = f"{BACKENDS} AND wait_event_type = 'Lock'"
            async with asyncio.TaskGroup() as both:
                terminating = both.create_task(_terminate_when(watcher, waiting))
                with pytest.raises(ProbeFailure) as failed:
                    async with pool.acquire() as conn:
                        await tracker.probe(conn, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
                await terminating
        # The probe's own account of the failure, not the tidy-up's InterfaceError.
        assert str(failed.value) == "database connection failed", repr(failed.value)
    finally:
        await watcher.close()
        await pool.close()
