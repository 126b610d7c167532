"""Login roles created per test and dropped after it; the PostgreSQL server that speaks TLS."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
import pytest_asyncio

from tests.support.roles import LoginRole, create_login_role, drop_role
from tests.support.services import PostgresServer
from tests.support.tls import service_file

MakeRole = Callable[[str], Awaitable[LoginRole]]


@pytest_asyncio.fixture
async def make_role(database_url: str) -> AsyncIterator[MakeRole]:
    """Create login roles on this test's database; each is dropped when the test ends."""
    admin = await asyncpg.connect(database_url)
    created: list[str] = []

    async def make(label: str) -> LoginRole:
        role = await create_login_role(admin, database_url, label)
        created.append(role.name)
        return role

    try:
        yield make
    finally:
        for name in created:
            await drop_role(admin, name)
        await admin.close()


@pytest.fixture
def tls_server(pg_server: PostgresServer) -> PostgresServer:
    if pg_server.name != "pg-debian":
        pytest.skip("this PostgreSQL build has no TLS support")
    return pg_server


@pytest.fixture
def ca() -> str:
    return service_file("PG_TEST_CAFILE")
