"""A scoring worker process for the soak, on the writer SDK: claim, "score" for a while
holding the lease, then complete (mostly), fail retryably or fail permanently.

``python -m tests.soak.scoring_worker DATABASE_URL WORKER_REF LEASE_MS``. It survives
database restarts and terminated connections by reconnecting; the soak kills some of
these processes with SIGKILL while they hold a lease.
"""

from __future__ import annotations

import asyncio
import random
import sys

import asyncpg

from scoring.errors import ScoringWriteError
from scoring.worker import claim_next_due, fail_retryable
from scoring.writer import EventDetails, complete_job, fail_job_permanently

# What a database restart or a terminated session raises, down to asyncpg's complaint about
# a connection left mid-operation by the one before.
DATABASE_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

EVENT = EventDetails(
    source="urn:outbox-relay:soak",
    tenant_ref="tenant-soak",
    correlation_ref="soak",
    schema_version="1",
)


async def work(url: str, worker_ref: str, lease_ms: int) -> None:
    rng = random.Random(worker_ref)
    conn: asyncpg.Connection | None = None
    while True:
        try:
            if conn is None or conn.is_closed():
                conn = await asyncpg.connect(
                    url, timeout=5, server_settings={"application_name": "soak-worker"}
                )
            job = await claim_next_due(conn, worker_ref=worker_ref, lease_ms=lease_ms)
            if job is None:
                await asyncio.sleep(0.2)
                continue
            await asyncio.sleep(rng.uniform(0.1, 0.4))  # scoring, holding the lease
            roll = rng.random()
            if roll < 0.9:
                await complete_job(
                    conn,
                    job_ref=job.job_ref,
                    fencing_token=job.fencing_token,
                    result_ref=f"result-{job.job_ref}",
                    payload={"score": round(rng.random(), 4)},
                    event=EVENT,
                )
            elif roll < 0.95:
                await fail_retryable(
                    conn,
                    job_ref=job.job_ref,
                    fencing_token=job.fencing_token,
                    cause_code="soak_retryable",
                    retry_delay_ms=200,
                    event=EVENT,
                )
            else:
                await fail_job_permanently(
                    conn,
                    job_ref=job.job_ref,
                    fencing_token=job.fencing_token,
                    cause_code="soak_permanent",
                    event=EVENT,
                )
        except ScoringWriteError:
            continue  # the reaper ended our lease first: the job is someone else's now
        except DATABASE_ERRORS:
            # The database restarted or our session was terminated: connect again.
            if conn is not None:
                conn.terminate()
            conn = None
            await asyncio.sleep(0.5)


if __name__ == "__main__":
    asyncio.run(work(sys.argv[1], sys.argv[2], int(sys.argv[3])))
