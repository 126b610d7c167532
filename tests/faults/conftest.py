"""Fixtures of the fault scenarios: proxied Kafka paths, relay processes, counting writers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.kafka_paths import ROUTES_VARIABLE, routes_from_env, started_proxies
from tests.support.order import Writer
from tests.support.processes import Relays
from tests.support.services import REQUIRED


@pytest.fixture
def kafka_proxies(kafka_bootstrap: str) -> Iterator[list[FaultProxy]]:
    """A started fault proxy on every route of KAFKA_PROXY_ROUTES, each one relay's path."""
    routes = routes_from_env()
    if not routes:
        reason = (
            f"{ROUTES_VARIABLE} is not set: no broker listener advertises a proxy address "
            "(python -m scripts.services sets it up)"
        )
        if REQUIRED:
            pytest.fail(f"OUTBOX_RELAY_REQUIRE_SERVICES=1 but {reason}")
        pytest.skip(reason)
    with started_proxies(routes) as proxies:
        yield proxies


@pytest.fixture
def relays(database_url: str, topic_namespace: str, tmp_path: Path) -> Iterator[Relays]:
    """Relay processes of this test; whatever still runs at its end is killed."""
    started = Relays(database_url, topic_namespace, tmp_path)
    yield started
    started.kill_all()


@pytest.fixture
async def writer(database_url: str, topic_namespace: str) -> AsyncIterator[Writer]:
    """A writer that commits events under their aggregate's lock, counting per key."""
    conn = await asyncpg.connect(database_url)
    events = Writer(conn, topic_namespace)
    await events.prepare()
    yield events
    await conn.close()
