"""Fixtures and helpers for the scoring writer's database tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from scoring.writer import EventDetails

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


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
