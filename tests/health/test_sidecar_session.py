"""The running sidecar's sessions against a real PostgreSQL: what one steady-state evaluation
sends, and plans that hold when the statistics are stale.

The sidecar's steady state is a handful of short statements, so its cost is mostly round
trips and planning. On a direct connection its sessions carry the planner settings
(health/sidecar.py, SIDECAR_SESSION_SETTINGS): the completion check then needs no
transaction of its own, a release needs no reset, and a probe of a table that grew since
its last ANALYZE still reads its partial index.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from contracts.policy import CompletionOutboxPolicy, Family
from health.config import SidecarConfig
from health.families.completion_outbox import COMPLETION_OUTBOX_PROBE, probe_completion_outbox
from health.families.completion_tracker import (
    COMPLETION_HORIZON,
    COMPLETION_INCREMENT,
    COMPLETION_INCREMENT_WITH_REMEMBERED,
    CompletionTracker,
)
from health.families.outbox import OUTBOX_PROBE
from health.families.relay import RELAY_PROBE
from health.families.scoring_jobs import SCORING_JOBS_PROBE
from health.notify_queue import QUEUE_USAGE
from health.sidecar import SIDECAR_SESSION_SETTINGS, HealthSidecar
from pgconnect import connection_options
from tests.support.health_rows import insert_event, insert_job
from tests.support.plans import (
    OUTBOX_STATISTICS,
    blocks_read,
    plan_nodes,
    stage_outbox_statistics,
)
from tests.support.policies import (
    RECEIPT_RETENTION_MS,
    SIDECAR_RECHECK_MS,
    loose_policy,
    relay_policy,
)


def _policy(grace_ms: int = 0) -> CompletionOutboxPolicy:
    return CompletionOutboxPolicy(
        grace_ms=grace_ms, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
    )


@pytest_asyncio.fixture
async def sidecar_db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection opened as the sidecar opens its own (direct, no pooler)."""
    conn = await asyncpg.connect(
        database_url, **connection_options(SIDECAR_SESSION_SETTINGS, transaction_pooler=False)
    )
    yield conn
    await conn.close()


async def _cached_plan_scans(conn: asyncpg.Connection, table: str) -> list[str]:
    """The scan nodes on ``table`` of the plan the connection cached for the prepared
    statement ``probe`` (EXPLAIN EXECUTE shows the cached plan, it builds none)."""
    (plan,) = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) EXECUTE probe"))
    return [n["Node Type"] for n in plan_nodes(plan["Plan"]) if n.get("Relation Name") == table]


async def test_scoring_jobs_probe_keeps_reading_its_index_as_the_queue_grows(
    db: asyncpg.Connection, sidecar_db: asyncpg.Connection
) -> None:
    """A young deployment: the probe's plan is built once per connection, while the table
    is a page or two, and kept while completions grow it (until the next ANALYZE). A plan
    that read the tiny table whole then read every row on every evaluation."""
    await db.execute("ALTER TABLE scoring_job_state SET (autovacuum_enabled = false)")
    for _ in range(100):
        await insert_job(db, "queued")
    await db.execute("ANALYZE scoring_job_state")
    for conn in (db, sidecar_db):
        await conn.execute("PREPARE probe AS " + SCORING_JOBS_PROBE)
        await conn.execute("EXECUTE probe")  # planned now, on the small table
    await db.execute(
        """INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,
               attempt_count, max_attempts, result_ref, completed_fencing_token)
           SELECT 'done-' || g, 'req-done-' || g, 'completed', 1, 3, 'res-' || g, 1
           FROM generate_series(1, 20000) AS g"""
    )
    scans = await _cached_plan_scans(sidecar_db, "scoring_job_state")
    assert len(scans) == 3 and "Seq Scan" not in scans, scans
    # Without the sidecar's settings the same plan reads the grown table whole: the test
    # stages what it is about.
    assert "Seq Scan" in await _cached_plan_scans(db, "scoring_job_state")


@pytest.mark.parametrize(
    ("probe", "args"),
    [
        (OUTBOX_PROBE, ()),
        (SCORING_JOBS_PROBE, ()),
        (RELAY_PROBE, (20_000,)),
        (COMPLETION_OUTBOX_PROBE, (30_000, 86_400_000)),
        (COMPLETION_HORIZON, ()),
    ],
    ids=["outbox", "scoring_jobs", "relay", "completion_outbox", "completion_horizon"],
)
async def test_no_probe_is_compiled_just_in_time(
    sidecar_db: asyncpg.Connection, probe: str, args: tuple[object, ...]
) -> None:
    """With sequential scans ruled out, a scan that has no index to take (the relay probe's
    aggregates over relay_instance and relay_lane) keeps its plan, but PostgreSQL before 18
    prices it past jit_above_cost and compiled it on every evaluation. (A
    server built without LLVM, or PostgreSQL 18, which counts disabled nodes instead of
    pricing them, never compiles these; the Debian PostgreSQL 15 run is the one that can.)"""
    (plan,) = json.loads(
        await sidecar_db.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + probe, *args)
    )
    assert "JIT" not in plan, plan["JIT"]


async def test_no_probe_starts_parallel_workers_while_the_statistics_count_a_backlog(
    db: asyncpg.Connection, sidecar_db: asyncpg.Connection
) -> None:
    """Right after a catch-up the outbox is empty but its statistics still count the
    backlog, until autovacuum analyzes it again: PostgreSQL then planned the outbox probe
    as a parallel index scan and started two worker processes for it on every evaluation,
    every few seconds, on the database the writers share. A probe of a few rows never
    gains from them."""
    await db.execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
    await db.execute(
        """INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
           SELECT 'order', 'k' || (g % 1000), 'created',
                  jsonb_build_object('fill', repeat('x', 300))
           FROM generate_series(1, 150000) AS g"""
    )
    await db.execute("ANALYZE outbox")
    await db.execute("DELETE FROM outbox")
    for probe, args in ((OUTBOX_PROBE, ()), (RELAY_PROBE, (20_000,))):
        (plan,) = json.loads(await sidecar_db.fetchval("EXPLAIN (FORMAT JSON) " + probe, *args))
        parallel = [
            n["Node Type"]
            for n in plan_nodes(plan["Plan"])
            if n.get("Parallel Aware") or n["Node Type"].startswith("Gather")
        ]
        assert parallel == [], parallel
    # Without the sidecar's settings a count of the pending rows is parallel: the test
    # stages what it is about.
    (plan,) = json.loads(
        await db.fetchval(
            """EXPLAIN (FORMAT JSON)
               SELECT count(*), min(created_at), max(created_at),
                      count(*) FILTER (WHERE last_error_class IS NOT NULL)
               FROM outbox WHERE quarantined_at IS NULL"""
        )
    )
    assert any(n["Node Type"].startswith("Gather") for n in plan_nodes(plan["Plan"]))


async def test_open_transaction_rule_holds_without_the_checks_transaction(
    sidecar_db: asyncpg.Connection, db: asyncpg.Connection, database_url: str
) -> None:
    """Without the check's transaction the horizon read still bounds the watermark by the
    oldest open transaction's start: a job committed by a transaction that was open across
    an evaluation, with an updated_at below that evaluation's clock, is still found. (That
    the two statements take their snapshots in order, the read's first, is asyncpg's: each
    call returns before the next is sent.)"""
    policy = _policy(grace_ms=0)
    tracker = CompletionTracker(
        recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0, session_plans=True
    )
    await tracker.probe(sidecar_db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
    writer = await asyncpg.connect(database_url)
    try:
        await writer.execute("BEGIN")
        started = await writer.fetchval("SELECT now()")
        await insert_job(writer, "completed", updated_at=started)
        seen = await tracker.probe(sidecar_db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
        assert seen.missing_count == 0  # not committed yet
        assert tracker.watermark_ms is not None
        assert tracker.watermark_ms <= int(started.timestamp() * 1000)
        await writer.execute("COMMIT")
    finally:
        await writer.close()
    found = await tracker.probe(sidecar_db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
    full = await probe_completion_outbox(db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
    assert found.missing_count == 1 == full.missing_count
    assert (tracker.full_checks, tracker.incremental_checks) == (1, 2)
    plans = await sidecar_db.fetch(
        """SELECT generic_plans, custom_plans FROM pg_prepared_statements
           WHERE statement LIKE '%FROM scoring_job_state AS job%UNION ALL%'
             AND statement NOT LIKE '%pg_prepared_statements%'"""
    )
    assert plans and sum(p["custom_plans"] for p in plans) == 0, plans


def _logging_pools(monkeypatch: pytest.MonkeyPatch, statements: list[str]) -> None:
    """Make every pool the sidecar opens log each statement its connections send."""
    create_pool = asyncpg.create_pool

    def logged(*args: Any, **kwargs: Any) -> Any:
        async def init(conn: asyncpg.Connection) -> None:
            conn.add_query_logger(lambda record: statements.append(record.query))

        return create_pool(*args, init=init, **kwargs)

    monkeypatch.setattr(asyncpg, "create_pool", logged)


async def test_steady_state_evaluation_sends_only_its_statements(
    db: asyncpg.Connection, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One statement per family probe, the horizon read and the check: no BEGIN and COMMIT
    around the check, and no session reset when the connection goes back to the pool."""
    statements: list[str] = []
    _logging_pools(monkeypatch, statements)
    sidecar = HealthSidecar(
        SidecarConfig(
            database_url=database_url,
            policy=loose_policy(completion_outbox=_policy(grace_ms=0), relay=relay_policy()),
            listen=("127.0.0.1", 0),
            receipt_retention_ms=RECEIPT_RETENTION_MS,
        ),
        registry=CollectorRegistry(),
    )
    async with sidecar:
        await sidecar.evaluate_once()  # the first: a full check
        job = await insert_job(db, "completed")
        await sidecar.evaluate_once()
        await insert_event(db, aggregateid=job)
        await sidecar.evaluate_once()
        statements.clear()
        await insert_job(db, "completed")
        report = await sidecar.evaluate_once()
        await asyncio.sleep(0)  # query loggers run on the loop's next turn
    result = next(r for r in report.families if r.family is Family.COMPLETION_OUTBOX)
    assert result.evidence is not None and result.evidence.missing_count == 1
    words = [statement.split(None, 1)[0].upper() for statement in statements]
    assert "BEGIN" not in words and "COMMIT" not in words, statements
    assert not [s for s in statements if "RESET ALL" in s or "UNLISTEN" in s], statements
    # outbox, scoring_jobs, relay, the completion horizon and the incremental check (not
    # the full check it falls back to), and the NOTIFY queue's usage
    assert len(statements) == 6, statements
    assert statements.count(QUEUE_USAGE) == 1, statements
    assert statements.count(COMPLETION_HORIZON) == 1, statements
    assert (
        sum(s in (COMPLETION_INCREMENT, COMPLETION_INCREMENT_WITH_REMEMBERED) for s in statements)
        == 1
    ), statements
    assert COMPLETION_OUTBOX_PROBE not in statements


# The partial indexes of held and quarantined rows (empty when healthy).
_HELD_ROW_INDEXES = {"outbox_held_topic_idx", "outbox_held_key_idx", "outbox_quarantined_idx"}


def _outbox_scans(plan: dict[str, Any]) -> tuple[list[tuple[str, ...]], list[str]]:
    """The scans of the outbox's pending rows, each with the indexes it reads (a bitmap
    scan's beneath it), and the indexes the relay probe's look-ups of held rows read."""
    pending, held = [], []
    for node in plan_nodes(plan["Plan"]):
        if node.get("Relation Name") != "outbox":
            continue
        if node["Alias"].startswith("held"):
            held.append(node.get("Index Name", node["Node Type"]))
            continue
        bitmaps = [c for c in node.get("Plans", []) if c["Parent Relationship"] == "Outer"]
        indexes = [node.get("Index Name")] + [
            n.get("Index Name") for b in bitmaps for n in plan_nodes(b)
        ]
        if not _HELD_ROW_INDEXES.intersection(indexes):
            pending.append((node["Node Type"], *filter(None, indexes)))
    return pending, held


_PROBES_OF_PENDING_ROWS = pytest.mark.parametrize(
    ("probe", "args"), [(OUTBOX_PROBE, ()), (RELAY_PROBE, (20_000,))], ids=["outbox", "relay"]
)


@pytest.mark.parametrize("statistics", list(OUTBOX_STATISTICS), ids=list(OUTBOX_STATISTICS))
@_PROBES_OF_PENDING_ROWS
async def test_pending_rows_are_read_in_write_time_order_whatever_the_statistics(
    db: asyncpg.Connection,
    sidecar_db: asyncpg.Connection,
    statistics: str,
    probe: str,
    args: tuple[object, ...],
) -> None:
    """Each minute's ANALYZE gave the probes of pending rows a new plan, and small
    statistics make every index look alike: a bitmap scan (which never marks an entry
    dead), a scan of outbox_pending_key_seq_idx (whose pages the writers' inserts change
    all the time, so its marks are given up), and for the relay probe's look-ups of held
    rows the unique index on seq (every entry below the row). One plan holds in every
    state: a plain scan of outbox_pending_created_idx, and look-ups of held rows only in
    the indexes of held rows."""
    await stage_outbox_statistics(db, *OUTBOX_STATISTICS[statistics])
    (plan,) = json.loads(await sidecar_db.fetchval("EXPLAIN (FORMAT JSON) " + probe, *args))
    pending, held = _outbox_scans(plan)
    assert pending and set(pending) == {("Index Scan", "outbox_pending_created_idx")}, pending
    assert set(held) <= _HELD_ROW_INDEXES, held


@_PROBES_OF_PENDING_ROWS
async def test_a_probe_walks_what_the_relay_deleted_once(
    db: asyncpg.Connection, sidecar_db: asyncpg.Connection, probe: str, args: tuple[object, ...]
) -> None:
    """The relay deletes every row it publishes, and until vacuum removes them their index
    entries stay. A probe that marks the entries it finds dead steps over them the next
    time; a bitmap scan marks none, and walked every row the relay deleted since the last
    vacuum (up to a minute's worth, about 5,000 blocks here) on every evaluation."""
    await stage_outbox_statistics(db, *OUTBOX_STATISTICS["a_few_live_rows_among_dead_ones"])
    explain = await sidecar_db.prepare("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + probe)
    blocks = []
    for _ in range(3):
        (plan,) = json.loads(await explain.fetchval(*args))
        blocks.append(blocks_read(plan["Plan"]))
    assert blocks[0] > 1000, blocks  # the first walks the deleted rows: what the test is about
    assert max(blocks[1:]) < blocks[0] / 10, blocks


@pytest.mark.parametrize("session", ["sidecar", "check"])
async def test_the_relay_probe_reads_a_backlog_at_its_two_ends(
    db: asyncpg.Connection, sidecar_db: asyncpg.Connection, session: str
) -> None:
    """The relay family needs the oldest and the newest ready row, not every one: a probe
    that tested every pending row for an earlier held row of its key read a catch-up's
    whole backlog (three index look-ups a row: about 360,000 blocks and 170 ms for 60,000
    rows, every five seconds while the relay was away). Read in write-time order from
    each end, it stops at the first row that is ready: in the sidecar's sessions and in
    a session without its planner settings (``check``, or behind a pooler without them
    on the role), where ``LIMIT 1`` alone makes the ordered scan the cheapest."""
    await db.execute(
        """INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
           SELECT 'order', 'k' || (g % 1000), 'created', '{}'::jsonb
           FROM generate_series(1, 20000) AS g"""
    )
    await db.execute("ANALYZE outbox")
    conn = sidecar_db if session == "sidecar" else db
    (plan,) = json.loads(
        await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + RELAY_PROBE, 20_000)
    )
    blocks = blocks_read(plan["Plan"])
    assert blocks < 200, blocks
