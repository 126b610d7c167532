"""A real PgBouncer in transaction pooling mode in front of the suite's PostgreSQL.

The ``pgbouncer`` fixture (tests/support/services.py) finds it: without one these tests
skip, or fail under ``OUTBOX_RELAY_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest_asyncio

from migrations.runner import apply, load_migrations
from tests.support.services import PgBouncer, with_database


@dataclass(frozen=True)
class PooledDatabase:
    """One scratch database, reached directly and through PgBouncer."""

    direct: str
    pooled: str


@pytest_asyncio.fixture
async def unmigrated_behind_pgbouncer(pgbouncer: PgBouncer) -> AsyncIterator[PooledDatabase]:
    """An empty scratch database on the server PgBouncer fronts."""
    pooled_server, direct_server = pgbouncer.pooled_url, pgbouncer.direct_url
    name = f"outbox_relay_pgb_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(direct_server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield PooledDatabase(with_database(direct_server, name), with_database(pooled_server, name))
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest_asyncio.fixture
async def behind_pgbouncer(
    unmigrated_behind_pgbouncer: PooledDatabase,
) -> PooledDatabase:
    """A migrated scratch database (migrated directly: migrate needs a session)."""
    conn = await asyncpg.connect(unmigrated_behind_pgbouncer.direct)
    try:
        await apply(conn, load_migrations())
    finally:
        await conn.close()
    return unmigrated_behind_pgbouncer
