"""Two workers racing on one job (two connections): exactly one terminal outcome, one event."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    StaleLease,
)
from scoring.worker import claim_next_due, enqueue_job, expire_leases
from scoring.writer import (
    Completion,
    CompletionOutcome,
    Enqueue,
    EventDetails,
    FailureOutcome,
    complete_job,
    fail_job_permanently,
)
from tests.support.scoring_jobs import events, expire_lease, job, leased_job

WAITING_ON_LOCK_SQL = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'
"""


async def _wait_until_blocked(observer: asyncpg.Connection) -> None:
    for _ in range(200):
        if await observer.fetchval(WAITING_ON_LOCK_SQL) > 0:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the second writer never waited on the job's row lock")


async def test_two_workers_claiming_the_same_job_one_wins(
    db: asyncpg.Connection, db2: asyncpg.Connection
) -> None:
    await enqueue_job(db, job_ref="job-1", request_ref="req-1", max_attempts=3)
    a, b = await asyncio.gather(
        claim_next_due(db, worker_ref="worker-a", lease_ms=60_000),
        claim_next_due(db2, worker_ref="worker-b", lease_ms=60_000),
    )
    assert [c is not None for c in (a, b)].count(True) == 1
    assert (await job(db))["attempt_count"] == 1


async def test_stale_and_current_worker_racing_to_complete(
    db: asyncpg.Connection, db2: asyncpg.Connection, details: EventDetails
) -> None:
    first = await leased_job(db)
    await expire_lease(db, "job-1")
    await expire_leases(db, limit=1, event=details)
    second = await claim_next_due(db2, worker_ref="worker-b", lease_ms=60_000)
    assert second is not None

    results = await asyncio.gather(
        complete_job(
            db, job_ref="job-1", fencing_token=first.fencing_token, result_ref="r-a", event=details
        ),
        complete_job(
            db2,
            job_ref="job-1",
            fencing_token=second.fencing_token,
            result_ref="r-b",
            event=details,
        ),
        return_exceptions=True,
    )
    # Whichever runs first, the stale fence never wins: refused as stale before the
    # completion, as a conflicting outcome after it.
    assert isinstance(results[0], StaleLease | ConflictingCompletion)
    assert isinstance(results[1], CompletionOutcome)
    row = await job(db)
    assert (row["scoring_state"], row["result_ref"]) == ("completed", "r-b")
    assert [e["aggregateid"] for e in await events(db)] == ["job-1"]


@pytest.mark.parametrize("second_outcome", ["same", "other_result", "failure"])
async def test_racing_outcomes_on_one_lease(
    db: asyncpg.Connection, db2: asyncpg.Connection, details: EventDetails, second_outcome: str
) -> None:
    claimed = await leased_job(db)

    async def second(conn: asyncpg.Connection) -> CompletionOutcome | FailureOutcome:
        if second_outcome == "failure":
            return await fail_job_permanently(
                conn,
                job_ref="job-1",
                fencing_token=claimed.fencing_token,
                cause_code="bad_input",
                event=details,
            )
        result_ref = "r-1" if second_outcome == "same" else "r-2"
        return await complete_job(
            conn,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref=result_ref,
            event=details,
        )

    results = await asyncio.gather(
        complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        ),
        second(db2),
        return_exceptions=True,
    )
    applied = [
        r
        for r in results
        if isinstance(r, CompletionOutcome | FailureOutcome) and r.enqueue is Enqueue.INSERTED
    ]
    assert len(applied) == 1
    for result in results:
        if isinstance(result, BaseException):
            assert isinstance(result, ConflictingCompletion | ConflictingFailure), result
    assert (await job(db))["scoring_state"] in ("completed", "quarantined")
    assert len(await events(db)) == 1


async def test_a_writer_waiting_on_the_row_lock_sees_the_committed_completion(
    db: asyncpg.Connection,
    db2: asyncpg.Connection,
    observer: asyncpg.Connection,
    details: EventDetails,
) -> None:
    claimed = await leased_job(db)
    tr = db.transaction()
    await tr.start()
    winner = await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    same = asyncio.create_task(
        complete_job(
            db2,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        )
    )
    await _wait_until_blocked(observer)  # db2 waits on the row lock db's transaction holds
    assert not same.done()
    await tr.commit()
    late = await same
    assert (winner.completion, winner.enqueue) == (Completion.COMPLETED, Enqueue.INSERTED)
    assert (late.completion, late.enqueue) == (Completion.DUPLICATE, Enqueue.DUPLICATE)
    assert len(await events(db)) == 1


async def test_a_stale_writer_waiting_on_the_lock_is_refused_after_the_commit(
    db: asyncpg.Connection,
    db2: asyncpg.Connection,
    observer: asyncpg.Connection,
    details: EventDetails,
) -> None:
    claimed = await leased_job(db)
    tr = db.transaction()
    await tr.start()
    await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        event=details,
    )
    racing = asyncio.create_task(
        complete_job(
            db2,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        )
    )
    await _wait_until_blocked(observer)
    assert not racing.done()
    await tr.commit()
    with pytest.raises(ConflictingCompletion):
        await racing
    assert len(await events(db)) == 1


async def test_many_workers_many_jobs(database_url: str, details: EventDetails) -> None:
    conns = [await asyncpg.connect(database_url) for _ in range(4)]
    try:
        for n in range(12):
            await enqueue_job(
                conns[0], job_ref=f"job-{n:02d}", request_ref=f"req-{n}", max_attempts=2
            )

        async def work(conn: asyncpg.Connection, name: str) -> int:
            done = 0
            while (
                claimed := await claim_next_due(conn, worker_ref=name, lease_ms=60_000)
            ) is not None:
                await complete_job(
                    conn,
                    job_ref=claimed.job_ref,
                    fencing_token=claimed.fencing_token,
                    result_ref=f"r-{claimed.job_ref}",
                    event=details,
                )
                done += 1
            return done

        counts = await asyncio.gather(*(work(c, f"worker-{i}") for i, c in enumerate(conns)))
        assert sum(counts) == 12
        assert await conns[0].fetchval("SELECT count(*) FROM outbox") == 12
        assert (
            await conns[0].fetchval(
                "SELECT count(*) FROM scoring_job_state WHERE scoring_state = 'completed'"
            )
            == 12
        )
    finally:
        for conn in conns:
            await conn.close()
