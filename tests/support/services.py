"""The real services the suite runs against, as fixtures (a pytest plugin: tests/conftest.py
loads it), and the ``services`` marker they put on every test that uses them.

Where the services come from, in order: the environment (``DATABASE_URL``,
``DATABASE_URL_PG18``, ``KAFKA_BOOTSTRAP_SERVERS``, ``DATABASE_URL_PGBOUNCER``: ``make test``
starts the services with ``python -m scripts.services up`` and sources the
``.services/env`` it writes), then testcontainers where a Docker engine answers. Under
``OUTBOX_RELAY_REQUIRE_SERVICES=1`` a missing service fails the test instead of skipping it.

PostgreSQL: a migrated template database per server, cloned for each test. Kafka: a topic
namespace per test. A test that uses any of the service fixtures, directly or through
another fixture, is marked ``services``; ``make check`` leaves those out. Tests that start
services of their own carry the marker themselves. Nothing under tests/unit may need one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import pytest_asyncio

from migrations.runner import apply, load_migrations

REQUIRED = os.environ.get("OUTBOX_RELAY_REQUIRE_SERVICES") == "1"

# Fixtures that reach a real service; every fixture that needs one depends on one of these.
SERVICE_FIXTURES = frozenset({"pg_server", "kafka_bootstrap", "pgbouncer"})
# Test folders whose tests never need a service.
WITHOUT_SERVICES = ("tests/unit",)


# -- finding the services ----------------------------------------------------------------------
@dataclass(frozen=True)
class PostgresServer:
    name: str
    url: str


def postgres_servers_from_env() -> list[PostgresServer]:
    servers = []
    for name, var in (("pg-debian", "DATABASE_URL"), ("pg18", "DATABASE_URL_PG18")):
        url = os.environ.get(var)
        if url:
            servers.append(PostgresServer(name, url))
    return servers


def docker_engine_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def missing(what: str, how: str) -> None:
    """Skip the test for want of a service, or fail it where services are required."""
    if REQUIRED:
        pytest.fail(f"OUTBOX_RELAY_REQUIRE_SERVICES=1 but {what}")
    pytest.skip(f"{what} ({how})")


# -- databases ----------------------------------------------------------------------------------
def with_database(url: str, database: str) -> str:
    """``url`` naming another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


async def scratch_database(server_url: str, template: str) -> str:
    """A new database made from ``template``; its name."""
    name = f"outbox_relay_t_{uuid.uuid4().hex[:16]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    finally:
        await admin.close()
    return name


async def drop_database(server_url: str, name: str) -> None:
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


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
            await drop_database(server_url, name)
        self._made.clear()


# -- the marker (declared in pyproject.toml) ------------------------------------------------------
@pytest.hookimpl(tryfirst=True)  # before -m selects by it
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    for item in items:
        if SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)
        if item.get_closest_marker("services") is not None:
            where = Path(item.path).relative_to(config.rootpath).as_posix()
            if where.startswith(tuple(f"{folder}/" for folder in WITHOUT_SERVICES)):
                misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError(
            f"needs a service but sits in {', '.join(WITHOUT_SERVICES)} (move it to its "
            f"component's folder): {', '.join(misplaced)}"
        )


# -- the fixtures ---------------------------------------------------------------------------------
_ENV_SERVERS = postgres_servers_from_env()
_SERVER_IDS = [s.name for s in _ENV_SERVERS] or ["testcontainers"]


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


@dataclass(frozen=True)
class PgBouncer:
    """A PgBouncer in transaction pooling mode and the PostgreSQL server behind it."""

    pooled_url: str  # through PgBouncer
    direct_url: str  # the server it fronts


@pytest.fixture(scope="session")
def pgbouncer() -> PgBouncer:
    """``DATABASE_URL_PGBOUNCER`` (``python -m scripts.services`` starts it in front of
    ``DATABASE_URL``'s server, passing every database name through)."""
    how = "start it with: python -m scripts.services up pgbouncer"
    for variable in ("DATABASE_URL_PGBOUNCER", "DATABASE_URL"):
        if not os.environ.get(variable):
            missing(f"{variable} is not set: no PgBouncer to test through", how)
    return PgBouncer(os.environ["DATABASE_URL_PGBOUNCER"], os.environ["DATABASE_URL"])


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


@pytest_asyncio.fixture
async def database_url(pg_server: PostgresServer, template_database: str) -> AsyncIterator[str]:
    """A fresh, fully migrated database for one test."""
    name = await scratch_database(pg_server.url, template_database)
    yield with_database(pg_server.url, name)
    await drop_database(pg_server.url, name)


@pytest_asyncio.fixture
async def empty_database_url(pg_server: PostgresServer) -> AsyncIterator[str]:
    """A fresh database with nothing in it (for migration tests)."""
    name = await scratch_database(pg_server.url, "template0")
    yield with_database(pg_server.url, name)
    await drop_database(pg_server.url, name)


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
