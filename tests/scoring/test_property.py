"""Property: over random interleavings of claim, complete, fail, expire, publish and crash
(a rolled-back transaction), every terminal job has exactly one outbox event (pending or
published) under its derived id, and no event exists without its terminal job."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from scoring.errors import ConflictingReplay, ScoringWriteError
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.worker import claim_next_due, enqueue_job, expire_leases, fail_retryable
from scoring.writer import EventDetails, complete_job, fail_job_permanently
from tests.support.scoring_jobs import PUBLISH_SQL

JOBS = ("job-a", "job-b", "job-c")
DETAILS = EventDetails(
    source="urn:scoring-worker", tenant_ref="tenant-a", correlation_ref="corr-1", schema_version="1"
)


@dataclass(frozen=True)
class Claim:
    worker: int


@dataclass(frozen=True)
class Complete:
    worker: int
    job: int
    result: int
    stale: bool


@dataclass(frozen=True)
class FailPermanently:
    worker: int
    job: int
    cause: int
    stale: bool


@dataclass(frozen=True)
class FailRetryable:
    worker: int
    job: int
    stale: bool


@dataclass(frozen=True)
class TimePasses:
    job: int  # that job's lease expires (by the database clock)


@dataclass(frozen=True)
class Sweep:
    pass


@dataclass(frozen=True)
class Publish:
    pass


@dataclass(frozen=True)
class Replay:
    pass  # repeat the last accepted complete/fail call exactly (a retried request)


@dataclass(frozen=True)
class Crash:
    op: Claim | Complete | FailPermanently | FailRetryable  # runs, then its transaction rolls back


@dataclass(frozen=True)
class Race:
    first: Complete | FailPermanently | FailRetryable
    second: Complete | FailPermanently | FailRetryable


workers = st.integers(0, 1)
jobs = st.integers(0, len(JOBS) - 1)
completes = st.builds(Complete, workers, jobs, st.integers(0, 1), st.booleans())
permanent_failures = st.builds(FailPermanently, workers, jobs, st.integers(0, 1), st.booleans())
retryable_failures = st.builds(FailRetryable, workers, jobs, st.booleans())
claims = st.builds(Claim, workers)
finishing = st.one_of(completes, permanent_failures, retryable_failures)
# Branches are drawn uniformly: claims, completions and publishing are repeated so most
# examples reach terminal, published and replayed states.
operations = st.one_of(
    claims,
    completes,
    st.just(Publish()),
    st.just(Replay()),
    claims,
    completes,
    permanent_failures,
    retryable_failures,
    st.builds(TimePasses, jobs),
    st.just(Sweep()),
    st.just(Publish()),
    st.just(Replay()),
    st.builds(Crash, st.one_of(claims, finishing)),
    st.builds(Race, finishing, finishing),
)


RESET_SQL = "TRUNCATE scoring_job_state, outbox, outbox_receipt"
EXPIRE_SQL = """
UPDATE scoring_job_state
SET active_lease_expires_at_unix_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1
WHERE scoring_job_ref = $1 AND scoring_state = 'leased'
"""
LEASED_SQL = (
    "SELECT scoring_job_ref FROM scoring_job_state WHERE scoring_state = 'leased' ORDER BY 1"
)
PUBLISH_OLDEST_SQL = "SELECT id FROM outbox ORDER BY seq LIMIT 1"
SNAPSHOT_SQL = """
SELECT (SELECT coalesce(jsonb_agg(to_jsonb(j) ORDER BY scoring_job_ref), '[]') FROM scoring_job_state j)::text,
       (SELECT coalesce(jsonb_agg(id ORDER BY id), '[]') FROM outbox)::text,
       (SELECT coalesce(jsonb_agg(id ORDER BY id), '[]') FROM outbox_receipt)::text
"""


class Run:
    """Executes operations against two worker connections, remembering each worker's fences."""

    def __init__(self, conns: list[asyncpg.Connection]) -> None:
        self.conns = conns
        self.fences: dict[str, int] = {}
        # The last complete/fail call the writer accepted, with its exact arguments.
        self.last_accepted: Callable[[], Awaitable[object]] | None = None

    async def _job(self, worker: int, job: int) -> str:
        # Mostly a job that is leased now, so outcomes get accepted often enough to
        # reach the interesting states; otherwise any job.
        leased = [r["scoring_job_ref"] for r in await self.conns[worker].fetch(LEASED_SQL)]
        return leased[job % len(leased)] if leased and job < 2 else JOBS[job]

    def _fence(self, job_ref: str, stale: bool) -> int:
        # The latest fence handed out for the job (any worker may hold a copy: a
        # redelivered request), or the one before it (a worker whose lease was superseded).
        fence = self.fences.get(job_ref, 1)
        return max(1, fence - 1) if stale else fence

    async def run(self, op: object) -> None:
        try:
            await self._run(op)
            event(f"accepted {type(op).__name__}")
        except ConflictingReplay:
            raise  # every writer here derives the same content for an outcome: never expected
        except ScoringWriteError as exc:
            event(
                f"refused {type(op).__name__}: {type(exc).__name__}"
            )  # a refusal; the invariant check decides whether it was harmless

    async def _run(self, op: object) -> None:
        match op:
            case Claim(worker):
                claimed = await claim_next_due(
                    self.conns[worker], worker_ref=f"worker-{worker}", lease_ms=60_000
                )
                if claimed is not None:
                    self.fences[claimed.job_ref] = claimed.fencing_token
            case Complete(worker, job, result, stale):
                job_ref = await self._job(worker, job)
                call = functools.partial(
                    complete_job,
                    self.conns[worker],
                    job_ref=job_ref,
                    fencing_token=self._fence(job_ref, stale),
                    result_ref=f"r-{result}",
                    payload={"score": result / 2, "job": job_ref},
                    event=DETAILS,
                )
                await call()
                self.last_accepted = call
            case FailPermanently(worker, job, cause, stale):
                job_ref = await self._job(worker, job)
                call = functools.partial(
                    fail_job_permanently,
                    self.conns[worker],
                    job_ref=job_ref,
                    fencing_token=self._fence(job_ref, stale),
                    cause_code=f"cause_{cause}",
                    event=DETAILS,
                )
                await call()
                self.last_accepted = call
            case FailRetryable(worker, job, stale):
                job_ref = await self._job(worker, job)
                await fail_retryable(
                    self.conns[worker],
                    job_ref=job_ref,
                    fencing_token=self._fence(job_ref, stale),
                    cause_code="timeout",
                    retry_delay_ms=0,
                    event=DETAILS,
                )
            case TimePasses(job):
                await self.conns[0].execute(EXPIRE_SQL, await self._job(0, job))
            case Sweep():
                result = await expire_leases(self.conns[1], limit=10, event=DETAILS)
                assert result.conflicts == ()
            case Replay():
                if self.last_accepted is not None:
                    await self.last_accepted()
            case Publish():
                event_id = await self.conns[0].fetchval(PUBLISH_OLDEST_SQL)
                if event_id is not None:
                    await self.conns[0].execute(PUBLISH_SQL, event_id)
            case Crash(inner):
                conn = self.conns[inner.worker]
                before = await conn.fetchrow(SNAPSHOT_SQL)
                fences = dict(self.fences)
                tr = conn.transaction()
                await tr.start()
                try:
                    await self.run(inner)
                finally:
                    await tr.rollback()
                self.fences = fences  # the claim never happened
                assert await conn.fetchrow(SNAPSHOT_SQL) == before
            case Race(first, second):
                # One connection runs one statement at a time: the second racer is the other worker.
                second = dataclasses.replace(second, worker=1 - first.worker)
                await asyncio.gather(self.run(first), self.run(second))
            case _:
                raise AssertionError(op)


JOB_EVENTS_SQL = """
SELECT j.scoring_job_ref, j.scoring_state, j.result_ref, j.last_failure_code,
       array(SELECT o.id FROM outbox o
             WHERE o.aggregatetype = 'scoring_job' AND o.aggregateid = j.scoring_job_ref
             UNION ALL
             SELECT r.id FROM outbox_receipt r
             WHERE r.aggregatetype = 'scoring_job' AND r.aggregateid = j.scoring_job_ref) AS event_ids
FROM scoring_job_state j
"""
ALL_EVENTS_SQL = "SELECT id FROM outbox UNION ALL SELECT id FROM outbox_receipt"


async def check_invariant(conn: asyncpg.Connection) -> None:
    """Terminal job ⇔ exactly one event, under the id derived from its outcome."""
    expected = set()
    for row in await conn.fetch(JOB_EVENTS_SQL):
        job_ref, state = row["scoring_job_ref"], row["scoring_state"]
        if state == "completed":
            derived = terminal_event_id(job_ref, OutcomeKind.COMPLETED, row["result_ref"])
        elif state == "quarantined":
            derived = terminal_event_id(job_ref, OutcomeKind.FAILED, row["last_failure_code"])
        else:
            assert row["event_ids"] == [], f"{job_ref} is {state} but has an event"
            continue
        assert row["event_ids"] == [derived], f"{job_ref} is {state}: events {row['event_ids']}"
        expected.add(derived)
    assert {r["id"] for r in await conn.fetch(ALL_EVENTS_SQL)} == expected


@settings(
    max_examples=100,
    deadline=None,
    # One database per test, reset at the start of every example (RESET_SQL).
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    max_attempts=st.lists(st.integers(1, 3), min_size=len(JOBS), max_size=len(JOBS)),
    ops=st.lists(operations, min_size=4, max_size=30),
)
async def test_every_terminal_job_has_exactly_one_event(
    db: asyncpg.Connection, db2: asyncpg.Connection, max_attempts: list[int], ops: list[object]
) -> None:
    await db.execute(RESET_SQL)
    for job_ref, budget in zip(JOBS, max_attempts, strict=True):
        await enqueue_job(db, job_ref=job_ref, request_ref=f"req-{job_ref}", max_attempts=budget)
    run = Run([db, db2])
    for op in ops:
        await run.run(op)
        await check_invariant(db)
