"""A real PgBouncer in transaction pooling mode in front of the suite's PostgreSQL.

``DATABASE_URL_PGBOUNCER`` names it (``python -m scripts.services`` starts it in front of
``DATABASE_URL``'s server, passing every database name through). Without it these tests
skip, or fail under ``OUTBOX_RELAY_REQUIRE_SERVICES=1``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest
import pytest_asyncio

from migrations.runner import apply, load_migrations
from tests.conftest import with_database
from tests.services import REQUIRED

_HOW = "start it with: python -m scripts.services up pgbouncer"


def _service_url(variable: str) -> str:
    url = os.environ.get(variable)
    if url:
        return url
    if REQUIRED:
        pytest.fail(f"OUTBOX_RELAY_REQUIRE_SERVICES=1 but {variable} is not set ({_HOW})")
    pytest.skip(f"{variable} is not set: no PgBouncer to test through ({_HOW})")


@dataclass(frozen=True)
class PooledDatabase:
    """One scratch database, reached directly and through PgBouncer."""

    direct: str
    pooled: str


@pytest_asyncio.fixture
async def unmigrated_behind_pgbouncer() -> AsyncIterator[PooledDatabase]:
    """An empty scratch database on the server PgBouncer fronts."""
    pooled_server = _service_url("DATABASE_URL_PGBOUNCER")
    direct_server = _service_url("DATABASE_URL")
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
