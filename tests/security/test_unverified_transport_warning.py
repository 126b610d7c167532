"""Transport without certificate verification, as ``outbox-relay run`` meets it against the
real services: one warning line at start and a gauge per path; none for a Unix socket or
loopback addresses; a refusal to start under ``--require-verified-transport``.

The test servers listen on loopback only, so the relay reaches them through a TCP proxy
bound to this machine's own non-loopback address: a real PostgreSQL and a real broker,
over a path the relay cannot tell from a remote one.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from tests.security.process import Service, policy_file
from tests.support.cli import cli_env, run_cli
from tests.support.faultproxy import FaultProxy
from tests.support.processes import POLICY_ALL_DISABLED

WARNING = "connections without certificate verification"
GAUGE = "outbox_relay_unverified_transport"


def own_address() -> str:
    """This machine's address on its default route (no packet is sent), or skip."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2: only picks the route
        except OSError:
            pytest.skip("this machine has no route off loopback")
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        pytest.skip("this machine has no address off loopback")
    return address


@pytest.fixture
def proxies() -> Iterator[list[FaultProxy]]:
    started: list[FaultProxy] = []
    yield started
    for proxy in started:
        proxy.close()


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


def through(proxies: list[FaultProxy], upstream: tuple[str, int]) -> tuple[str, int]:
    """A proxy on this machine's own non-loopback address to ``upstream``."""
    proxy = FaultProxy((own_address(), 0), upstream).start()
    proxies.append(proxy)
    return proxy.address


def with_host(url: str, host: str, port: int) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}:{port}"))


def relay_env(
    database_url: str, bootstrap: str, namespace: str, tmp_path: Path, **more: str
) -> dict[str, str]:
    return cli_env(
        DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        OUTBOX_RELAY_POLICY=policy_file(tmp_path, POLICY_ALL_DISABLED),
        OUTBOX_RELAY_TOPIC_TEMPLATE=f"{namespace}.{{aggregatetype}}",
        **more,
    )


def gauges(service: Service) -> dict[str, float]:
    status, body = service.get("/metrics")
    assert status == 200
    return {
        line.split('path="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith(f"{GAUGE}{{")
    }


def wait_ready(service: Service) -> None:
    service.wait_for_line(lambda line: '"connected to kafka"' in line)
    service.wait_for_line(lambda line: '"claimed lanes"' in line)


def postgres_and_kafka_through_proxies(
    database_url: str, kafka_bootstrap: str, proxies: list[FaultProxy]
) -> tuple[str, str]:
    parts = urlsplit(database_url)
    pg_host, pg_port = through(proxies, (parts.hostname or "127.0.0.1", parts.port or 5432))
    kafka_host, _, kafka_port = kafka_bootstrap.split(",")[0].rpartition(":")
    broker_host, broker_port = through(proxies, (kafka_host, int(kafka_port)))
    return with_host(database_url, pg_host, pg_port), f"{broker_host}:{broker_port}"


async def test_run_warns_once_for_an_unverified_tcp_path_and_exports_it(
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    proxies: list[FaultProxy],
    services: list[Service],
) -> None:
    url, bootstrap = postgres_and_kafka_through_proxies(database_url, kafka_bootstrap, proxies)
    service = Service(relay_env(url, bootstrap, topic_namespace, tmp_path))
    services.append(service)
    wait_ready(service)  # it works, over TCP off loopback, through both proxies

    warnings = [line for line in service.lines if WARNING in line]
    assert len(warnings) == 1, service.lines
    warning = json.loads(warnings[0])
    assert warning["level"] == "warning"
    assert warning["postgres_transport"] == "sslmode prefer over TCP (--database-url)"
    assert warning["kafka_transport"] == "PLAINTEXT, no TLS"
    assert gauges(service) == {"postgres": 1.0, "kafka": 1.0}
    assert all(proxy.counters().accepted > 0 for proxy in proxies)
    assert service.stop() == 0
    everything = "\n".join(service.lines)
    password = urlsplit(database_url).password
    assert password and f":{password}@" not in everything
    assert own_address() not in everything  # no host either, let alone a URL


async def test_run_over_loopback_tcp_does_not_warn(
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    services: list[Service],
) -> None:
    if urlsplit(database_url).hostname not in ("127.0.0.1", "localhost", "::1"):
        pytest.skip("the test server is not on a loopback address here")
    service = Service(relay_env(database_url, kafka_bootstrap, topic_namespace, tmp_path))
    services.append(service)
    wait_ready(service)
    assert not [line for line in service.lines if WARNING in line]
    assert gauges(service) == {"postgres": 0.0, "kafka": 0.0}


async def _socket_url(db: asyncpg.Connection, database_url: str) -> str | None:
    """The test's database through the server's Unix socket, if this role may log in
    there (a trust or password line); None otherwise."""
    directories = str(await db.fetchval("SHOW unix_socket_directories"))
    directory = directories.split(",")[0].strip()
    if not directory:
        return None
    parts = urlsplit(database_url)
    port = int(await db.fetchval("SHOW port"))
    url = urlunsplit(
        parts._replace(
            netloc=parts.netloc.rpartition("@")[0] + "@",
            query=f"host={directory}&port={port}",
        )
    )
    try:
        probe = await asyncpg.connect(url)
    except OSError:
        return None
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError):
        return None
    await probe.close()
    return url


async def test_run_over_a_unix_socket_does_not_warn(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    services: list[Service],
) -> None:
    url = await _socket_url(db, database_url)
    if url is None:
        # Debian's cluster admits sockets by peer authentication only: the OS user's own
        # role, which these shared servers do not have for the user the tests run as.
        pytest.skip("this server admits no role of the tests' on its Unix socket")
    service = Service(relay_env(url, kafka_bootstrap, topic_namespace, tmp_path))
    services.append(service)
    wait_ready(service)
    assert not [line for line in service.lines if WARNING in line]
    assert gauges(service) == {"postgres": 0.0, "kafka": 0.0}
    sessions = await db.fetchrow(
        "SELECT count(*) AS all, count(*) FILTER (WHERE client_addr IS NOT NULL) AS tcp "
        "FROM pg_stat_activity "
        "WHERE application_name = 'outbox-relay' AND datname = current_database()"
    )
    assert sessions["all"] > 0 and sessions["tcp"] == 0  # it really came in over the socket


@pytest.mark.parametrize("how", ["flag", "variable"])
async def test_require_verified_transport_refuses_to_start(
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    proxies: list[FaultProxy],
    how: str,
) -> None:
    url, bootstrap = postgres_and_kafka_through_proxies(database_url, kafka_bootstrap, proxies)
    env = relay_env(url, bootstrap, topic_namespace, tmp_path)
    args = ["run", "--listen", "127.0.0.1:0"]
    if how == "flag":
        args.append("--require-verified-transport")
    else:
        env["OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT"] = "1"

    result = await run_cli(*args, env=env, timeout=60)

    assert result.code == 2, result
    (line,) = result.stderr_lines
    assert line.startswith("outbox-relay: error: --require-verified-transport: ")
    assert "sslmode prefer" in line and "PLAINTEXT" in line
    password = urlsplit(database_url).password
    assert password and f":{password}@" not in result.output
    assert own_address() not in result.output
    assert all(proxy.counters().accepted == 0 for proxy in proxies)  # nothing connected
