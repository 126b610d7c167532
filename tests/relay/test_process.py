"""The relay as operators run it: ``outbox-relay run`` in its own process, killed and stopped."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from tests.support.kafka import read_topic
from tests.support.ports import free_port
from tests.support.processes import POLICY_ALL_DISABLED
from tests.support.relay import INSERT
from tests.support.waiting import wait_until

BATCH = 100
IN_FLIGHT = 2


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY_ALL_DISABLED)
    return path


def _relay_process(
    database_url: str,
    bootstrap: str,
    namespace: str,
    policy: Path,
    instance: str,
    port: int | None = None,
) -> subprocess.Popen[bytes]:
    port = port or free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_RELAY_POLICY": str(policy),
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{namespace}.{{aggregatetype}}",
        "OUTBOX_RELAY_INSTANCE_ID": instance,
        "OUTBOX_RELAY_BATCH_SIZE": str(BATCH),
        "OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES": str(IN_FLIGHT),
        "OUTBOX_RELAY_LEASE_TTL_MS": "3000",
        "OUTBOX_RELAY_LEASE_RENEW_MS": "500",
        "OUTBOX_RELAY_SEND_TIMEOUT_MS": "1500",
        "OUTBOX_RELAY_POLL_INTERVAL_MS": "200",
        "HEALTH_LISTEN_ADDR": f"127.0.0.1:{port}",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "outbox_relay", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()


async def _write(database_url: str, keys: int, per_key: int, pause: float) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        for n in range(1, per_key + 1):
            await conn.executemany(
                INSERT, [("agg", f"k{k}", "t", json.dumps({"n": n})) for k in range(keys)]
            )
            await asyncio.sleep(pause)
    finally:
        await conn.close()


async def _receipts(db: asyncpg.Connection) -> int:
    return int(await db.fetchval("SELECT count(*) FROM outbox_receipt"))


async def _drained(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT count(*) FROM outbox") == 0


def _check_order_and_completeness(records: list, keys: int, per_key: int) -> Counter[bytes]:
    ids: Counter[bytes] = Counter(dict(r.headers)["id"] for r in records)
    seen: dict[bytes, list[int]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        seen.setdefault(record.key, []).append(json.loads(record.value)["n"])
    for k in range(keys):
        firsts = list(dict.fromkeys(seen[f"k{k}".encode()]))
        assert firsts == list(range(1, per_key + 1))
    assert len(ids) == keys * per_key
    return ids


KEYS, PER_KEY = 20, 60


class Stream:
    """One test's relay processes and the event stream they carry (20 keys x 60 events)."""

    def __init__(
        self,
        db: asyncpg.Connection,
        database_url: str,
        bootstrap: str,
        namespace: str,
        policy: Path,
        processes: list[subprocess.Popen[bytes]],
    ) -> None:
        self.db, self.database_url, self.bootstrap = db, database_url, bootstrap
        self.namespace, self.policy, self.processes = namespace, policy, processes
        self.writer: asyncio.Task[None] | None = None

    def start(self, instance: str, port: int | None = None) -> subprocess.Popen[bytes]:
        process = _relay_process(
            self.database_url, self.bootstrap, self.namespace, self.policy, instance, port
        )
        self.processes.append(process)
        return process

    async def write_until_published(self, count: int) -> None:
        """Start the writer and return once ``count`` events have receipts."""
        self.writer = asyncio.create_task(_write(self.database_url, KEYS, PER_KEY, 0.01))
        await wait_until(
            lambda: _over(self.db, count),
            timeout=60,
            what="more events published than the count before",
        )

    async def finish(self) -> Counter[bytes]:
        """Let the writer finish, wait for the drain, check the stream; return id counts."""
        assert self.writer is not None
        await self.writer
        await wait_until(lambda: _drained(self.db), timeout=60, what="the outbox drained")
        records = await read_topic(
            self.bootstrap, f"{self.namespace}.agg", count=KEYS * PER_KEY, settle=1.0
        )
        return _check_order_and_completeness(records, KEYS, PER_KEY)


@pytest.fixture
def stream(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    policy_file: Path,
    processes: list[subprocess.Popen[bytes]],
) -> Stream:
    return Stream(db, database_url, kafka_bootstrap, topic_namespace, policy_file, processes)


async def _over(db: asyncpg.Connection, count: int) -> bool:
    return await _receipts(db) >= count


async def test_kill_9_mid_stream_then_restart_delivers_everything(stream: Stream) -> None:
    first = stream.start("crashing")
    await stream.write_until_published(300)
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    stream.start("after")
    ids = await stream.finish()
    duplicated = [i for i, n in ids.items() if n > 1]
    # Only what was in flight when the process died can be published twice.
    assert len(duplicated) <= BATCH * IN_FLIGHT
    assert all(ids[i] == 2 for i in duplicated)


async def test_sigterm_drains_in_flight_work_and_exits_0(stream: Stream) -> None:
    first = stream.start("stopping")
    await stream.write_until_published(300)
    first.send_signal(signal.SIGTERM)
    code = await asyncio.get_running_loop().run_in_executor(None, first.wait, 15)
    assert code == 0
    # Its lanes were handed back, not left to expire.
    held = await stream.db.fetchval("SELECT count(*) FROM relay_lane WHERE owner_id = 'stopping'")
    assert held == 0
    stream.start("next")
    ids = await stream.finish()
    # Everything acknowledged before the exit was recorded: nothing published twice.
    assert max(ids.values()) == 1


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def test_two_relay_processes_split_lanes_and_take_over_from_a_killed_one(
    stream: Stream,
) -> None:
    db = stream.db
    port_a = free_port()
    stream.start("a", port_a)
    b = stream.start("b")
    await wait_until(
        lambda: db.fetchval(
            "SELECT count(*) FILTER (WHERE owner_id = 'a') = 32 "
            "AND count(*) FILTER (WHERE owner_id = 'b') = 32 FROM relay_lane"
        ),
        timeout=30,
        what="relays a and b hold 32 lanes each",
    )
    await stream.write_until_published(300)
    loop = asyncio.get_running_loop()
    b.send_signal(signal.SIGKILL)
    killed_at = loop.time()
    await wait_until(
        lambda: db.fetchval(
            "SELECT count(*) = 64 FROM relay_lane "
            "WHERE owner_id = 'a' AND lease_expires_at > clock_timestamp()"
        ),
        timeout=30,
        interval=0.05,
        what="relay a holds all 64 lanes",
    )
    takeover = loop.time() - killed_at
    # Bounded by the lease TTL (3 s) plus one renewal round (0.5 s), with slack for CI.
    assert takeover < 3.0 + 0.5 + 1.5
    ids = await stream.finish()
    assert sum(1 for n in ids.values() if n > 1) <= BATCH * IN_FLIGHT
    metrics = await loop.run_in_executor(None, _metrics, port_a)
    assert "outbox_relay_lanes_owned 64.0" in metrics
    published = next(
        line
        for line in metrics.splitlines()
        if line.startswith("outbox_relay_published_events_total ")
    )
    assert float(published.split()[1]) > 0


async def _unix_socket_url(db: asyncpg.Connection, database_url: str) -> str | None:
    """The same database through the server's first Unix socket, if this machine has it
    and the server admits our role on it; None otherwise."""
    directories = str(await db.fetchval("SHOW unix_socket_directories"))
    port = int(await db.fetchval("SHOW port"))
    directory = directories.split(",")[0].strip()
    if not directory:
        return None
    parts = urlsplit(database_url)
    url = urlunsplit(
        parts._replace(
            netloc=parts.netloc.rpartition("@")[0] + "@",
            query=urlencode({"host": directory, "port": port}),
        )
    )
    try:
        probe = await asyncpg.connect(url)
    except OSError:
        return None  # the server is elsewhere (a container): no socket on this machine
    except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError):
        return None  # e.g. Debian's `local ... peer` lines: not our role's login
    await probe.close()
    return url


async def test_the_relay_runs_over_a_unix_socket(stream: Stream) -> None:
    """Where the relay shares the database's host, a socket URL (host in the query, as
    libpq reads it) carries everything and needs no TLS (docs/security.md)."""
    url = await _unix_socket_url(stream.db, stream.database_url)
    if url is None:
        pytest.skip("this server admits no password-less or password login on a socket here")
    stream.database_url = url
    stream.start("socket")
    await stream.write_until_published(KEYS)
    # The relay's own sessions came in over the socket: no client address.
    sessions = await stream.db.fetchrow(
        "SELECT count(*) AS all, count(*) FILTER (WHERE client_addr IS NOT NULL) AS tcp "
        "FROM pg_stat_activity "
        "WHERE application_name = 'outbox-relay' AND datname = current_database()"
    )
    assert sessions["all"] > 0 and sessions["tcp"] == 0
    ids = await stream.finish()
    assert max(ids.values()) == 1
