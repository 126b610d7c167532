"""`outbox-relay run` starts while PostgreSQL and the broker are unreachable, says so, and
recovers once they answer.

Nothing listens at first on the addresses the process is given (a free port for PostgreSQL,
a proxied broker listener's advertised port for Kafka): from the process' side that is a
server that is down. Then a proxy starts on each address, forwarding to the real servers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.http import get
from tests.support.kafka_paths import ROUTES_VARIABLE, routes_from_env
from tests.support.ports import free_port
from tests.support.processes import Relays
from tests.support.services import REQUIRED
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

_OUTBOX_ONLY = """
[outbox]
max_pending_count = 1000
max_pending_age_ms = 60000
max_quarantined_count = 0
gates_readiness = true

[scoring_jobs]
enabled = false

[completion_outbox]
enabled = false

[relay]
enabled = false
"""


def _behind(url: str, port: int) -> tuple[str, str]:
    """The URL with its host:port replaced by 127.0.0.1:port, and the original host:port."""
    parts = urlsplit(url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    moved = parts._replace(netloc=f"{userinfo}@127.0.0.1:{port}")
    return urlunsplit(moved), hostport


async def _health(address: tuple[str, int]) -> tuple[int, dict[str, Any]]:
    reply = await get(address, "/health")
    return reply.status, json.loads(reply.body)


def _outbox_verdict(report: dict[str, Any]) -> str:
    return str(report["checks"]["outbox:classification"][0]["classification"])


async def test_run_starts_without_database_and_broker_and_recovers(
    database_url: str, relays: Relays, tmp_path: Path
) -> None:
    routes = routes_from_env()
    if not routes:
        reason = f"{ROUTES_VARIABLE} is not set (python -m scripts.services sets it up)"
        if REQUIRED:
            pytest.fail(f"OUTBOX_RELAY_REQUIRE_SERVICES=1 but {reason}")
        pytest.skip(reason)
    route = routes[-1]
    pg_port = free_port()
    relay_url, pg_upstream = _behind(database_url, pg_port)
    health_port = free_port()
    policy = tmp_path / "outbox-only.toml"
    policy.write_text(_OUTBOX_ONLY)
    relay = relays.start(
        "cold",
        route.listen,
        DATABASE_URL=relay_url,
        HEALTH_LISTEN_ADDR=f"127.0.0.1:{health_port}",
        OUTBOX_RELAY_POLICY=str(policy),
    )
    address = ("127.0.0.1", health_port)

    async def live() -> bool:
        try:
            return (await get(address, "/livez")).status == 200
        except OSError:
            return False

    # Before: the process exited 2 at once ("cannot connect to ...").
    await wait_until(live, timeout=20, what="/livez answers 200 while nothing is reachable")
    assert relay.process.poll() is None
    assert (await get(address, "/readyz")).status == 503
    status, report = await _health(address)
    assert status == 503
    assert _outbox_verdict(report) == "unknown"
    await wait_until(
        lambda: relay.logged("relay database unavailable, retrying with back-off"),
        timeout=15,
        what="the relay says the database is unavailable",
    )

    with (
        FaultProxy(("127.0.0.1", pg_port), pg_upstream),
        FaultProxy(route.listen, route.upstream),
    ):

        async def ready() -> bool:
            return (await get(address, "/readyz")).status == 200

        await wait_until(ready, timeout=60, what="/readyz 200 once both servers answer")
        status, report = await _health(address)
        assert status == 200
        assert _outbox_verdict(report) == "within_bounds"
        assert relay.process.poll() is None

    # One line per change of state, not one per retry.
    assert len(relay.logged("relay database unavailable, retrying with back-off")) == 1
    assert len(relay.logged("relay database reachable again")) == 1
