"""``outbox-relay demo``: a steady synthetic scoring workload and three failure stories,
staged in turn against this process's own relay and health sidecar.

The workload never fails on its own: workers claim jobs and complete them through the
scoring writer, so every event reaches Kafka and every family stays within bounds. On top
of it the demo stages, one at a time, the failures this product exists to expose (see
:mod:`outbox_relay.demo_stories`): each is announced, left on show once ``/health`` reports
it, then recovered the way an operator would, and the demo waits for the family to be
within bounds again. Without ``--exit-when-done`` the workload goes on until Ctrl-C.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import anyio
import asyncpg

from health.families.completion_outbox import TERMINAL_JOB_WITHOUT_EVENT
from outbox_relay.demo_stories import STORIES, DemoSystem, StoryContext, farewell, stage
from outbox_relay.settings import DemoOptions
from pgconnect import connect
from scoring.errors import ScoringWriteError
from scoring.worker import claim_next_due, enqueue_job
from scoring.writer import EventDetails, complete_job

__all__ = ["DemoSystem", "run_demo_workload"]

log = logging.getLogger("outbox_relay.demo")

# Long enough that a steady worker never loses a job it is scoring; only the stories'
# dead worker lets a lease expire.
LEASE_MS = 30_000
PROGRESS_EVERY_S = 5.0
FINAL_CHECK_EVERY_S = 1.0
# How long the demo waits for every family to be within bounds before its first story.
WARM_UP_S = 120.0

_PROGRESS = """
SELECT count(*) FILTER (WHERE scoring_state IN ('queued', 'leased', 'retry_scheduled')),
       count(*) FILTER (WHERE scoring_state = 'completed'),
       count(*) FILTER (WHERE scoring_state = 'quarantined'),
       (SELECT count(*) FROM outbox
        WHERE aggregatetype = 'scoring_job' AND aggregateid LIKE $2),
       (SELECT count(*) FROM outbox_receipt
        WHERE aggregatetype = 'scoring_job' AND aggregateid LIKE $2)
FROM scoring_job_state WHERE scoring_request_ref = $1
"""

# Terminal jobs of this run with no event, pending or published: must end at zero. The
# rule is health's completion_outbox rule, so the demo and /health cannot disagree.
_MISSING_EVENTS = f"""
SELECT count(*) FROM scoring_job_state AS job
WHERE job.scoring_request_ref = $1
  AND {TERMINAL_JOB_WITHOUT_EVENT}
"""


@dataclass
class _Run:
    """One demo run: its id (in every job ref), request ref and event details."""

    run: str
    options: DemoOptions
    enqueued: int = 0

    @property
    def request_ref(self) -> str:
        return f"demo-{self.run}"

    @property
    def event(self) -> EventDetails:
        return EventDetails(
            source="urn:outbox-relay:demo",
            tenant_ref="tenant-demo",
            correlation_ref=f"run-{self.run}",
            schema_version="1",
        )

    def next_job_ref(self) -> str:
        self.enqueued += 1
        return f"job-{self.run}-{self.enqueued:06d}"


async def run_demo_workload(
    database_url: str | None, options: DemoOptions, system: DemoSystem, stop: anyio.Event
) -> None:
    """The steady workload, the three stories in turn, progress; ends with ``stop``."""
    demo = _Run(uuid.uuid4().hex[:8], options)
    conn = await connect(database_url)
    try:
        for _ in range(options.jobs):
            await _enqueue(conn, demo)
    finally:
        await conn.close()
    log.info(
        "demo jobs enqueued",
        extra={"jobs": options.jobs, "workers": options.workers, "run": demo.run},
    )
    feeding = anyio.Event()  # set: the steady workload stops adding jobs
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(farewell, database_url, system, stop)
        for n in range(options.workers):
            tasks.start_soon(_worker, database_url, f"worker-{demo.run}-{n}", demo, stop)
        tasks.start_soon(_feeder, database_url, demo, stop, feeding)
        tasks.start_soon(_report, database_url, demo, stop)
        context = StoryContext(
            database_url=database_url,
            run=demo.run,
            system=system,
            hold_s=options.story_hold_ms / 1000,
            event=demo.event,
            claim_job=lambda conn, lease_ms: _claim_fresh(conn, demo, lease_ms),
        )
        with anyio.CancelScope() as stories:
            tasks.start_soon(_cancel_when, stop, stories)
            await stage(context, STORIES, warm_up_s=WARM_UP_S)
        if stop.is_set():
            return
        if options.exit_when_done:
            feeding.set()
            await _until_done(database_url, demo, stop)
            stop.set()
            return
        print("\nThe three stories are done; the steady workload goes on. Ctrl-C stops the demo.")
        await stop.wait()


async def _cancel_when(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    await stop.wait()
    scope.cancel()


async def _enqueue(conn: asyncpg.Connection, demo: _Run) -> str:
    job_ref = demo.next_job_ref()
    await enqueue_job(conn, job_ref=job_ref, request_ref=demo.request_ref, max_attempts=3)
    return job_ref


async def _claim_fresh(conn: asyncpg.Connection, demo: _Run, lease_ms: int) -> tuple[str, int]:
    """A job of this run leased to a story's own worker: enqueued and claimed at once.

    The oldest due job is leased, so a story may get a steady job instead of its own;
    either way it holds one lease, which is all a story needs.
    """
    while True:
        await _enqueue(conn, demo)
        job = await claim_next_due(conn, worker_ref=f"worker-{demo.run}-story", lease_ms=lease_ms)
        if job is not None:
            return job.job_ref, job.fencing_token


async def _feeder(
    database_url: str | None, demo: _Run, stop: anyio.Event, feeding: anyio.Event
) -> None:
    """``--rate`` jobs a second until the demo stops (or, bounded, its stories are done)."""
    rate = demo.options.rate  # at least 1 (DemoOptions.rate is Positive)
    conn = await connect(database_url)
    try:
        while not (stop.is_set() or feeding.is_set()):
            for _ in range(rate):
                await _enqueue(conn, demo)
            with anyio.move_on_after(1.0):
                await stop.wait()
    finally:
        await conn.close()


async def _worker(database_url: str | None, worker_ref: str, demo: _Run, stop: anyio.Event) -> None:
    """Claims and completes jobs through the writer, one at a time; never fails one."""
    event = demo.event
    conn = await connect(database_url)
    try:
        while not stop.is_set():
            job = await claim_next_due(conn, worker_ref=worker_ref, lease_ms=LEASE_MS)
            if job is None:
                await anyio.sleep(0.2)
                continue
            await anyio.sleep(0.01)  # "scoring"
            try:
                await complete_job(
                    conn,
                    job_ref=job.job_ref,
                    fencing_token=job.fencing_token,
                    result_ref=f"result-{job.job_ref}",
                    payload={"score": 0.5},
                    event=event,
                )
            except ScoringWriteError as exc:
                log.info("demo: outcome refused", extra={"reason": type(exc).__name__})
    finally:
        await conn.close()


async def _progress(conn: asyncpg.Connection, demo: _Run) -> tuple[int, int, int, int, int]:
    row = await conn.fetchrow(_PROGRESS, demo.request_ref, f"job-{demo.run}-%")
    return row[0], row[1], row[2], row[3], row[4]


async def _report(database_url: str | None, demo: _Run, stop: anyio.Event) -> None:
    """A progress line every few seconds, counts only."""
    conn = await connect(database_url)
    try:
        while not stop.is_set():
            active, completed, quarantined, pending, published = await _progress(conn, demo)
            log.info(
                "demo progress",
                extra={
                    "jobs": demo.enqueued,
                    "active": active,
                    "completed": completed,
                    "quarantined": quarantined,
                    "events_pending": pending,
                    "events_published": published,
                },
            )
            with anyio.move_on_after(PROGRESS_EVERY_S):
                await stop.wait()
    except asyncpg.PostgresError:
        log.warning("demo progress query failed")
    finally:
        await conn.close()


async def _until_done(database_url: str | None, demo: _Run, stop: anyio.Event) -> None:
    """Bounded mode: wait until every job is terminal and every event published."""
    conn = await connect(database_url)
    try:
        while not stop.is_set():
            active, completed, quarantined, pending, published = await _progress(conn, demo)
            if active == 0 and pending == 0:
                missing = await conn.fetchval(_MISSING_EVENTS, demo.request_ref)
                log.info(
                    "demo finished: every job is terminal and every event is published",
                    extra={
                        "jobs": demo.enqueued,
                        "completed": completed,
                        "quarantined": quarantined,
                        "events_published": published,
                        "terminal_jobs_without_event": missing,
                    },
                )
                return
            with anyio.move_on_after(FINAL_CHECK_EVERY_S):
                await stop.wait()
    finally:
        await conn.close()
