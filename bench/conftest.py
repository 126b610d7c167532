"""Benchmarks run against the same real services as the tests, one server only."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from bench.peers import measure
from migrations.runner import apply, load_migrations
from tests.support.services import with_database


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not bootstrap:
        pytest.fail("benchmarks need KAFKA_BOOTSTRAP_SERVERS (make bench starts a broker)")
    return bootstrap


@pytest.fixture(scope="session")
def server_url() -> str:
    url = os.environ.get("DATABASE_URL_PG18") or os.environ.get("DATABASE_URL")
    if not url:
        pytest.fail("benchmarks need DATABASE_URL_PG18 or DATABASE_URL (make bench starts them)")
    return url


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, *, up_to: int | None = None) -> AsyncIterator[str]:
    """A fresh database on the server, migrated (up to migration ``up_to`` only, when
    given), dropped afterwards; its URL."""
    name = f"outbox_relay_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    conn = await asyncpg.connect(url)
    await apply(conn, [m for m in load_migrations() if up_to is None or m.version <= up_to])
    await conn.close()
    try:
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest_asyncio.fixture
async def bench_database(server_url: str) -> AsyncIterator[str]:
    """A fresh migrated database, dropped afterwards."""
    async with fresh_database(server_url) as url:
        yield url


BEFORE_THE_DOOR = 8  # the last migration before rows were measured at INSERT (0009)


@pytest_asyncio.fixture
async def database_before_the_door(server_url: str) -> AsyncIterator[str]:
    """A fresh database migrated up to the last migration before the door: rows the door
    refuses go in, as rows stored before an upgrade; the test migrates the rest."""
    async with fresh_database(server_url, up_to=BEFORE_THE_DOOR) as url:
        yield url


class Topics:
    """The topics one benchmark creates; the fixture deletes them when it ends."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.created: list[str] = []

    async def create(self, topic: str, *, log_append_time: bool = False) -> str:
        await measure.create_topic(self.bootstrap, topic, log_append_time=log_append_time)
        self.created.append(topic)
        return topic


@pytest_asyncio.fixture
async def bench_topics(kafka_bootstrap: str) -> AsyncIterator[Topics]:
    """Fresh topics on the broker, deleted afterwards (bench.peers.measure.delete_topics)."""
    topics = Topics(kafka_bootstrap)
    try:
        yield topics
    finally:
        await measure.delete_topics(kafka_bootstrap, topics.created)


# What one drain left behind for its topic: the events in the outbox still, the receipts
# naming the topic, the distinct positions they name, and the topic's end offsets summed.
_RECEIPTS = """
SELECT (SELECT count(*) FROM outbox),
       count(*),
       count(DISTINCT (kafka_partition, kafka_offset))
FROM outbox_receipt WHERE topic = $1
"""


async def assert_delivered(
    conn: asyncpg.Connection, bootstrap: str, topic: str, events: int, *, quarantined: int = 0
) -> None:
    """Correctness, not speed: after a drain, every one of ``events`` is on ``topic`` and
    has its receipt, and only the ``quarantined`` rows are left in the outbox. An empty
    outbox alone would pass a relay that deleted rows without producing them; the broker's
    end offsets and the receipts would not."""
    left, receipts, positions = await conn.fetchrow(_RECEIPTS, topic)
    on_topic = await measure.records_on(bootstrap, topic)
    assert (left, on_topic, receipts, positions) == (quarantined, events, events, events), (
        f"{topic}: {events} events written; {left} left in the outbox, {on_topic} on the "
        f"topic, {receipts} receipts naming {positions} distinct positions"
    )


REPO = Path(__file__).resolve().parents[1]
# The policy deploy/ gives its sidecar: what runs next to the relays where users run them.
DEPLOYED_POLICY = REPO / "deploy" / "base" / "policy.toml"
ALL_FAMILIES_DISABLED = (
    "[outbox]\nenabled = false\n[scoring_jobs]\nenabled = false\n"
    "[completion_outbox]\nenabled = false\n[relay]\nenabled = false\n"
)


class RelayDeployment:
    """The relay as deployed: ``run --relay-only`` next to one health sidecar
    (``run --no-relay`` evaluating every family of the deployed policy) on the same database
    and machine. ``pid`` and ``returncode`` are the relay's, the process the figures measure;
    the sidecar's database work lands in PostgreSQL's share, as it does in production."""

    def __init__(
        self, relay: asyncio.subprocess.Process, sidecar: asyncio.subprocess.Process | None
    ) -> None:
        self.relay = relay
        self.sidecar = sidecar

    @property
    def pid(self) -> int:
        """The relay process's id."""
        return self.relay.pid

    @property
    def returncode(self) -> int | None:
        """The relay process's exit code, None while it runs."""
        return self.relay.returncode

    def terminate(self) -> None:
        """SIGTERM to both, as an orchestrator stops them."""
        for process in (self.relay, self.sidecar):
            if process is not None and process.returncode is None:
                process.terminate()

    async def wait(self) -> int:
        """Wait for both; the relay's exit code."""
        code = await self.relay.wait()
        if self.sidecar is not None:
            await self.sidecar.wait()
        return code


async def start_relay_process(
    database_url: str,
    bootstrap: str,
    namespace: str,
    workdir: Path,
    *,
    source: Path | None = None,
    families_off: bool = False,
    sidecar: bool = True,
    **env: str,
) -> RelayDeployment:
    """The relay in its own process, topics under ``namespace``, from ``source`` (another
    checkout of the project) instead of this one when given.

    By default the deployed shape: ``run --relay-only`` and, unless ``sidecar`` is False (a
    further instance of a scale-out), one ``run --no-relay`` sidecar beside it. With
    ``families_off`` the shape benchmarks judged before it existed, kept as a reported
    figure: one ``run`` with every health family disabled and no sidecar.
    """
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{namespace}.{{aggregatetype}}",
        "HEALTH_LISTEN_ADDR": "127.0.0.1:0",
        **env,
    }
    environment.pop("OUTBOX_RELAY_POLICY", None)
    if families_off:
        policy = workdir / "policy.toml"
        policy.write_text(ALL_FAMILIES_DISABLED)
        relay = await _outbox_relay(
            ["run"], {**environment, "OUTBOX_RELAY_POLICY": str(policy)}, source
        )
        return RelayDeployment(relay, None)
    relay = await _outbox_relay(["run", "--relay-only"], environment, source)
    beside = None
    if sidecar:
        beside = await _outbox_relay(
            ["run", "--no-relay"],
            {**environment, "OUTBOX_RELAY_POLICY": str(DEPLOYED_POLICY)},
            source,
        )
    return RelayDeployment(relay, beside)


async def _outbox_relay(
    argv: list[str], environment: dict[str, str], source: Path | None
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        *argv,
        env=environment,
        # ``-m`` imports from the working directory first: the checkout that runs.
        cwd=source or REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
