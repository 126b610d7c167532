"""SIGTERM while a connect is stalled: `outbox-relay run` still exits 0 within its drain
timeout (docs/relay.md, "Stopping").

The stalled path is a :class:`FaultProxy` in its stall mode: it accepts every connection
and forwards nothing, the way a path that silently drops everything looks to the client.
Each test puts it in front of one service before the relay starts, waits until the relay
is inside the connect (the proxy accepted its connection), sends SIGTERM and holds the
process to its drain timeout plus a generous margin: a bound for a hang, not a figure of
speed. Before the fix the producer's start (3 s request timeout here), the bootstrap check
after it (10 s) and the database connect (10 s) were awaited to their end first.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from tests.support.faultproxy import FaultProxy, ProxyCounters
from tests.support.processes import RelayProcess, Relays
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

DRAIN_TIMEOUT_MS = 1000
# Seconds from SIGTERM to exit that count as a hang: the drain timeout and a wide margin.
EXIT_BOUND_S = 5.0


def _host_port(url: str) -> str:
    return urlsplit(url).netloc.rpartition("@")[2]


def _through(url: str, address: str) -> str:
    """``url`` with its host:port replaced by ``address``."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{address}"))


def _stalled(upstream: str) -> FaultProxy:
    proxy = FaultProxy(("127.0.0.1", 0), upstream).start()
    proxy.stall()
    return proxy


def _start(relays: Relays, bootstrap: str, **overrides: str) -> RelayProcess:
    return relays.start(
        "stalled",
        bootstrap,
        "--drain-timeout-ms",
        str(DRAIN_TIMEOUT_MS),
        **overrides,
    )


async def _assert_stops_in_time(relay: RelayProcess) -> None:
    relay.terminate()
    took = await relay.exited_within(EXIT_BOUND_S)
    text = relay.log_path.read_text(errors="replace")
    assert took is not None, (
        f"still running {EXIT_BOUND_S} s after SIGTERM "
        f"(drain timeout {DRAIN_TIMEOUT_MS} ms); log: {text[-2000:]}"
    )
    assert relay.process.returncode == 0, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    assert relay.logged("stopping"), text[-2000:]
    assert relay.logs()[-1]["msg"] == "stopped", text[-2000:]


@pytest.mark.parametrize(
    "connections",
    [
        # the producer's own bootstrap connection: producer.start() is waiting
        1,
        # the second: the start timed out and the bootstrap check names the cause
        2,
    ],
    ids=["producer start", "bootstrap check"],
)
async def test_sigterm_while_the_broker_path_stalls_exits_within_the_drain_timeout(
    relays: Relays, kafka_bootstrap: str, connections: int
) -> None:
    with _stalled(kafka_bootstrap) as broker:
        relay = _start(relays, broker.listen)
        await wait_until(lambda: relay.logged("started"), timeout=20, what="the relay started")

        def reached(counters: ProxyCounters) -> bool:
            return counters.accepted >= connections

        await broker.until(reached, timeout=20)
        await anyio.sleep(0.3)  # well inside the connect: each waits 3 s or more for an answer
        assert relay.process.poll() is None
        assert not relay.logged("connected to kafka")
        assert not relay.logged("kafka not reachable, retrying")  # the check is not done
        await _assert_stops_in_time(relay)


async def test_sigterm_while_the_database_path_stalls_exits_within_the_drain_timeout(
    relays: Relays, database_url: str, kafka_bootstrap: str
) -> None:
    with _stalled(_host_port(database_url)) as database:
        relay = _start(
            relays, kafka_bootstrap, DATABASE_URL=_through(database_url, database.listen)
        )
        await wait_until(lambda: relay.logged("started"), timeout=20, what="the relay started")
        await database.until(lambda counters: counters.accepted >= 1, timeout=20)
        await anyio.sleep(1.0)  # inside the relay's connect, which waits 10 s for an answer
        assert relay.process.poll() is None
        await _assert_stops_in_time(relay)


async def test_sigterm_after_the_database_path_stalls_mid_run_exits_within_the_drain_timeout(
    relays: Relays, database_url: str, kafka_bootstrap: str
) -> None:
    # Connected, lanes held, then every packet to PostgreSQL vanishes: the fetch in flight
    # is cut off by the drain deadline, and handing the lanes back (a statement on the
    # same stalled path, with no answer ever) must not hold the exit either.
    upstream = _host_port(database_url)
    with FaultProxy(("127.0.0.1", 0), upstream).start() as database:
        relay = _start(
            relays, kafka_bootstrap, DATABASE_URL=_through(database_url, database.listen)
        )
        await wait_until(lambda: relay.logged("claimed lanes"), timeout=30, what="lanes held")
        await wait_until(lambda: relay.logged("connected to kafka"), timeout=30, what="kafka")
        database.stall()
        await anyio.sleep(0.5)
        assert relay.process.poll() is None
        await _assert_stops_in_time(relay)
        assert relay.logged("could not hand lanes back; they expire on their own")
