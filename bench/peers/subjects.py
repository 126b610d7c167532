"""The systems under comparison, behind one shape so one measurement code serves them all.

A subject is prepared (its database, slot, topic namespace), loaded with a backlog while it
is stopped, started, fed single events while it runs, and stopped. The relay and Debezium read
the backlog from PostgreSQL; the raw aiokafka producer sends the same records from memory,
the upper bound a relay could reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path
from typing import Protocol

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from bench.deployment import RelayDeployment, start_relay_process
from bench.peers import debezium
from bench.peers.workload import (
    DRAIN_AGGREGATE,
    LATENCY_AGGREGATE,
    OutboxWriters,
    fill_backlog,
    raw_record,
    utc_stamp,
)
from migrations.runner import apply, load_migrations
from tests.support.services import with_database

RAW_IN_FLIGHT = 4000  # send() futures awaited in groups, as an application would bound them


class Subject(Protocol):
    """What the measurement code needs from a system under comparison."""

    name: str
    namespace: str

    async def prepare(self) -> None: ...
    async def load_backlog(self, events: int) -> None: ...
    async def start(self) -> None: ...
    def alive(self) -> bool: ...
    async def emit(self, lane: int, n: int) -> str: ...
    def peak_rss_mb(self) -> float | None: ...
    def client_pid(self) -> int | None: ...
    async def stop(self) -> None: ...
    async def cleanup(self) -> None: ...


def topic_of(subject: Subject, aggregate: str) -> str:
    """Where a subject publishes an aggregate's events (the relay's default routing)."""
    return f"{subject.namespace}.{aggregate}"


class OutboxSubject:
    """A system that reads our outbox table, in a PostgreSQL database of its own."""

    name = "outbox"

    def __init__(self, server_url: str, workdir: Path, lanes: int) -> None:
        self.namespace = f"p{uuid.uuid4().hex[:10]}"
        self._server_url = server_url
        self._database = f"outbox_relay_peer_{self.namespace}"
        self.database_url = with_database(server_url, self._database)
        self.workdir = workdir / self.namespace
        self._lanes = lanes
        self._writers: OutboxWriters | None = None

    async def prepare(self) -> None:
        """A fresh migrated database: the same outbox table every reader reads."""
        self.workdir.mkdir(parents=True)
        admin = await asyncpg.connect(self._server_url)
        try:
            await admin.execute(f'CREATE DATABASE "{self._database}"')
        finally:
            await admin.close()
        conn = await asyncpg.connect(self.database_url)
        try:
            await apply(conn, load_migrations())
        finally:
            await conn.close()

    async def load_backlog(self, events: int) -> None:
        """Commit the backlog while the system is stopped."""
        await fill_backlog(self.database_url, DRAIN_AGGREGATE, events)

    async def emit(self, lane: int, n: int) -> str:
        """Commit one event (writer connections opened on first use)."""
        if self._writers is None:
            self._writers = await OutboxWriters(self.database_url, self._lanes).__aenter__()
        return await self._writers.emit(lane, n)

    async def cleanup(self) -> None:
        """Close the writers and drop the database."""
        if self._writers is not None:
            await self._writers.__aexit__(None, None, None)
            self._writers = None
        admin = await asyncpg.connect(self._server_url)
        try:
            await self.before_drop(admin)
            await admin.execute(f'DROP DATABASE IF EXISTS "{self._database}" WITH (FORCE)')
        finally:
            await admin.close()

    async def before_drop(self, admin: asyncpg.Connection) -> None:
        """Hook: release what would keep the database (a replication slot)."""


class RelaySubject(OutboxSubject):
    """The relay as deployed (``run --relay-only`` beside one ``run --no-relay``), at its defaults."""

    name = "relay"

    def __init__(self, server_url: str, bootstrap: str, workdir: Path) -> None:
        super().__init__(server_url, workdir, lanes=4)
        self._bootstrap = bootstrap
        self._process: RelayDeployment | None = None

    async def start(self) -> None:
        """Start the relay as deployed (run --relay-only beside one sidecar), topics under the namespace."""
        self._process = await start_relay_process(
            self.database_url, self._bootstrap, self.namespace, self.workdir
        )

    def alive(self) -> bool:
        """The relay process still runs."""
        return self._process is not None and self._process.returncode is None

    def peak_rss_mb(self) -> float | None:
        """The relay process' peak resident set."""
        return debezium.peak_rss_mb(self._process.pid if self._process else None)

    def client_pid(self) -> int | None:
        """The relay process."""
        return self._process.pid if self._process else None

    async def stop(self) -> None:
        """SIGTERM and wait, as an orchestrator stops it."""
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()


class DebeziumSubject(OutboxSubject):
    """Debezium's PostgreSQL connector + outbox EventRouter on Kafka Connect standalone."""

    def __init__(
        self, server_url: str, bootstrap: str, workdir: Path, *, poll_ms: int, rest_port: int
    ) -> None:
        super().__init__(server_url, workdir, lanes=4)
        self.name = f"debezium-poll{poll_ms}ms"
        self._bootstrap = bootstrap
        self._poll_ms = poll_ms
        self._rest_port = rest_port
        self._slot = f"outbox_bench_{self.namespace}"
        self._worker: debezium.ConnectStandalone | None = None

    async def prepare(self) -> None:
        """The database, then the publication and slot, before anything is written."""
        await super().prepare()
        conn = await asyncpg.connect(self.database_url)
        try:
            await debezium.prepare_slot(conn, debezium.peer_database(self.database_url, self._slot))
        finally:
            await conn.close()

    async def start(self) -> None:
        """Start the worker and wait until the connector's task runs."""
        db = debezium.peer_database(self.database_url, self._slot)
        self._worker = debezium.ConnectStandalone(
            self.workdir / "connect",
            debezium.worker_properties(self._bootstrap, self.workdir / "connect", self._rest_port),
            debezium.connector_properties(db, self.namespace, poll_interval_ms=self._poll_ms),
            self._rest_port,
        )
        self._worker.start()
        await self._worker.wait_running()

    def alive(self) -> bool:
        """The worker still runs."""
        return self._worker is not None and self._worker.running()

    def peak_rss_mb(self) -> float | None:
        """The JVM's peak resident set."""
        return self._worker.peak_rss_mb() if self._worker else None

    def client_pid(self) -> int | None:
        """The Connect worker's JVM."""
        return self._worker.pid if self._worker else None

    async def stop(self) -> None:
        """Stop the worker (its walsender ends with it)."""
        if self._worker is not None:
            await self._worker.stop()

    async def before_drop(self, admin: asyncpg.Connection) -> None:
        """Always drop the slot: a leftover slot keeps WAL forever."""
        await self.stop()
        await debezium.drop_slot(admin, self._slot)


def raw_producer(bootstrap: str) -> AIOKafkaProducer:
    """The baseline producer: idempotent, acks=all, no linger, 256 KiB batches like the relay."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=0,
        max_batch_size=256 * 1024,
    )


class RawProducerSubject:
    """aiokafka's idempotent producer with the records in memory: ``send()`` or ``send_batch``."""

    def __init__(self, bootstrap: str, *, batch_api: bool) -> None:
        self.name = "raw-send_batch" if batch_api else "raw-send"
        self.namespace = f"p{uuid.uuid4().hex[:10]}"
        self._bootstrap = bootstrap
        self._batch_api = batch_api
        self._producer: AIOKafkaProducer | None = None
        self._backlog: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Nothing to prepare: no database."""

    async def load_backlog(self, events: int) -> None:
        """Build the records in memory (not timed), as the relay would send them."""
        stamp = utc_stamp()
        self._backlog = [raw_record(n, str(uuid.uuid4()), stamp) for n in range(1, events + 1)]

    async def start(self) -> None:
        """Connect, then send the backlog (if any) in the background."""
        self._producer = raw_producer(self._bootstrap)
        await self._producer.start()
        if self._backlog:
            send = self._send_batches if self._batch_api else self._send_each
            self._sending = asyncio.create_task(send(self._producer, self._backlog))

    async def _send_each(self, producer: AIOKafkaProducer, records: list) -> None:
        topic = topic_of(self, DRAIN_AGGREGATE)
        futures = []
        for key, value, headers in records:
            futures.append(await producer.send(topic, value, key=key, headers=headers))
            if len(futures) >= RAW_IN_FLIGHT:
                await asyncio.gather(*futures)
                futures.clear()
        await asyncio.gather(*futures)

    async def _send_batches(self, producer: AIOKafkaProducer, records: list) -> None:
        """Partitioned like Kafka's default (murmur2 of the key), one open batch per partition."""
        topic = topic_of(self, DRAIN_AGGREGATE)
        partitions = sorted(await producer.partitions_for(topic))
        partitioner = DefaultPartitioner()
        open_batches: dict[int, object] = {}
        futures = []
        for key, value, headers in records:
            partition = partitioner(key, partitions, partitions)
            batch = open_batches.setdefault(partition, producer.create_batch())
            if batch.append(timestamp=None, key=key, value=value, headers=headers) is None:  # type: ignore[attr-defined]
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = open_batches[partition] = producer.create_batch()
                batch.append(timestamp=None, key=key, value=value, headers=headers)  # type: ignore[attr-defined]
        for partition, batch in open_batches.items():
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        await asyncio.gather(*futures)

    def alive(self) -> bool:
        """False once the background send failed."""
        task = self._sending
        return not (task and task.done() and task.exception() is not None)

    async def emit(self, lane: int, n: int) -> str:
        """Hand one record to ``send()``; the id."""
        assert self._producer is not None
        event_id = str(uuid.uuid4())
        key, value, headers = raw_record(n * 4 + lane, event_id, utc_stamp())
        await self._producer.send(
            topic_of(self, LATENCY_AGGREGATE), value, key=key, headers=headers
        )
        return event_id

    def peak_rss_mb(self) -> float | None:
        """Not measured: the producer shares the benchmark's own process."""
        return None

    def client_pid(self) -> int | None:
        """The benchmark's own process: its CPU includes the harness polling the topic's
        end offsets (a few hundred requests over a catch-up), a little more than the
        producer's own."""
        return os.getpid()

    async def stop(self) -> None:
        """Finish sending and close the producer."""
        if self._sending is not None:
            with contextlib.suppress(Exception):
                await self._sending
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def cleanup(self) -> None:
        """Nothing left behind but the topic."""
        self._backlog = []
