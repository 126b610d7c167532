"""The sidecar's incremental completion_outbox check against a real PostgreSQL: it finds
what the full check finds, including jobs committed by a transaction that was open across
an evaluation (the xact_start rule), and its cost follows what changed."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import re
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from contracts.health import CompletionOutboxEvidence
from contracts.policy import CompletionOutboxPolicy, Family
from health.config import SidecarConfig
from health.evaluate import evaluate
from health.families.completion_outbox import probe_completion_outbox
from health.families.completion_tracker import (
    COMPLETION_INCREMENT,
    COMPLETION_INCREMENT_WITH_REMEMBERED,
    GENERIC_PLAN_TRANSACTION,
    CompletionTracker,
)
from health.sidecar import HealthSidecar
from tests.support.health_rows import SECRET_MARK, db_now, insert_event, insert_job, insert_receipt
from tests.support.plans import plan_nodes
from tests.support.policies import RECEIPT_RETENTION_MS, SIDECAR_RECHECK_MS, loose_policy


def completion_policy(*, grace_ms: int = 0, lookback_ms: int = 86_400_000) -> Any:
    return CompletionOutboxPolicy(
        grace_ms=grace_ms, lookback_ms=lookback_ms, max_missing_count=0, gates_readiness=True
    )


async def incremental(
    db: asyncpg.Connection, tracker: CompletionTracker, policy: CompletionOutboxPolicy
) -> CompletionOutboxEvidence:
    return await tracker.probe(db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)


async def full(db: asyncpg.Connection, policy: CompletionOutboxPolicy) -> CompletionOutboxEvidence:
    return await probe_completion_outbox(db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)


async def test_missing_event_found_after_grace_and_recovers(db: asyncpg.Connection) -> None:
    policy = completion_policy(grace_ms=300)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    assert (await incremental(db, tracker, policy)).missing_count == 0  # first: full window
    job = await insert_job(db, "completed")  # updated_at = clock_timestamp(), as writers do
    assert (await incremental(db, tracker, policy)).missing_count == 0  # within grace
    await asyncio.sleep(0.4)
    found = await incremental(db, tracker, policy)
    assert found.missing_count == 1
    assert found.oldest_missing_updated_at_unix_ms is not None
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 1  # now remembered
    assert tracker.remembered_count == 1
    await insert_event(db, aggregateid=job)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.remembered_count == 0
    # A quarantined job is covered by its receipt once the event is published.
    other = await insert_job(db, "quarantined")
    await asyncio.sleep(0.4)
    assert (await incremental(db, tracker, policy)).missing_count == 1
    await insert_receipt(db, aggregateid=other)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.full_checks == 1 and tracker.incremental_checks >= 6


async def test_transaction_open_across_an_evaluation_is_not_skipped(
    db: asyncpg.Connection, database_url: str
) -> None:
    policy = completion_policy(grace_ms=0)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    await incremental(db, tracker, policy)
    writer = await asyncpg.connect(database_url)
    try:
        await writer.execute("BEGIN")
        started = await writer.fetchval("SELECT now()")  # the transaction's start
        # Completed "in the past": updated_at is the transaction start, not the commit time.
        await insert_job(writer, "completed", updated_at=started)
        await asyncio.sleep(0.2)
        seen = await incremental(db, tracker, policy)
        assert seen.missing_count == 0  # not committed yet
        # Without the rule the watermark would be the clock (> started) and the job,
        # committed below it, would never be checked.
        assert tracker.watermark_ms is not None
        assert tracker.watermark_ms <= int(started.timestamp() * 1000)
        assert seen.observed_at_unix_ms is not None
        assert seen.observed_at_unix_ms - int(started.timestamp() * 1000) >= 150
        await writer.execute("COMMIT")
    finally:
        await writer.close()
    found = await incremental(db, tracker, policy)
    assert found.missing_count == 1 == (await full(db, policy)).missing_count
    assert tracker.incremental_checks == 2


async def test_job_leaving_the_look_back_window_drops_out(db: asyncpg.Connection) -> None:
    policy = completion_policy(grace_ms=0, lookback_ms=1500)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    await incremental(db, tracker, policy)
    await insert_job(db, "completed")
    await asyncio.sleep(0.1)
    assert (await incremental(db, tracker, policy)).missing_count == 1
    assert tracker.remembered_count == 1
    await asyncio.sleep(1.6)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.remembered_count == 0
    assert (await full(db, policy)).missing_count == 0


RECHECK_PERIOD_MS = 1000
RECHECK: dict[str, Any] = {"recheck_period_ms": RECHECK_PERIOD_MS}


async def converges(
    db: asyncpg.Connection,
    tracker: CompletionTracker,
    policy: CompletionOutboxPolicy,
    *,
    within_s: float,
) -> int:
    """Evaluate about every 50 ms until the incremental count equals the full one.

    Returns the count; fails when it did not converge within ``within_s``.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        got = await incremental(db, tracker, policy)
        want = await full(db, policy)
        if (got.missing_count, got.oldest_missing_updated_at_unix_ms) == (
            want.missing_count,
            want.oldest_missing_updated_at_unix_ms,
        ):
            return got.missing_count
        assert loop.time() - started < within_s, (got, want)
        await asyncio.sleep(0.05)


async def test_covered_job_whose_pending_event_is_deleted_is_found_at_the_next_evaluation(
    db: asyncpg.Connection,
) -> None:
    policy = completion_policy(grace_ms=0)
    tracker = CompletionTracker(
        recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0
    )  # the rolling re-check: once in six hours
    job = await insert_job(db, "completed")
    await insert_event(db, aggregateid=job)
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 0  # first: full
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.watermark_ms is not None  # the job is below the watermark: settled
    # The event is deleted unpublished (no receipt): the job is now missing.
    await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
    assert (await full(db, policy)).missing_count == 1
    # Covered only provisionally (no receipt yet), so re-checked on every evaluation.
    assert (await incremental(db, tracker, policy)).missing_count == 1
    assert tracker.full_checks == 1  # found incrementally, not by starting over


async def test_back_dated_job_below_the_watermark_is_found_within_the_recheck_period(
    db: asyncpg.Connection,
) -> None:
    policy = completion_policy(grace_ms=0)
    tracker = CompletionTracker(margin_ms=0, **RECHECK)
    await incremental(db, tracker, policy)
    await asyncio.sleep(0.05)
    await incremental(db, tracker, policy)
    # Written with an updated_at five minutes old: far below the watermark.
    await insert_job(db, "completed", updated_at=await db_now(db) - dt.timedelta(minutes=5))
    assert (await full(db, policy)).missing_count == 1
    count = await converges(db, tracker, policy, within_s=RECHECK_PERIOD_MS / 1000 + 1.5)
    assert count == 1
    assert tracker.full_checks == 1


async def test_state_resets_on_policy_change_and_probe_error(db: asyncpg.Connection) -> None:
    policy = completion_policy(grace_ms=0)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    await incremental(db, tracker, policy)
    await incremental(db, tracker, policy)
    assert (tracker.full_checks, tracker.incremental_checks) == (1, 1)
    await incremental(db, tracker, completion_policy(grace_ms=5))  # grace changed: full
    assert (tracker.full_checks, tracker.incremental_checks) == (2, 1)
    await db.execute("ALTER TABLE outbox_receipt RENAME TO outbox_receipt_gone")
    with pytest.raises(Exception, match="missing"):
        await incremental(db, tracker, policy)
    assert tracker.watermark_ms is None
    await db.execute("ALTER TABLE outbox_receipt_gone RENAME TO outbox_receipt")
    await incremental(db, tracker, policy)
    assert tracker.full_checks == 3


async def test_over_the_remembered_bound_falls_back_to_the_full_check(
    db: asyncpg.Connection,
) -> None:
    policy = completion_policy(grace_ms=0)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0, max_remembered=3)
    for _ in range(5):
        await insert_job(db, "completed")
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 5
    assert tracker.watermark_ms is None  # nothing remembered; next time full again
    assert (await incremental(db, tracker, policy)).missing_count == 5


@pytest.mark.parametrize("margin_ms", [0, 1000])
async def test_incremental_equals_full_over_a_random_history(
    db: asyncpg.Connection, database_url: str, margin_ms: int
) -> None:
    rng = random.Random(20240611 + margin_ms)
    policy = completion_policy(grace_ms=0)
    period_ms = 300
    tracker = CompletionTracker(margin_ms=margin_ms, max_remembered=50, recheck_period_ms=period_ms)
    missing: list[str] = []
    covered: list[str] = []
    # Jobs the tracker may never have seen covered: written below its watermark.
    back_dated: set[str] = set()
    writer = await asyncpg.connect(database_url)
    in_transaction: list[str] = []
    try:
        for _ in range(40):
            # Set by what the incremental state cannot see at once: a job written with an
            # updated_at below the watermark (or the deleted event of one). An event the
            # tracker saw pending and that is deleted unpublished is seen at once.
            behind = False
            for _ in range(rng.randint(0, 4)):
                action = rng.random()
                if action < 0.3:
                    missing.append(await insert_job(db, rng.choice(["completed", "quarantined"])))
                elif action < 0.42:
                    job = await insert_job(db, "completed")
                    await insert_event(db, aggregateid=job)
                    covered.append(job)
                elif action < 0.55 and missing:
                    job = missing.pop(rng.randrange(len(missing)))
                    if rng.random() < 0.5:
                        await insert_event(db, aggregateid=job)
                        covered.append(job)
                    else:
                        await insert_receipt(db, aggregateid=job)
                elif action < 0.68 and not in_transaction:
                    await writer.execute("BEGIN")
                    in_transaction.append(await insert_job(writer, "completed"))
                elif action < 0.78 and in_transaction:
                    await writer.execute("COMMIT")
                    missing.extend(in_transaction)
                    in_transaction.clear()
                elif action < 0.84 and covered:
                    # Its pending event is deleted unpublished: the job is missing again.
                    job = covered.pop(rng.randrange(len(covered)))
                    await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
                    missing.append(job)
                    behind = behind or job in back_dated
                elif action < 0.9:
                    # Back-dated: minutes below the watermark.
                    minutes = dt.timedelta(minutes=rng.randint(1, 600))
                    updated_at = await db_now(db) - minutes
                    job = await insert_job(db, "completed", updated_at=updated_at)
                    missing.append(job)
                    back_dated.add(job)
                    behind = True
                else:
                    # Not a terminal state: never counted.
                    await insert_job(db, "cancelled")
            if rng.random() < 0.3:
                await asyncio.sleep(0.02)
            if behind:
                # Bounded convergence: within the re-check period (plus slack for the box).
                count = await converges(db, tracker, policy, within_s=period_ms / 1000 + 2)
                assert count == len(missing)
                continue
            got = await incremental(db, tracker, policy)
            want = await full(db, policy)
            assert got.missing_count == want.missing_count == len(missing)
            assert got.oldest_missing_updated_at_unix_ms == want.oldest_missing_updated_at_unix_ms
        if in_transaction:
            await writer.execute("COMMIT")
            missing.extend(in_transaction)
        got = await incremental(db, tracker, policy)
        assert got.missing_count == (await full(db, policy)).missing_count == len(missing)
    finally:
        await writer.close()
    assert tracker.incremental_checks > 0


async def test_sidecar_evaluates_incrementally_and_serves_aggregates_only(
    database_url: str, db: asyncpg.Connection
) -> None:
    sidecar = HealthSidecar(
        SidecarConfig(
            database_url=database_url,
            policy=loose_policy(completion_outbox=completion_policy(grace_ms=0)),
            listen=("127.0.0.1", 0),
            receipt_retention_ms=RECEIPT_RETENTION_MS,
        ),
        registry=CollectorRegistry(),
    )
    async with sidecar:
        await sidecar.evaluate_once()
        job = await insert_job(db, "completed")
        report = await sidecar.evaluate_once()
        result = next(r for r in report.families if r.family is Family.COMPLETION_OUTBOX)
        assert result.evidence is not None and result.evidence.missing_count == 1
        await asyncio.sleep(1.1)  # past the horizon margin: remembered
        await sidecar.evaluate_once()
        await insert_event(db, aggregateid=job)
        report = await sidecar.evaluate_once()
        result = next(r for r in report.families if r.family is Family.COMPLETION_OUTBOX)
        assert result.evidence is not None and result.evidence.missing_count == 0
    assert SECRET_MARK not in repr(sidecar._completion)


async def test_one_shot_evaluate_is_the_full_check(db: asyncpg.Connection) -> None:
    await insert_job(db, "completed", updated_at=await db_now(db) - dt.timedelta(minutes=5))
    report = await evaluate(db, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS)
    result = next(r for r in report.families if r.family is Family.COMPLETION_OUTBOX)
    assert result.evidence is not None and result.evidence.missing_count == 1


async def _fill_window(db: asyncpg.Connection, jobs: int) -> None:
    """``jobs`` terminal jobs an hour old, each with its receipt, and fresh statistics."""
    await db.execute(
        """
        INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,
            attempt_count, max_attempts, result_ref, completed_fencing_token, created_at,
            updated_at)
        SELECT 'hist-' || g, 'req-' || g, 'completed', 1, 3, 'res-' || g, 1,
               now() - interval '1 hour', now() - interval '1 hour'
        FROM generate_series(1, $1) AS g
        """,
        jobs,
    )
    await db.execute(
        """
        INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,
            kafka_partition, kafka_offset, created_at, published_at)
        SELECT gen_random_uuid(), 'scoring_job', 'hist-' || g, 'scoring.result.completed',
               'outbox.event.scoring_job', 0, g, now(), now()
        FROM generate_series(1, $1) AS g
        """,
        jobs,
    )
    await db.execute("VACUUM ANALYZE scoring_job_state")
    await db.execute("VACUUM ANALYZE outbox_receipt")


@pytest.mark.parametrize("with_remembered", [False, True])
async def test_increment_plan_reads_the_window_through_partial_indexes(
    db: asyncpg.Connection, with_remembered: bool
) -> None:
    """The plan the tracker caches reads ranges and keys through indexes, whatever the bounds.

    Its generic plan is built once and kept for every later state, so it is checked with
    bounds spanning the whole window too, where a plan chosen for a few rows (or a hash of
    every receipt) would read the history: the rows each scan returns stay those in range.
    """
    await _fill_window(db, 20000)
    now_us = int((await db_now(db)).timestamp() * 1_000_000)
    window = now_us - 86_400_000_000
    # New work over the whole window, the re-check's slice over the whole window.
    args = f"{window}, {now_us}, {now_us - 1_000_000}, 10001, {window}, {now_us}"
    statement, types = COMPLETION_INCREMENT, "bigint, bigint, bigint, bigint, bigint, bigint"
    if with_remembered:
        statement = COMPLETION_INCREMENT_WITH_REMEMBERED
        types += ", text[], bigint"
        args += f", '{{hist-7,x-1}}', {window}"
    await db.execute(GENERIC_PLAN_TRANSACTION)
    try:
        await db.execute(f"PREPARE increment({types}) AS {statement}")
        raw = await db.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE increment({args})")
    finally:
        await db.execute("ROLLBACK")
    plan = json.loads(raw) if isinstance(raw, str) else raw
    text = json.dumps(plan)
    for shape in ("Seq Scan", "Hash", "Merge", "BitmapAnd"):
        assert shape not in text, (shape, text)
    assert "scoring_job_state_terminal_updated_idx" in text
    assert "outbox_receipt_scoring_job_idx" in text
    assert "outbox_scoring_job_idx" in text
    # Every probe of a receipt or an event is a lookup of one job's key.
    for node in plan_nodes(plan[0]["Plan"]):
        if node.get("Relation Name") in ("outbox", "outbox_receipt"):
            assert re.fullmatch(
                r"\(aggregateid = job(_\d+)?\.scoring_job_ref\)", node["Index Cond"]
            )
        if node.get("Index Name") == "scoring_job_state_pkey":
            assert node["Actual Rows"] * node.get("Actual Loops", 1) <= 1, node


async def test_steady_state_runs_on_a_cached_plan(db: asyncpg.Connection) -> None:
    """With a history in the window the tracker's statement is planned once, not every time.

    With the bounds as parameters PostgreSQL would keep building custom plans (planning
    then costs ten times the run); on the connection's cached generic plan an evaluation
    costs what an empty history costs.
    """
    await _fill_window(db, 20000)
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS)
    policy = completion_policy(grace_ms=30_000)
    for _ in range(10):
        await insert_job(db, "completed")
        await incremental(db, tracker, policy)
    assert (tracker.full_checks, tracker.incremental_checks) == (1, 9)
    plans = await db.fetch(
        """SELECT generic_plans, custom_plans FROM pg_prepared_statements
           WHERE statement LIKE '%FROM scoring_job_state AS job%UNION ALL%'
             AND statement NOT LIKE '%pg_prepared_statements%'"""
    )
    assert plans, "the tracker's statement is prepared on the connection"
    assert sum(plan["custom_plans"] for plan in plans) == 0, plans
    assert sum(plan["generic_plans"] for plan in plans) == 10, plans
