"""Fixtures and helpers for the scoring writer's database tests."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from scoring.worker import ClaimedJob
from scoring.writer import CompletionOutcome, EventDetails, complete_job
from tests.support.scoring_jobs import leased_job

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

CompleteClaimed = functools.partial[Coroutine[Any, Any, CompletionOutcome]]
"""``complete_job`` bound to job-1, the claimed fence, result r-1 and ``details``."""


@pytest.fixture
def details() -> EventDetails:
    """Event details as a scoring worker would pass them."""
    return EventDetails(
        source="urn:scoring-worker",
        tenant_ref="tenant-a",
        correlation_ref="corr-1",
        causation_ref="req-1",
        schema_version="1",
        traceparent=TRACEPARENT,
    )


@pytest_asyncio.fixture
async def claimed(db: asyncpg.Connection) -> ClaimedJob:
    """job-1, queued and claimed by worker-a on ``db``."""
    return await leased_job(db)


@pytest.fixture
def complete_claimed(
    db: asyncpg.Connection, claimed: ClaimedJob, details: EventDetails
) -> CompleteClaimed:
    """Complete the claimed job-1 on ``db`` with result r-1; keywords override any argument."""
    return functools.partial(
        complete_job,
        db,
        job_ref=claimed.job_ref,
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        event=details,
    )


@pytest_asyncio.fixture
async def db2(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A second connection to the same test database (a second worker)."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest_asyncio.fixture
async def observer(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A third connection that only watches (pg_stat_activity), never takes part."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()
