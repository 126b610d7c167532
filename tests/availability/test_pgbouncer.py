"""The relay, the health sidecar and the scoring writer through a real PgBouncer in
transaction pooling mode.

Such a pooler hands each transaction to whichever server connection is free: named
prepared statements, session settings and LISTEN do not survive, and start-up settings it
does not track are refused at login. ``--database-pooler transaction`` makes every part
work through it; ``--listen-database-url`` gives the relay a direct connection for LISTEN
(and ``migrate`` one for its session lock).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path

import asyncpg
import pytest

from contracts.errors import DatabaseUnavailable
from pgconnect import POOLER_REFUSED_SETTING, connection_options
from relay.store import create_relay_pool
from scoring.worker import claim_next_due, enqueue_job
from scoring.writer import Completion, EventDetails, complete_job
from tests.availability.conftest import PooledDatabase
from tests.support.cli import REPO, cli_env, run_cli, run_service_cli
from tests.support.kafka import read_topic
from tests.support.ports import free_port
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.waiting import wait_until

POOLED = connection_options({}, transaction_pooler=True)
# No relay heartbeats in these tests but the relay's own: its family is judged elsewhere.
_POLICY = (REPO / "docs" / "policy.example.toml").read_text(encoding="utf-8")
POLICY_WITHOUT_RELAY = _POLICY[: _POLICY.index("[relay]")] + "[relay]\nenabled = false\n"


@pytest.fixture
def policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_WITHOUT_RELAY, encoding="utf-8")
    return str(path)


# -- connecting ----------------------------------------------------------------------------
async def test_without_the_pooler_setting_the_refusal_names_the_fix(
    behind_pgbouncer: PooledDatabase,
) -> None:
    # The relay's planner settings travel as start-up parameters, which PgBouncer refuses.
    with pytest.raises(DatabaseUnavailable) as refused:
        await create_relay_pool(behind_pgbouncer.pooled)
    assert POOLER_REFUSED_SETTING in str(refused.value)
    assert "outbox" not in str(refused.value).split("127.0.0.1")[0]  # no user or password


async def test_named_prepared_statements_break_and_the_pooled_options_do_not(
    behind_pgbouncer: PooledDatabase,
) -> None:
    """Why the pooled options exist: asyncpg's statement cache names statements per client
    connection, and the next transaction may run on another server connection."""

    async def transactions(conn: asyncpg.Connection) -> None:
        for i in range(20):
            async with conn.transaction():
                await conn.fetchval(f"SELECT $1::int + {i % 3}", i)

    async def run_six(options: dict[str, object]) -> list[BaseException | None]:
        conns = [await asyncpg.connect(behind_pgbouncer.pooled, **options) for _ in range(6)]
        try:
            return await asyncio.gather(*map(transactions, conns), return_exceptions=True)
        finally:
            for conn in conns:
                conn.terminate()

    cached = await run_six({})
    assert any(isinstance(result, asyncpg.InvalidSQLStatementNameError) for result in cached)
    assert await run_six(POOLED) == [None] * 6


# -- migrate ---------------------------------------------------------------------------------
async def test_migrate_behind_the_pooler_runs_on_the_direct_url(
    unmigrated_behind_pgbouncer: PooledDatabase,
) -> None:
    db = unmigrated_behind_pgbouncer
    pooled = ("migrate", "--database-url", db.pooled, "--database-pooler", "transaction")
    refused = await run_cli(*pooled)
    assert refused.code == 2
    assert "--listen-database-url" in refused.stderr
    assert "outbox:outbox" not in refused.output

    done = await run_cli(*pooled, "--listen-database-url", db.direct)
    assert done.code == 0, done.stderr
    check = await run_cli(*pooled, "--listen-database-url", db.direct, "--verify")
    assert check.code == 0, check.output
    conn = await asyncpg.connect(db.direct)
    try:
        assert await conn.fetchval("SELECT to_regclass('outbox') IS NOT NULL")
    finally:
        await conn.close()


# -- the relay -------------------------------------------------------------------------------
async def test_relay_through_pgbouncer_is_woken_by_notify_on_the_direct_url(
    behind_pgbouncer: PooledDatabase, kafka_bootstrap: str, topic_namespace: str
) -> None:
    # A poll interval far beyond the wait below: only a NOTIFY can bring the rows out in time.
    config = fast_config(
        behind_pgbouncer.pooled,
        kafka_bootstrap,
        topic_namespace,
        transaction_pooler=True,
        listen_database_url=behind_pgbouncer.direct,
        poll_interval_ms=120_000,
    )
    writer = await asyncpg.connect(behind_pgbouncer.pooled, **POOLED)
    try:
        async with running_relay(config) as running:
            await running.holds_every_lane()
            await asyncio.sleep(1.0)  # the first pass over the empty outbox is over
            async with writer.transaction():
                for i in range(20):
                    await writer.execute(INSERT, "order", f"k{i % 4}", "created", json.dumps(i))
            records = await read_topic(
                kafka_bootstrap, f"{topic_namespace}.order", count=20, timeout=30
            )
            assert len(records) == 20
            await wait_until(
                lambda: running.metric("outbox_relay_published_events_total") >= 20,
                timeout=30,
                what="20 events published through PgBouncer",
            )
        assert await writer.fetchval("SELECT count(*) FROM outbox") == 0
    finally:
        await writer.close()


async def test_relay_behind_pgbouncer_without_a_listen_url_polls_and_says_why_once(
    behind_pgbouncer: PooledDatabase,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = fast_config(
        behind_pgbouncer.pooled, kafka_bootstrap, topic_namespace, transaction_pooler=True
    )
    caplog.set_level(logging.WARNING, logger="relay.engine")
    writer = await asyncpg.connect(behind_pgbouncer.pooled, **POOLED)
    try:
        async with running_relay(config):
            for i in range(10):
                await writer.execute(INSERT, "order", f"k{i % 3}", "created", json.dumps(i))
            records = await read_topic(
                kafka_bootstrap, f"{topic_namespace}.order", count=10, timeout=30
            )
            assert len(records) == 10
    finally:
        await writer.close()
    said = [r for r in caplog.records if r.getMessage() == "NOTIFY wake-ups are off; polling only"]
    assert len(said) == 1
    assert "--listen-database-url" in said[0].cause  # type: ignore[attr-defined]
    # The test role has no planner settings of its own: the relay names what is missing.
    (missing,) = [r for r in caplog.records if "not in effect" in r.getMessage()]
    assert missing.settings == (  # type: ignore[attr-defined]
        "enable_bitmapscan, enable_seqscan, enable_sort, jit, statement_timeout"
    )


# -- the health sidecar ----------------------------------------------------------------------
@pytest.mark.parametrize("verb", ["check", "status"])
async def test_check_and_status_through_pgbouncer(
    behind_pgbouncer: PooledDatabase, policy_file: str, verb: str
) -> None:
    args = (verb, "--database-url", behind_pgbouncer.pooled, "--policy", policy_file)
    result = await run_cli(*args, "--database-pooler", "transaction")
    assert result.code == 0, result.output
    if verb == "check":
        assert json.loads(result.stdout)["status"] == "pass"
    # Without the setting the pooler refuses the login, and the reason says what to set.
    refused = await run_cli(*args)
    assert refused.code == 3
    assert "--database-pooler transaction" in refused.stdout


async def serves_within_bounds(db: PooledDatabase, *args: str, settle: float) -> str:
    """``run ARGS`` through PgBouncer until /health is within bounds; its stderr."""
    result, document = await run_service_cli(
        "run",
        "--database-url",
        db.pooled,
        "--database-pooler",
        "transaction",
        *args,
        listen_port=free_port(),
        env=cli_env(),
        settle=settle,
    )
    assert document is not None, result.stderr
    assert document["classification"] == "within_bounds", document
    assert result.code == 0, result.stderr
    return result.stderr


async def test_run_no_relay_serves_health_through_pgbouncer(
    behind_pgbouncer: PooledDatabase, policy_file: str
) -> None:
    await serves_within_bounds(behind_pgbouncer, "--no-relay", "--policy", policy_file, settle=30.0)


async def test_run_with_the_relay_through_pgbouncer_is_within_bounds(
    behind_pgbouncer: PooledDatabase, kafka_bootstrap: str
) -> None:
    # The relay's planner settings and statement timeout, set where the pooler's server
    # connections pick them up.
    conn = await asyncpg.connect(behind_pgbouncer.direct)
    try:
        database = await conn.fetchval("SELECT current_database()")
        for name in ("enable_seqscan", "enable_bitmapscan", "enable_sort", "jit"):
            await conn.execute(f'ALTER DATABASE "{database}" SET {name} = off')
        await conn.execute(f'ALTER DATABASE "{database}" SET statement_timeout = 5000')
    finally:
        await conn.close()
    # The shipped policy, relay family included: heartbeats and lanes through the pooler.
    stderr = await serves_within_bounds(
        behind_pgbouncer,
        "--listen-database-url",
        behind_pgbouncer.direct,
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--policy",
        str(REPO / "docs" / "policy.example.toml"),
        settle=60.0,
    )
    assert "wake-ups are off" not in stderr
    assert "not in effect" not in stderr


# -- the scoring writer and worker SDK -------------------------------------------------------
async def test_writer_completes_jobs_through_pgbouncer(behind_pgbouncer: PooledDatabase) -> None:
    details = EventDetails(
        source="urn:scoring-worker",
        tenant_ref="tenant-a",
        correlation_ref="corr-1",
        schema_version="1",
    )
    workers = [await asyncpg.connect(behind_pgbouncer.pooled, **POOLED) for _ in range(4)]

    async def work(conn: asyncpg.Connection, worker: int) -> list[Completion]:
        done = []
        for _ in range(5):
            job_ref = f"job-{uuid.uuid4().hex[:10]}"
            await enqueue_job(conn, job_ref=job_ref, request_ref=f"req-{job_ref}", max_attempts=3)
            claimed = await claim_next_due(conn, worker_ref=f"worker-{worker}", lease_ms=60_000)
            assert claimed is not None
            outcome = await complete_job(
                conn,
                job_ref=claimed.job_ref,
                fencing_token=claimed.fencing_token,
                result_ref=f"r-{claimed.job_ref}",
                event=details,
            )
            done.append(outcome.completion)
        return done

    try:
        outcomes = await asyncio.gather(*(work(conn, i) for i, conn in enumerate(workers)))
        assert [c for done in outcomes for c in done] == [Completion.COMPLETED] * 20
        events = await workers[0].fetchval(
            "SELECT count(*) FROM outbox WHERE aggregatetype = 'scoring_job'"
        )
        assert events == 20
    finally:
        for conn in workers:
            await conn.close()
