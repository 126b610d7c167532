"""Shared fixtures: a real PostgreSQL (each server the environment names), a migrated
template database cloned per test, and a real Kafka broker with a topic namespace per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from migrations.runner import apply, load_migrations
from tests.services import (
    REQUIRED,
    PostgresServer,
    docker_engine_available,
    postgres_servers_from_env,
)

_ENV_SERVERS = postgres_servers_from_env()
_SERVER_IDS = [s.name for s in _ENV_SERVERS] or ["testcontainers"]


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def _containers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.fixture(scope="session", params=_SERVER_IDS)
def pg_server(request: pytest.FixtureRequest, _containers: ExitStack) -> PostgresServer:
    """Each PostgreSQL server the suite runs against (Debian's and 18 under ``make test``)."""
    for server in _ENV_SERVERS:
        if server.name == request.param:
            return server
    if REQUIRED:
        pytest.fail("OUTBOX_RELAY_REQUIRE_SERVICES=1 but DATABASE_URL is not set")
    if not docker_engine_available():
        pytest.skip("no DATABASE_URL and no Docker engine for testcontainers")
    from testcontainers.postgres import PostgresContainer

    container = _containers.enter_context(PostgresContainer("postgres:18", driver=None))
    return PostgresServer("testcontainers", container.get_connection_url())


@pytest.fixture(scope="session")
def kafka_bootstrap(_containers: ExitStack) -> str:
    """A real Kafka broker's bootstrap address."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if bootstrap:
        return bootstrap
    if REQUIRED:
        pytest.fail("OUTBOX_RELAY_REQUIRE_SERVICES=1 but KAFKA_BOOTSTRAP_SERVERS is not set")
    if not docker_engine_available():
        pytest.skip("no KAFKA_BOOTSTRAP_SERVERS and no Docker engine for testcontainers")
    from testcontainers.kafka import KafkaContainer

    container = _containers.enter_context(KafkaContainer().with_kraft())
    return str(container.get_bootstrap_server())


class TemplateDatabases:
    """One migrated template database per server, made on first use, dropped at the end.

    Keyed by the server itself rather than cached by pytest against one ``pg_server``
    fixture: tests/fuzz narrows ``pg_server`` with a fixture of its own, and a template
    cached against that one outlived the switch to the other server
    (tests/foundation/test_fixture_isolation.py).
    """

    def __init__(self) -> None:
        self._made: dict[str, str] = {}  # server URL → template name

    async def on(self, server: PostgresServer) -> str:
        """The template's name on ``server``, migrating it the first time."""
        made = self._made.get(server.url)
        if made is not None:
            return made
        name = f"outbox_relay_tpl_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(server.url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
            try:
                conn = await asyncpg.connect(with_database(server.url, name))
                try:
                    await apply(conn, load_migrations())
                finally:
                    await conn.close()
            except BaseException:
                # never hand out a half-migrated template; the next test tries afresh
                await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                raise
        finally:
            await admin.close()
        self._made[server.url] = name
        return name

    async def drop_all(self) -> None:
        for server_url, name in self._made.items():
            await _drop_database(server_url, name)
        self._made.clear()


@pytest_asyncio.fixture(scope="session")
async def template_databases() -> AsyncIterator[TemplateDatabases]:
    """Every server's template, for the whole session."""
    templates = TemplateDatabases()
    yield templates
    await templates.drop_all()


@pytest_asyncio.fixture(scope="module")
async def template_database(
    pg_server: PostgresServer, template_databases: TemplateDatabases
) -> str:
    """The migrated database on this test's server, used only as a CREATE DATABASE template."""
    return await template_databases.on(pg_server)


async def _scratch_database(server_url: str, template: str) -> str:
    name = f"outbox_relay_t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await admin.close()
    return name


async def _drop_database(server_url: str, name: str) -> None:
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest_asyncio.fixture
async def database_url(pg_server: PostgresServer, template_database: str) -> AsyncIterator[str]:
    """A fresh, fully migrated database for one test."""
    name = await _scratch_database(pg_server.url, template_database)
    yield with_database(pg_server.url, name)
    await _drop_database(pg_server.url, name)


@pytest_asyncio.fixture
async def empty_database_url(pg_server: PostgresServer) -> AsyncIterator[str]:
    """A fresh database with nothing in it (for migration tests)."""
    name = await _scratch_database(pg_server.url, "template0")
    yield with_database(pg_server.url, name)
    await _drop_database(pg_server.url, name)


@pytest_asyncio.fixture
async def db(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to this test's migrated database."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
def topic_namespace() -> str:
    """A unique topic prefix so no test reads another's records."""
    return f"t{uuid.uuid4().hex[:10]}"
