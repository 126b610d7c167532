"""Coverage by a pending event is provisional until its receipt exists: against a real
PostgreSQL, the running sidecar finds a pending event deleted unpublished as ``check`` does,
within ``grace_ms`` plus a few evaluation intervals, not at the rolling re-check's pace."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import asyncpg
import pytest

from contracts.health import CompletionOutboxEvidence
from contracts.policy import CompletionOutboxPolicy
from health.commands import check
from health.families.completion_outbox import probe_completion_outbox
from health.families.completion_tracker import CompletionTracker
from health.sidecar import HealthSidecar
from tests.health.test_http import running
from tests.support.health_rows import insert_event, insert_job, insert_receipt
from tests.support.http import get
from tests.support.policies import RECEIPT_RETENTION_MS, SIDECAR_RECHECK_MS, loose_policy

# At a grace of 1 s or more the horizon margin is nothing: a job is below the watermark
# the first time it is checked, the hardest case for a deletion that follows.
GRACE_MS = 1000
INTERVAL_MS = 100


def completion_policy(*, grace_ms: int = 0) -> CompletionOutboxPolicy:
    return CompletionOutboxPolicy(
        grace_ms=grace_ms, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
    )


async def incremental(
    db: asyncpg.Connection, tracker: CompletionTracker, policy: CompletionOutboxPolicy
) -> CompletionOutboxEvidence:
    return await tracker.probe(db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)


async def full(db: asyncpg.Connection, policy: CompletionOutboxPolicy) -> CompletionOutboxEvidence:
    return await probe_completion_outbox(db, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)


def completion_of(document: dict[str, Any]) -> tuple[str, int]:
    """The completion family's classification and missing count in a health+json document."""
    checks = document["checks"]
    return (
        checks["completion_outbox:classification"][0]["classification"],
        checks["completion_outbox:missing_count"][0]["observedValue"],
    )


async def served(sidecar: HealthSidecar) -> tuple[str, int]:
    return completion_of(json.loads((await get(sidecar.address, "/health")).body))


async def checked(database_url: str, policy: Any) -> tuple[str, int]:
    text, _ = await check(database_url, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
    return completion_of(json.loads(text))


async def test_running_sidecar_finds_a_deleted_pending_event_as_check_does(
    database_url: str, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    policy = loose_policy(completion_outbox=completion_policy(grace_ms=GRACE_MS))
    assert policy.evaluation.interval_ms == INTERVAL_MS
    async with running(database_url, policy) as sidecar:
        job = await insert_job(db, "completed")
        await insert_event(db, aggregateid=job)  # pending: the relay has not published it
        completed_ms = await db.fetchval(
            "SELECT (extract(epoch FROM updated_at) * 1000)::bigint FROM scoring_job_state"
            " WHERE scoring_job_ref = $1",
            job,
        )
        # Past the grace and below the watermark: the incremental check has settled it.
        tracker = sidecar._completion
        while (tracker.watermark_ms or 0) <= completed_ms:
            await sidecar.next_report()
        await sidecar.next_report()
        assert tracker.full_checks == 1, "the sidecar is in its incremental steady state"
        assert await served(sidecar) == ("within_bounds", 0) == await checked(database_url, policy)

        # Deleted unpublished (by hand, by a purge): no event, no receipt.
        await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
        assert await checked(database_url, policy) == ("stalled", 1)
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        evaluations = 0
        # One evaluation may have begun before the delete; the next one must see it. A
        # few more are allowed for a busy machine, far below the rolling re-check's period.
        while (await served(sidecar))[0] != "stalled":
            assert evaluations < 5, "the running sidecar still calls the job covered"
            await sidecar.next_report()
            evaluations += 1
        elapsed_ms = (loop.time() - deleted_at) * 1000
        assert elapsed_ms <= GRACE_MS + 5 * INTERVAL_MS, elapsed_ms
        assert await served(sidecar) == ("stalled", 1) == await checked(database_url, policy)
        assert tracker.full_checks == 1, "found incrementally, not by starting over"
        # The remembered refs are internal state: never logged or shown.
        assert job not in repr(tracker)
        assert job not in caplog.text
        assert job not in (await get(sidecar.address, "/health")).text


async def test_deleted_within_the_grace_is_stalled_once_the_grace_has_passed(
    database_url: str, db: asyncpg.Connection
) -> None:
    policy = loose_policy(completion_outbox=completion_policy(grace_ms=GRACE_MS))
    async with running(database_url, policy) as sidecar:
        job = await insert_job(db, "completed")
        await insert_event(db, aggregateid=job)
        await sidecar.next_report()
        await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
        loop = asyncio.get_running_loop()
        deleted_at = loop.time()
        assert await served(sidecar) == ("within_bounds", 0)  # inside its grace
        while (await served(sidecar))[0] != "stalled":
            assert (loop.time() - deleted_at) * 1000 <= GRACE_MS + 5 * INTERVAL_MS
            await sidecar.next_report()
        assert await served(sidecar) == ("stalled", 1) == await checked(database_url, policy)


async def test_published_pending_event_stays_covered_and_is_no_longer_rechecked(
    db: asyncpg.Connection,
) -> None:
    policy = completion_policy()
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    await incremental(db, tracker, policy)  # first: the full window
    job = await insert_job(db, "completed")
    await insert_event(db, aggregateid=job)
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.watermark_ms is not None
    assert tracker.provisional_count == 1  # covered, until its receipt exists
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.provisional_count == 1
    # The relay publishes it: the pending row becomes its receipt in one transaction.
    async with db.transaction():
        await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
        await insert_receipt(db, aggregateid=job)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.provisional_count == 0  # covered for good: not looked at again
    for _ in range(3):
        assert (await incremental(db, tracker, policy)).missing_count == 0
    assert (await full(db, policy)).missing_count == 0
    assert (tracker.full_checks, tracker.provisional_count, tracker.remembered_count) == (1, 0, 0)


async def test_missing_job_covered_late_by_a_pending_event_is_still_rechecked(
    db: asyncpg.Connection,
) -> None:
    """A remembered missing job that gets a pending event moves to the provisional refs, so
    a deletion of that event is found at once too."""
    policy = completion_policy()
    tracker = CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
    await incremental(db, tracker, policy)
    job = await insert_job(db, "completed")
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 1
    await insert_event(db, aggregateid=job)  # late, but pending
    assert (await incremental(db, tracker, policy)).missing_count == 0
    await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
    assert (await incremental(db, tracker, policy)).missing_count == 1
    assert (await full(db, policy)).missing_count == 1
    assert (tracker.full_checks, tracker.remembered_count) == (1, 1)


async def test_over_the_provisional_bound_falls_back_to_the_full_check(
    db: asyncpg.Connection,
) -> None:
    policy = completion_policy()
    tracker = CompletionTracker(
        recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0, max_provisional=3
    )
    await incremental(db, tracker, policy)
    jobs = [await insert_job(db, "completed") for _ in range(3)]
    for job in jobs:
        await insert_event(db, aggregateid=job)
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert (tracker.full_checks, tracker.provisional_count) == (1, 3)  # at the bound: kept
    # Two more: over the bound, nothing is remembered and every evaluation is a full check.
    for _ in range(2):
        job = await insert_job(db, "completed")
        await insert_event(db, aggregateid=job)
        jobs.append(job)
    await asyncio.sleep(0.05)
    assert (await incremental(db, tracker, policy)).missing_count == 0
    assert tracker.watermark_ms is None and tracker.provisional_count == 0
    assert tracker.full_checks == 2
    await db.execute("DELETE FROM outbox WHERE aggregateid = $1", jobs[0])
    assert (await incremental(db, tracker, policy)).missing_count == 1  # the full check sees it
    assert tracker.full_checks == 3
    # Back under the bound (two published): incremental again, and it remembers.
    async with db.transaction():
        for job in jobs[1:3]:
            await db.execute("DELETE FROM outbox WHERE aggregateid = $1", job)
            await insert_receipt(db, aggregateid=job)
    assert (await incremental(db, tracker, policy)).missing_count == 1  # the window, once
    assert (await incremental(db, tracker, policy)).missing_count == 1
    assert tracker.full_checks == 4
    assert (tracker.provisional_count, tracker.remembered_count) == (2, 1)
    await db.execute("DELETE FROM outbox WHERE aggregateid = $1", jobs[3])
    assert (await incremental(db, tracker, policy)).missing_count == 2
    assert (await full(db, policy)).missing_count == 2
    assert tracker.full_checks == 4
