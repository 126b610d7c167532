"""What the fault scenarios share: relay processes, writers that count per key, the topic
read the way a default consumer reads it, and the per-key order check.

Commit order comes from the writers, never from the relay: every event carries its
aggregate's version, bumped under the aggregate's row lock in the event's own transaction,
so within one key the versions 1, 2, 3, … are the commit order.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord

# The sidecar runs beside every relay; no health family matters to these tests.
POLICY_ALL_DISABLED = "".join(
    f"[{family}]\nenabled = false\n"
    for family in ("outbox", "scoring_jobs", "completion_outbox", "relay")
)

# Small leases and timeouts keep every scenario within seconds; each test overrides what
# its fault needs. The relay's own check holds: lease > 2 x renew + send timeout.
FAST_RELAY = {
    "OUTBOX_RELAY_BATCH_SIZE": "100",
    "OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES": "2",
    "OUTBOX_RELAY_LEASE_TTL_MS": "6000",
    "OUTBOX_RELAY_LEASE_RENEW_MS": "500",
    "OUTBOX_RELAY_SEND_TIMEOUT_MS": "3000",
    "OUTBOX_RELAY_POLL_INTERVAL_MS": "200",
    "OUTBOX_RELAY_RETRY_BASE_MS": "100",
    "OUTBOX_RELAY_RETRY_CAP_MS": "1000",
    "OUTBOX_RELAY_DRAIN_TIMEOUT_MS": "3000",
    "OUTBOX_RELAY_LINGER_MS": "1",
}

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, 'changed', $3::jsonb)
"""

# The aggregate the events belong to; a test database gets it on first use.
CREATE_AGGREGATE = """
CREATE TABLE IF NOT EXISTS fault_aggregate (id text PRIMARY KEY, version int NOT NULL)
"""

# Bumping the version takes the aggregate's row lock until commit: writers of one key
# serialise here, which is exactly what the relay's per-key order promise assumes.
BUMP_VERSION = """
INSERT INTO fault_aggregate AS a (id, version) VALUES ($1, 1)
ON CONFLICT (id) DO UPDATE SET version = a.version + 1
RETURNING version
"""

LANE_OF = "SELECT (hashtext($1) & 63)::int"


class OrderViolation(AssertionError):
    """Per-key order broke: the failure the fault scenarios exist to find."""


class DrainOverrun(AssertionError):
    """A stopping relay outlived its drain timeout."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- relays as processes ----------------------------------------------------------------------
@dataclass
class RelayProcess:
    """One ``outbox-relay run`` process; its JSON log lines go to a file the test reads."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    signalled_at: float | None = None
    exited_at: float | None = None

    def __post_init__(self) -> None:
        # Exit time as it happens, not as a poll notices it.
        self._exited = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.process.wait()
        self.exited_at = time.monotonic()
        self._exited.set()

    def logs(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries

    def logged(self, message: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs() if entry.get("msg") == message]

    def terminate(self) -> None:
        self.signalled_at = time.monotonic()
        self.process.send_signal(signal.SIGTERM)

    async def exited_within(self, seconds: float) -> float | None:
        """Seconds from SIGTERM to exit, or None if still running after ``seconds``."""
        assert self.signalled_at is not None
        remaining = self.signalled_at + seconds - time.monotonic()
        if not await asyncio.to_thread(self._exited.wait, max(remaining, 0.0)):
            return None
        assert self.exited_at is not None
        return self.exited_at - self.signalled_at


@dataclass
class Relays:
    """Starts relay processes for one test and kills whatever is left at its end."""

    database_url: str
    namespace: str
    directory: Path
    started: list[RelayProcess] = field(default_factory=list)

    def start(self, name: str, bootstrap: str, *run_args: str, **overrides: str) -> RelayProcess:
        """``outbox-relay run [run_args]``, e.g. ``--no-relay`` for a sidecar alone."""
        policy = self.directory / "policy.toml"
        policy.write_text(POLICY_ALL_DISABLED)
        log_path = self.directory / f"{name}.log"
        env = {
            **os.environ,
            **FAST_RELAY,
            "DATABASE_URL": self.database_url,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "OUTBOX_RELAY_POLICY": str(policy),
            "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{self.namespace}.{{aggregatetype}}",
            "OUTBOX_RELAY_INSTANCE_ID": name,
            "OUTBOX_RELAY_LOG_FORMAT": "json",
            "HEALTH_LISTEN_ADDR": f"127.0.0.1:{free_port()}",
            **overrides,  # a test's own settings win, e.g. a database behind a proxy
        }
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "outbox_relay", "run", *run_args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        relay = RelayProcess(name, process, log_path)
        self.started.append(relay)
        return relay

    def kill_all(self) -> None:
        for relay in self.started:
            if relay.process.poll() is None:
                relay.process.kill()
            relay.process.wait(timeout=30)


def redrive_all(database_url: str) -> str:
    """``outbox-relay redrive --all`` as an operator runs it; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "outbox_relay", "redrive", "--all"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode()


# -- writers ------------------------------------------------------------------------------------
@dataclass
class Writer:
    """Commits events under their aggregate's lock and remembers each key's last version."""

    conn: asyncpg.Connection
    namespace: str
    committed: dict[str, int] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)  # key -> topic its events go to

    async def prepare(self) -> None:
        await self.conn.execute(CREATE_AGGREGATE)

    async def commit(self, *events: tuple[str, str] | tuple[str, str, int]) -> list[int]:
        """One transaction of events (aggregatetype, key[, padding bytes]); their versions."""
        versions: dict[str, int] = {}
        numbers = []
        async with self.conn.transaction():
            for event in events:
                aggregatetype, key = event[0], event[1]
                padding = event[2] if len(event) > 2 else 0
                version = int(await self.conn.fetchval(BUMP_VERSION, key))
                payload = {"n": version, "pad": "x" * padding}
                await self.conn.execute(INSERT, aggregatetype, key, json.dumps(payload))
                versions[key] = version
                numbers.append(version)
                self.topics[key] = f"{self.namespace}.{aggregatetype}"
        self.committed.update(versions)
        return numbers

    def committed_on(self, topic: str) -> dict[str, int]:
        """Each key of ``topic`` with its latest committed version."""
        return {k: n for k, n in self.committed.items() if self.topics[k] == topic}


async def key_in_lanes(conn: asyncpg.Connection, prefix: str, lanes: Iterable[int]) -> str:
    """The first key ``prefix0``, ``prefix1``, … whose lane is one of ``lanes``."""
    wanted = set(lanes)
    for i in range(10_000):
        key = f"{prefix}{i}"
        if await conn.fetchval(LANE_OF, key) in wanted:
            return key
    raise AssertionError("no key found for those lanes")


async def lane_of(conn: asyncpg.Connection, key: str) -> int:
    return int(await conn.fetchval(LANE_OF, key))


async def lane_owner(conn: asyncpg.Connection, lane: int) -> tuple[str | None, int]:
    row = await conn.fetchrow(
        "SELECT owner_id, fence FROM relay_lane WHERE lane = $1 AND "
        "(lease_expires_at IS NULL OR lease_expires_at > clock_timestamp())",
        lane,
    )
    return (None, 0) if row is None else (row["owner_id"], int(row["fence"]))


async def lanes_held(conn: asyncpg.Connection, owner: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM relay_lane WHERE owner_id = $1 "
            "AND lease_expires_at > clock_timestamp()",
            owner,
        )
    )


async def unpublished(conn: asyncpg.Connection, key: str | None = None) -> int:
    """Rows still in the outbox (quarantined ones included), of one key or all."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE $1::text IS NULL OR aggregateid = $1", key
        )
    )


async def published_versions(conn: asyncpg.Connection, key: str) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM outbox_receipt WHERE aggregateid = $1", key)
    )


async def wait_until(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll an (async or sync) predicate until it is truthy; fail naming ``what``."""
    try:
        with anyio.fail_after(timeout):
            while True:
                if await _truthy(predicate()):
                    return
                await anyio.sleep(interval)
    except TimeoutError:
        raise AssertionError(f"not within {timeout} s: {what}") from None


async def _truthy(result: Any) -> bool:
    if asyncio.iscoroutine(result):
        result = await result
    return bool(result)


# -- the topic as a default consumer reads it ------------------------------------------------
async def read_topic(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` up to its current end, read as the docs tell consumers to
    read: a plain consumer with the default isolation level (read_uncommitted)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if partitions is None:
            await consumer._client.force_metadata_update()  # the topic may be new to us
            partitions = consumer.partitions_for_topic(topic) or set()
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        records: list[ConsumerRecord[bytes, bytes]] = []
        deadline = time.monotonic() + 20
        while not await _caught_up(consumer, ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic} to its end")
            for chunk in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(chunk)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        await consumer.stop()


async def _caught_up(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    for tp, end in ends.items():
        if int(await consumer.position(tp)) < end:
            return False
    return True


# -- the check -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Seen:
    """One record of a key as a consumer saw it: the writer's version and the event id."""

    n: int
    id: bytes


def key_histories(records: Iterable[ConsumerRecord[bytes, bytes]]) -> dict[str, list[Seen]]:
    """Each key's records in log order (a key lives in one partition)."""
    histories: dict[str, list[Seen]] = {}
    for record in records:
        assert record.key is not None and record.value is not None
        seen = Seen(json.loads(record.value)["n"], dict(record.headers)["id"])
        histories.setdefault(record.key.decode(), []).append(seen)
    return histories


def order_violations(histories: dict[str, list[Seen]], committed: dict[str, int]) -> list[str]:
    """What breaks the promise, per key: (a) first occurrences (deduplicated by id) not in
    commit order or incomplete; (b) the last record not the latest committed event."""
    problems = []
    for key, latest in sorted(committed.items()):
        seen = histories.get(key, [])
        ids: set[bytes] = set()
        firsts = []
        for record in seen:
            if record.id not in ids:
                ids.add(record.id)
                firsts.append(record.n)
        sequence = [record.n for record in seen]
        if firsts != list(range(1, latest + 1)):
            problems.append(
                f"{key}: first occurrences {firsts}, committed 1..{latest} (topic: {sequence})"
            )
        if not seen or seen[-1].n != latest:
            last = seen[-1].n if seen else None
            problems.append(
                f"{key}: last record is version {last}, latest committed is {latest} "
                f"(topic: {sequence})"
            )
    return problems


def assert_per_key_order(
    records: Iterable[ConsumerRecord[bytes, bytes]], committed: dict[str, int]
) -> dict[str, list[int]]:
    """Raise OrderViolation naming every broken key; return each key's observed versions."""
    histories = key_histories(records)
    problems = order_violations(histories, committed)
    if problems:
        raise OrderViolation("; ".join(problems))
    return {key: [s.n for s in seen] for key, seen in histories.items()}
