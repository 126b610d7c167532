"""Rows the sidecar's probes read, written as the writers and the relay leave them: scoring
jobs in each state, outbox rows and receipts, each with refs recognisable in any output."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import asyncpg

# Recognisable identities: no output of the health surface may ever contain them.
SECRET_MARK = "zq7secret"
_serial = itertools.count(1)


def ref(kind: str) -> str:
    """A unique, recognisable, non-numeric-looking ref."""
    return f"{kind}-{SECRET_MARK}-{next(_serial):05d}"


async def db_now(conn: asyncpg.Connection) -> dt.datetime:
    now: dt.datetime = await conn.fetchval("SELECT clock_timestamp()")
    return now


async def insert_job(
    conn: asyncpg.Connection,
    state: str,
    *,
    job_ref: str | None = None,
    created_at: dt.datetime | None = None,
    updated_at: dt.datetime | None = None,
    lease_expires_at_unix_ms: int | None = None,
) -> str:
    """Insert one scoring job in ``state`` with every column its shape constraint wants."""
    job_ref = job_ref or ref("job")
    values: dict[str, Any] = {
        "scoring_job_ref": job_ref,
        "scoring_request_ref": ref("request"),
        "scoring_state": state,
        "attempt_count": 0,
        "max_attempts": 3,
    }
    if state == "leased":
        values |= {
            "attempt_count": 1,
            "active_worker_ref": ref("worker"),
            "active_lease_ref": ref("lease"),
            "active_fencing_token": 1,
            "active_lease_expires_at_unix_ms": lease_expires_at_unix_ms or 4_102_444_800_000,
        }
    elif state == "retry_scheduled":
        values |= {
            "attempt_count": 1,
            "next_attempt_at_unix_ms": 1_700_000_000_000,
            "last_failure_code": "timeout",
        }
    elif state == "completed":
        values |= {"attempt_count": 1, "result_ref": ref("result"), "completed_fencing_token": 1}
    elif state == "quarantined":
        values |= {"attempt_count": 1, "last_failure_code": "poison"}
    if created_at is not None:
        values["created_at"] = created_at
    if updated_at is not None:
        values["updated_at"] = updated_at
    columns = ", ".join(values)
    params = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await conn.execute(
        f"INSERT INTO scoring_job_state ({columns}) VALUES ({params})", *values.values()
    )
    return job_ref


async def insert_event(
    conn: asyncpg.Connection,
    *,
    aggregateid: str | None = None,
    aggregatetype: str = "scoring_job",
    created_at: dt.datetime | None = None,
    quarantined: bool = False,
    last_error_class: str | None = None,
) -> str:
    """Insert one outbox row the way a writer would, plus the relay's bookkeeping when asked."""
    aggregateid = aggregateid or ref("aggregate")
    event_id = await conn.fetchval(
        """
        INSERT INTO outbox (aggregatetype, aggregateid, type, payload, tenant_ref,
                            correlation_ref, created_at, quarantined_at, last_error_class)
        VALUES ($1, $2, 'scoring.result.completed', $3::jsonb, $4, $5,
                coalesce($6, clock_timestamp()), CASE WHEN $7 THEN clock_timestamp() END, $8)
        RETURNING id
        """,
        aggregatetype,
        aggregateid,
        f'{{"result_ref": "{ref("payload")}"}}',
        ref("tenant"),
        ref("correlation"),
        created_at,
        quarantined,
        last_error_class,
    )
    return str(event_id)


async def insert_receipt(conn: asyncpg.Connection, *, aggregateid: str) -> None:
    """A delivery receipt, as the relay records one when it publishes an event."""
    await conn.execute(
        """
        INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,
                                    kafka_partition, kafka_offset, created_at)
        VALUES (gen_random_uuid(), 'scoring_job', $1, 'scoring.result.completed',
                'outbox.event.scoring_job', 0, 0, clock_timestamp())
        """,
        aggregateid,
    )
