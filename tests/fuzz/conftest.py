"""The fuzz tests run against one PostgreSQL server: what they probe does not depend on
its version, and running them once keeps their cost bounded."""

from __future__ import annotations

import pytest

from tests.support.services import REQUIRED, PostgresServer, postgres_servers_from_env

_SERVERS = postgres_servers_from_env()[:1]


@pytest.fixture(scope="session", params=[s.name for s in _SERVERS] or ["none"])
def pg_server(request: pytest.FixtureRequest) -> PostgresServer:
    """The first server the environment names (the Debian one under ``make test``)."""
    if not _SERVERS:
        if REQUIRED:
            pytest.fail("OUTBOX_RELAY_REQUIRE_SERVICES=1 but DATABASE_URL is not set")
        pytest.skip("the fuzz tests need DATABASE_URL")
    return _SERVERS[0]
