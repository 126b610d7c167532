"""``outbox-relay demo``: a synthetic scoring workload against the real relay and sidecar.

Workers claim jobs, mostly complete them, sometimes fail them (retryable or permanent),
and one worker dies holding its lease, so the health page shows an expired lease until
the reaper ends it. Every terminal job's event goes through the outbox to Kafka.
"""

from __future__ import annotations

import logging
import random
import uuid

import anyio
import asyncpg

from health.families.completion_outbox import TERMINAL_JOB_WITHOUT_EVENT
from outbox_relay.settings import DemoOptions
from pgconnect import connect
from scoring.errors import ScoringWriteError
from scoring.worker import claim_next_due, enqueue_job, expire_leases, fail_retryable
from scoring.writer import EventDetails, complete_job, fail_job_permanently

log = logging.getLogger("outbox_relay.demo")

LEASE_MS = 4_000
REAPER_EVERY_S = 6.0
PROGRESS_EVERY_S = 2.0

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


def _event(run: str) -> EventDetails:
    return EventDetails(
        source="urn:outbox-relay:demo",
        tenant_ref="tenant-demo",
        correlation_ref=f"run-{run}",
        schema_version="1",
    )


async def run_demo_workload(
    database_url: str | None, options: DemoOptions, stop: anyio.Event
) -> None:
    """Enqueue jobs, run workers and a reaper, report progress; stops with ``stop``."""
    run = uuid.uuid4().hex[:8]
    request_ref = f"demo-{run}"
    jobs, workers = options.jobs, options.workers
    conn = await connect(database_url)
    try:
        for i in range(jobs):
            await enqueue_job(
                conn, job_ref=f"job-{run}-{i:06d}", request_ref=request_ref, max_attempts=3
            )
    finally:
        await conn.close()
    log.info("demo jobs enqueued", extra={"jobs": jobs, "workers": workers, "run": run})
    async with anyio.create_task_group() as tasks:
        for n in range(workers):
            tasks.start_soon(_worker, database_url, f"worker-{run}-{n}", run, stop)
        tasks.start_soon(_dying_worker, database_url, f"worker-{run}-doomed")
        tasks.start_soon(_reaper, database_url, run, stop)
        await _report(database_url, run, request_ref, jobs, stop, options.exit_when_done)
        tasks.cancel_scope.cancel()


async def _worker(database_url: str | None, worker_ref: str, run: str, stop: anyio.Event) -> None:
    rng = random.Random(worker_ref)  # noqa: S311 - synthetic workload, not security
    event = _event(run)
    conn = await connect(database_url)
    try:
        while not stop.is_set():
            job = await claim_next_due(conn, worker_ref=worker_ref, lease_ms=LEASE_MS)
            if job is None:
                await anyio.sleep(0.2)
                continue
            await anyio.sleep(rng.uniform(0.002, 0.03))  # "scoring"
            try:
                await _finish(conn, job.job_ref, job.fencing_token, rng, event)
            except ScoringWriteError as exc:
                # The reaper ended our lease first: the job is someone else's now.
                log.info("demo: outcome refused", extra={"reason": type(exc).__name__})
    finally:
        await conn.close()


async def _finish(
    conn: asyncpg.Connection, job_ref: str, token: int, rng: random.Random, event: EventDetails
) -> None:
    """Mostly complete; sometimes a retryable or a permanent failure."""
    roll = rng.random()
    if roll < 0.90:
        await complete_job(
            conn,
            job_ref=job_ref,
            fencing_token=token,
            result_ref=f"result-{job_ref}",
            payload={"score": round(rng.random(), 4)},
            event=event,
        )
    elif roll < 0.97:
        await fail_retryable(
            conn,
            job_ref=job_ref,
            fencing_token=token,
            cause_code="model_timeout",
            retry_delay_ms=500,
            event=event,
        )
    else:
        await fail_job_permanently(
            conn, job_ref=job_ref, fencing_token=token, cause_code="invalid_features", event=event
        )


async def _dying_worker(database_url: str | None, worker_ref: str) -> None:
    """Claims one job and never finishes it: the dead-worker state health must expose."""
    conn = await connect(database_url)
    try:
        job = await claim_next_due(conn, worker_ref=worker_ref, lease_ms=LEASE_MS)
        if job is not None:
            log.info("demo: a worker died holding a lease; health shows it once it expires")
    finally:
        await conn.close()


async def _reaper(database_url: str | None, run: str, stop: anyio.Event) -> None:
    event = _event(run)
    while not stop.is_set():
        await anyio.sleep(REAPER_EVERY_S)
        conn = await connect(database_url)
        try:
            expiry = await expire_leases(conn, limit=100, event=event)
        finally:
            await conn.close()
        if expiry.rescheduled or expiry.quarantined:
            log.info(
                "demo: expired leases ended",
                extra={
                    "rescheduled": len(expiry.rescheduled),
                    "quarantined": len(expiry.quarantined),
                },
            )


async def _report(
    database_url: str | None,
    run: str,
    request_ref: str,
    jobs: int,
    stop: anyio.Event,
    exit_when_done: bool,
) -> None:
    conn = await connect(database_url)
    try:
        while not stop.is_set():
            active, completed, quarantined, pending, published = await conn.fetchrow(
                _PROGRESS, request_ref, f"job-{run}-%"
            )
            log.info(
                "demo progress",
                extra={
                    "jobs": jobs,
                    "active": active,
                    "completed": completed,
                    "quarantined": quarantined,
                    "events_pending": pending,
                    "events_published": published,
                },
            )
            if active == 0 and pending == 0:
                missing = await conn.fetchval(_MISSING_EVENTS, request_ref)
                log.info(
                    "demo finished: every job is terminal and every event is published",
                    extra={
                        "completed": completed,
                        "quarantined": quarantined,
                        "events_published": published,
                        "terminal_jobs_without_event": missing,
                    },
                )
                if exit_when_done:
                    stop.set()
                return
            with anyio.move_on_after(PROGRESS_EVERY_S):
                await stop.wait()
    except asyncpg.PostgresError:
        log.warning("demo progress query failed")
    finally:
        await conn.close()
