"""A LISTEN connection that cannot be opened is logged once per change of state, not once
per retry (docs/cli.md: `run` "logs each change of state once"), and once when it recovers.

The relay's own pool and the sidecar use the real database; only ``--listen-database-url``
points at a fault proxy. First the proxy's upstream is a port nothing listens on, so every
connection the relay opens there is accepted and reset at once (the proxy counts them:
the test knows how many retries happened); then a proxy on the same address forwards to
the real server, and the relay listens again; last, that connection is cut.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from tests.support.faultproxy import FaultProxy
from tests.support.ports import free_port
from tests.support.processes import Relays
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

FAILED = "listen connection failed"
RECOVERED = "listen connection reachable again"
LOST = "listen connection lost"
RETRIES = 4  # connection attempts seen failing before the log is counted


def _through(url: str, address: str) -> str:
    """``url`` with its host:port replaced by ``address``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{address}"))


async def test_failing_listen_connection_is_logged_once_per_change_of_state(
    relays: Relays, database_url: str, kafka_bootstrap: str
) -> None:
    listen_at = ("127.0.0.1", free_port())
    nowhere = ("127.0.0.1", free_port())  # nothing listens here
    with FaultProxy(listen_at, nowhere) as refusing:
        relay = relays.start(
            "listen-retry",
            kafka_bootstrap,
            "--listen-database-url",
            _through(database_url, f"{listen_at[0]}:{listen_at[1]}"),
        )
        await refusing.until(lambda counters: counters.refused >= RETRIES, timeout=30)
        assert relay.process.poll() is None
        failed = relay.logged(FAILED)
        assert len(failed) == 1, [entry.get("cause") for entry in failed]
        assert not relay.logged(RECOVERED)

    upstream = urlsplit(database_url).netloc.rpartition("@")[2]
    with FaultProxy(listen_at, upstream) as forwarding:
        await wait_until(
            lambda: relay.logged(RECOVERED), timeout=20, what="the listen connection recovers"
        )
        assert forwarding.counters().open >= 1
        # Listening from here on (keepalives every poll interval): nothing more is said.
        await anyio.sleep(1.0)
        assert len(relay.logged(FAILED)) == 1
        assert len(relay.logged(RECOVERED)) == 1

        # Lost (the keepalive finds it within a poll interval) and at once listening again.
        assert forwarding.cut() >= 1
        await wait_until(
            lambda: len(relay.logged(RECOVERED)) == 2, timeout=20, what="listening again"
        )
        assert len(relay.logged(LOST)) == 1
        assert len(relay.logged(FAILED)) == 1
        assert relay.process.poll() is None
