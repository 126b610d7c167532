"""Helpers for the scoring writer's database tests: reach a state, read it back."""

from __future__ import annotations

from typing import Any

import asyncpg

from scoring.worker import ClaimedJob, claim_next_due, enqueue_job


async def leased_job(
    conn: asyncpg.Connection,
    job_ref: str = "job-1",
    *,
    max_attempts: int = 3,
    lease_ms: int = 60_000,
) -> ClaimedJob:
    """Queue ``job_ref`` and claim it; it must be the oldest due job."""
    assert await enqueue_job(
        conn, job_ref=job_ref, request_ref=f"req-{job_ref}", max_attempts=max_attempts
    )
    claimed = await claim_next_due(conn, worker_ref="worker-a", lease_ms=lease_ms)
    assert claimed is not None
    assert claimed.job_ref == job_ref
    return claimed


EXPIRE_NOW_SQL = """
UPDATE scoring_job_state
SET active_lease_expires_at_unix_ms = floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint - 1000
WHERE scoring_job_ref = $1 AND scoring_state = 'leased'
"""


async def expire_lease(conn: asyncpg.Connection, job_ref: str) -> None:
    """Move the lease expiry a second into the past by the database clock."""
    assert await conn.execute(EXPIRE_NOW_SQL, job_ref) == "UPDATE 1"


async def job(conn: asyncpg.Connection, job_ref: str = "job-1") -> dict[str, Any]:
    """The job row, with updated_at in unix ms."""
    record = await conn.fetchrow(
        "SELECT *, floor(extract(epoch FROM updated_at) * 1000)::bigint AS updated_at_unix_ms"
        " FROM scoring_job_state WHERE scoring_job_ref = $1",
        job_ref,
    )
    assert record is not None
    return dict(record)


async def events(conn: asyncpg.Connection, job_ref: str | None = None) -> list[dict[str, Any]]:
    """Pending outbox rows (of one job, or all), oldest first."""
    rows = await conn.fetch(
        "SELECT * FROM outbox WHERE $1::text IS NULL OR aggregateid = $1 ORDER BY seq", job_ref
    )
    return [dict(r) for r in rows]


async def receipts(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Delivery receipts (published events)."""
    return [dict(r) for r in await conn.fetch("SELECT * FROM outbox_receipt ORDER BY id")]


PUBLISH_SQL = """
WITH moved AS (DELETE FROM outbox WHERE id = $1 RETURNING *)
INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, kafka_partition,
                            kafka_offset, created_at)
SELECT id, aggregatetype, aggregateid, type, 'outbox.event.' || aggregatetype, 0, seq, created_at
FROM moved
"""


async def publish(conn: asyncpg.Connection, event_id: object) -> None:
    """Do what the relay does on delivery: move the row to outbox_receipt in one statement."""
    assert await conn.execute(PUBLISH_SQL, event_id) == "INSERT 0 1"
