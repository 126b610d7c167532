"""The relay service: fetch committed rows, publish them, record what Kafka acknowledged.

Loops (each a named task; one dying stops the service):
- ``lanes``: heartbeat and lane leases (relay/lanes.py);
- ``listen``: LISTEN on a dedicated connection, turning notifications into wake-ups;
- ``fetch``: read ready rows of held lanes and hand them to the producer;
- ``ack``: wait for the broker's acknowledgements in order and record them;
- ``prune``: delete delivery receipts older than the retention window, in bounded batches;
- ``observe``: backlog gauges and the oldest open writer transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
import asyncpg
from aiokafka import AIOKafkaProducer

from pgconnect import DB_ERRORS as _DB_ERRORS
from pgconnect import connect, create_pool, pooled, unavailable_cause
from relay import sql
from relay.config import RelayConfig
from relay.lanes import LaneKeeper
from relay.metrics import RelayMetrics
from relay.publisher import BatchPublisher, Submission
from relay.records import KafkaRecord, OutboxRow, RecordMapper, RecordRejected
from relay.retry import LANE_LOST, PRODUCER_STATE, FailureClass, backoff_ms, classify_failure

log = logging.getLogger("outbox_relay.relay")

_CONCURRENT_RECORDS = 2
_IDLE_TICK_MS = 1_000  # an idle loop still shows it is alive this often


@dataclass
class Batch:
    """Rows handed to the producer together, acknowledged and recorded together."""

    rows: list[OutboxRow]
    fences: dict[int, int]
    # Rows not in any submitted batch are either failures found before sending or held
    # back because an earlier row of their key failed in this batch.
    submission: Submission


class PublishedGroup(NamedTuple):
    """Rows the broker acknowledged in one partition batch, at base_offset, +1, +2, …"""

    topic: str
    partition: int
    base_offset: int
    rows: list[OutboxRow]


@dataclass
class Liveness:
    """By when each loop must show progress again; /livez reads it.

    Each loop names its own allowance, because an idle loop that waits on purpose (for
    work, for its interval) is alive; one that stops coming back is not.
    """

    deadlines: dict[str, float] = field(default_factory=dict)

    def tick(self, name: str, within_s: float) -> None:
        self.deadlines[name] = time.monotonic() + within_s

    def stale(self) -> list[str]:
        now = time.monotonic()
        return sorted(name for name, deadline in self.deadlines.items() if now > deadline)


def make_producer(config: RelayConfig) -> AIOKafkaProducer:
    """The idempotent, acks=all producer every relay instance uses."""
    security = config.kafka_security
    return AIOKafkaProducer(
        bootstrap_servers=config.kafka_bootstrap,
        client_id=config.instance_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=config.linger_ms,
        max_batch_size=256 * 1024,
        request_timeout_ms=config.send_timeout_ms,
        compression_type=config.compression,
        security_protocol=security.protocol,
        ssl_context=security.ssl_context(),
        sasl_mechanism=security.sasl_mechanism or "PLAIN",
        sasl_plain_username=security.sasl_username,
        sasl_plain_password=security.sasl_password,
    )


class Relay:
    """One relay instance. Use :meth:`run` inside an event loop; it returns after a drain."""

    def __init__(
        self,
        config: RelayConfig,
        metrics: RelayMetrics,
        *,
        producer_factory: Callable[[RelayConfig], AIOKafkaProducer] = make_producer,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.liveness = Liveness()
        self._producer_factory = producer_factory
        self._producer: AIOKafkaProducer | None = None
        self._publisher: BatchPublisher | None = None
        self._mapper = RecordMapper(
            topic_template=config.topic_template, ce_source=config.ce_source
        )
        self._pool: asyncpg.Pool | None = None
        self._lanes: LaneKeeper | None = None
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()  # set whenever nothing is in flight
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue()
        # Batches submitted and not yet recorded, at most this many: a crash can publish
        # again only what these hold.
        self._slots = asyncio.Semaphore(config.max_in_flight_batches)
        self._in_flight: dict[int, int] = {}  # seq -> lane
        self._held_keys: Counter[str] = Counter()
        self._broker_failure_streak = 0
        self._producer_broken = False  # set on a sequence error: replace the producer
        self._last_lane_tick_ok = 0.0
        self._rng = random.Random()  # noqa: S311 - jitter only

    # -- what the health sidecar asks -------------------------------------------------
    def live(self) -> bool:
        """True while every loop keeps coming back within its allowance."""
        return not self.liveness.stale()

    def _allowance(self, every_ms: int) -> float:
        """Three rounds of a loop, plus what one round may legitimately block for."""
        config = self.config
        blocking_ms = config.max_in_flight_batches * 2 * config.send_timeout_ms
        return (3 * every_ms + blocking_ms + config.lease_ttl_ms) / 1000

    def ready(self) -> bool:
        """True when the relay can do its job: leases renewed recently and Kafka answering."""
        lanes_fresh = time.monotonic() - self._last_lane_tick_ok < self.config.lease_ttl_ms / 1000
        return self._producer is not None and lanes_fresh and self._broker_failure_streak < 3

    # -- service -----------------------------------------------------------------------
    async def run(self, stop: anyio.Event) -> None:
        """Relay until ``stop`` is set, then drain in-flight work within the drain timeout."""
        config = self.config
        self._pool = await _create_pool(config.database_url)
        self._lanes = LaneKeeper(
            self._pool, instance_id=config.instance_id, ttl_ms=config.lease_ttl_ms
        )
        try:
            self._producer = await self._start_producer(stop)
            if self._producer is None:
                return
            self._publisher = BatchPublisher(self._producer)
            async with anyio.create_task_group() as background:
                background.start_soon(self._loop, "lanes", self._lane_round, config.lease_renew_ms)
                background.start_soon(self._loop, "observe", self._observe_round, 5_000)
                background.start_soon(
                    self._loop, "prune", self._prune_round, config.prune_interval_ms
                )
                if config.notify:
                    background.start_soon(self._listen_loop)
                with anyio.CancelScope() as pipeline_scope:
                    async with anyio.create_task_group() as pipeline:
                        pipeline.start_soon(self._fetch_loop, stop)
                        pipeline.start_soon(self._ack_loop)
                        pipeline.start_soon(self._drain_deadline, stop, pipeline_scope)
                background.cancel_scope.cancel()
            await self._leave()
        finally:
            if self._producer is not None:
                await self._producer.stop()
            await self._pool.close()

    async def _drain_deadline(self, stop: anyio.Event, scope: anyio.CancelScope) -> None:
        await stop.wait()
        self._wake.set()
        scope.deadline = anyio.current_time() + self.config.drain_timeout_ms / 1000

    async def _start_producer(self, stop: anyio.Event) -> AIOKafkaProducer | None:
        attempt = 0
        while not stop.is_set():
            producer = self._producer_factory(self.config)
            try:
                await producer.start()
            except Exception as exc:
                await producer.stop()
                failure = classify_failure(exc)
                delay = backoff_ms(attempt, base_ms=500, cap_ms=10_000, rng=self._rng)
                log.warning(
                    "kafka not reachable, retrying",
                    extra={"error_class": failure.name, "retry_in_ms": delay},
                )
                attempt += 1
                self.liveness.tick("fetch", self._allowance(delay))
                self.liveness.tick("ack", self._allowance(delay))
                with anyio.move_on_after(delay / 1000):
                    await stop.wait()
                continue
            log.info("connected to kafka")
            return producer
        return None

    async def _loop(self, name: str, round_: Callable[[], Awaitable[None]], every_ms: int) -> None:
        failures = 0
        while True:
            try:
                await round_()
                failures = 0
            except _DB_ERRORS as exc:
                failures += 1
                log.warning(
                    "database round failed", extra={"loop": name, "cause": unavailable_cause(exc)}
                )
            self.liveness.tick(name, self._allowance(every_ms))
            delay = (
                every_ms
                if failures == 0
                else min(
                    every_ms, backoff_ms(failures, base_ms=200, cap_ms=every_ms, rng=self._rng)
                )
            )
            await anyio.sleep(delay / 1000)

    # -- lanes ---------------------------------------------------------------------------
    async def _lane_round(self) -> None:
        assert self._lanes is not None
        before = set(self._lanes.leases.fences)
        await self._lanes.tick(in_flight_lanes=set(self._in_flight.values()))
        self._last_lane_tick_ok = time.monotonic()
        self.metrics.lanes_owned.set(len(self._lanes.leases.fences))
        if set(self._lanes.leases.fences) - before:
            self._wake.set()  # new lanes may have a backlog waiting

    async def _leave(self) -> None:
        assert self._lanes is not None
        try:
            await self._lanes.leave()
        except _DB_ERRORS as exc:
            log.warning(
                "could not hand lanes back; they expire on their own",
                extra={"cause": unavailable_cause(exc)},
            )

    # -- wake-ups ------------------------------------------------------------------------
    async def _listen_loop(self) -> None:
        attempt = 0
        # One round: a poll interval of waiting, then a keepalive (5 s at most) or a
        # reconnect (10 s connect timeout plus backoff).
        listen_round_ms = self.config.poll_interval_ms + 15_000
        while True:
            self.liveness.tick("listen", self._allowance(listen_round_ms))
            try:
                conn = await connect(self.config.database_url)
            except Exception as exc:
                log.warning("listen connection failed", extra={"cause": str(exc)})
                attempt += 1
                await anyio.sleep(
                    backoff_ms(attempt, base_ms=200, cap_ms=5_000, rng=self._rng) / 1000
                )
                continue
            try:
                await conn.add_listener(sql.LISTEN_CHANNEL, self._on_notify)
                attempt = 0
                self._wake.set()  # anything committed while we were not listening
                while True:
                    await anyio.sleep(self.config.poll_interval_ms / 1000)
                    with anyio.fail_after(5):
                        await conn.execute("SELECT 1")  # keepalive: a dead socket shows here
                    self.liveness.tick("listen", self._allowance(listen_round_ms))
            except (*_DB_ERRORS, asyncpg.exceptions.ConnectionDoesNotExistError) as exc:
                log.warning("listen connection lost", extra={"cause": unavailable_cause(exc)})
            finally:
                conn.terminate()

    def _on_notify(self, *_: object) -> None:
        self._wake.set()

    async def _wait_for_work(self) -> None:
        with anyio.move_on_after(self.config.poll_interval_ms / 1000):
            await self._wake.wait()

    # -- fetch and send ---------------------------------------------------------------------
    async def _fetch_loop(self, stop: anyio.Event) -> None:
        assert self._lanes is not None
        config = self.config
        # A send started now must be settled before the lease could pass to another
        # instance; the renewal cadence keeps the window open in between.
        margin_s = config.send_timeout_ms / 1000
        cursor = 0
        # While a full batch is mapped and handed to the producer, the database already
        # reads the next one. A prefetch holds an in-flight slot of its own.
        prefetch: asyncio.Task[list[Any]] | None = None
        try:
            while not stop.is_set():
                self.liveness.tick("fetch", self._allowance(config.poll_interval_ms))
                if prefetch is None:
                    if cursor and not self._in_flight:
                        cursor = 0  # a new pass: pick up whatever the last one stepped over
                    if self._producer_broken:
                        await self._replace_producer(stop)
                        continue
                    lanes = self._lanes.leases.publishable(margin_s)
                    if not lanes:
                        await self._wait_for_work()
                        self._wake.clear()
                        continue
                    self._wake.clear()
                    await self._slots.acquire()
                    fetching: Awaitable[list[Any]] = self._fetch(lanes, cursor)
                else:
                    fetching, prefetch = prefetch, None
                try:
                    records = await fetching
                except _DB_ERRORS as exc:
                    self._slots.release()
                    log.warning("fetch failed", extra={"cause": unavailable_cause(exc)})
                    await anyio.sleep(
                        backoff_ms(1, base_ms=200, cap_ms=2_000, rng=self._rng) / 1000
                    )
                    continue
                full = len(records) == config.batch_size
                if records:
                    cursor = records[-1]["seq"]
                lanes = self._lanes.leases.publishable(margin_s)
                if full and lanes and not self._producer_broken and not self._slots.locked():
                    await self._slots.acquire()
                    prefetch = asyncio.create_task(self._fetch(lanes, cursor))
                # Lanes may have been handed back meanwhile, and keys held back by a
                # failure this relay has not recorded yet are skipped: the next pass
                # finds those rows again.
                publishable = set(lanes)
                held = self._held_keys
                rows = [
                    OutboxRow.from_record(r)
                    for r in records
                    if r["lane"] in publishable and r["aggregateid"] not in held
                ]
                if rows:
                    fences = dict(
                        zip(*self._lanes.leases.fences_for({r.lane for r in rows}), strict=True)
                    )
                    batch = await self._send(rows, fences)
                    for row in rows:
                        self._in_flight[row.seq] = row.lane
                    await self._queue.put(batch)
                else:
                    self._slots.release()
                if not full:
                    # End of this pass. The next one starts from the beginning, which
                    # needs the pipeline empty: wait for that, or for news.
                    await self._wait_for_pass_end()
        finally:
            if prefetch is not None:
                prefetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await prefetch
                self._slots.release()
            await self._queue.put(None)

    async def _fetch(self, lanes: list[int], cursor: int) -> list[Any]:
        assert self._pool is not None
        async with pooled(self._pool) as conn:
            records: list[Any] = await conn.fetch(
                sql.FETCH_READY,
                None if len(lanes) == sql.LANE_COUNT else lanes,
                cursor,
                self.config.batch_size,
            )
        return records

    async def _replace_producer(self, stop: anyio.Event) -> None:
        """Start a new producer (new producer id, fresh sequences) once nothing is in flight."""
        await self._until_nothing_in_flight()
        log.warning("replacing the Kafka producer after a sequence error")
        old = self._producer
        self._producer = None
        if old is not None:
            with anyio.CancelScope(shield=True):
                await old.stop()
        producer = await self._start_producer(stop)
        if producer is not None:
            self._producer = producer
            self._publisher = BatchPublisher(producer)
        self._producer_broken = False

    async def _until_nothing_in_flight(self) -> None:
        while self._in_flight:
            self._drained.clear()
            await self._drained.wait()

    async def _wait_for_pass_end(self) -> None:
        with anyio.move_on_after(self.config.poll_interval_ms / 1000):
            await self._until_nothing_in_flight()
            if not self._wake.is_set():
                await self._wake.wait()

    async def _send(self, rows: list[OutboxRow], fences: dict[int, int]) -> Batch:
        assert self._publisher is not None
        records: list[KafkaRecord | None] = []
        rejected: dict[int, BaseException] = {}
        failed_keys: set[str] = set()
        for index, row in enumerate(rows):
            if row.aggregateid in failed_keys:
                records.append(None)  # held back behind its key's failed row
                continue
            try:
                records.append(self._mapper.to_record(row))
            except RecordRejected as exc:
                failed_keys.add(row.aggregateid)
                records.append(None)
                rejected[index] = exc
        submission = await self._publisher.submit(records)
        submission.failures.update(rejected)
        for index in submission.failures:
            # Hold the key now: the next fetch may come before this failure is recorded.
            self._held_keys[rows[index].aggregateid] += 1
        return Batch(rows=rows, fences=fences, submission=submission)

    # -- acknowledge and record ------------------------------------------------------------
    async def _ack_loop(self) -> None:
        # Acknowledgements are awaited in submission order; recording them may overlap
        # (two statements at once), because the database write is the slowest step.
        recording = anyio.Semaphore(_CONCURRENT_RECORDS)
        async with anyio.create_task_group() as recorders:
            while True:
                self.liveness.tick("ack", self._allowance(_IDLE_TICK_MS))
                with anyio.move_on_after(_IDLE_TICK_MS / 1000) as idle:
                    batch = await self._queue.get()
                if idle.cancelled_caught:
                    continue  # nothing in flight: idle, and alive
                if batch is None:
                    return
                try:
                    published, failed = await self._settle(batch)
                    await recording.acquire()
                except BaseException:
                    self._slots.release()
                    raise
                recorders.start_soon(self._conclude, batch, published, failed, recording)

    async def _settle(
        self, batch: Batch
    ) -> tuple[list[PublishedGroup], list[tuple[OutboxRow, FailureClass]]]:
        """Wait for the batch's acknowledgements and sort its rows into published and failed."""
        submitted = batch.submission.batches
        if submitted:
            with anyio.move_on_after(2 * self.config.send_timeout_ms / 1000):
                await asyncio.wait([b.future for b in submitted])
        rows = batch.rows
        published: list[PublishedGroup] = []
        failed: list[tuple[OutboxRow, FailureClass]] = []
        for sent in submitted:
            future = sent.future
            if not future.done() or future.cancelled():
                failure = classify_failure(TimeoutError())
                failed.extend((rows[index], failure) for index in sent.members)
            elif (exc := future.exception()) is not None:
                failure = classify_failure(exc)
                failed.extend((rows[index], failure) for index in sent.members)
            else:
                meta = future.result()
                published.append(
                    PublishedGroup(
                        meta.topic, meta.partition, meta.offset, [rows[i] for i in sent.members]
                    )
                )
        for row, failure in failed:
            # Until the failure is recorded, the database does not hold the key back yet.
            self._held_keys[row.aggregateid] += 1
            if failure is PRODUCER_STATE:
                self._producer_broken = True
        # Failures found before sending were held back when they were found.
        failed.extend(
            (rows[index], classify_failure(exc)) for index, exc in batch.submission.failures.items()
        )
        return published, failed

    async def _conclude(
        self,
        batch: Batch,
        published: list[PublishedGroup],
        failed: list[tuple[OutboxRow, FailureClass]],
        recording: anyio.Semaphore,
    ) -> None:
        """Record the outcome, then let the batch's rows and slot go."""
        try:
            await self._record(batch, published, failed)
        finally:
            recording.release()
            self._slots.release()
            for row in batch.rows:
                self._in_flight.pop(row.seq, None)
            if not self._in_flight:
                self._drained.set()
            for row, _ in failed:
                self._held_keys[row.aggregateid] -= 1
                if self._held_keys[row.aggregateid] <= 0:
                    del self._held_keys[row.aggregateid]
        if published:
            now_ms = time.time() * 1000
            self.metrics.published.inc(sum(len(group.rows) for group in published))
            self.metrics.latency.observe_many(
                max(0.0, (now_ms - row.created_at_ms) / 1000)
                for group in published
                for row in group.rows
            )
        if any(f.retriable for _, f in failed) and not published:
            self._broker_failure_streak += 1
        elif published:
            self._broker_failure_streak = 0

    async def _record(
        self,
        batch: Batch,
        published: list[PublishedGroup],
        failed: list[tuple[OutboxRow, FailureClass]],
    ) -> None:
        assert self._pool is not None and self._lanes is not None
        config = self.config
        lanes = sorted(batch.fences)
        fences = [batch.fences[lane] for lane in lanes]
        delays = [
            backoff_ms(
                self._broker_failure_streak if f.retriable else row.attempts,
                base_ms=config.retry_base_ms,
                cap_ms=config.retry_cap_ms,
                rng=self._rng,
            )
            for row, f in failed
        ]
        attempt = 0
        while True:
            try:
                async with pooled(self._pool) as conn, conn.transaction():
                    # Losing this commit in a server crash loses only the "published"
                    # mark, never an event: the rows come back and are published again
                    # (same id). So the bookkeeping need not wait for its WAL flush.
                    await conn.execute(sql.ASYNC_COMMIT)
                    if published:
                        # One array entry per event (its seq); where it landed is sent
                        # once per partition batch: offsets run on from the batch's base.
                        seqs: list[int] = []
                        firsts: list[int] = []
                        for group in published:
                            firsts.append(len(seqs) + 1)
                            seqs.extend(row.seq for row in group.rows)
                        status = await conn.execute(
                            sql.RECORD_PUBLISHED,
                            config.instance_id,
                            lanes,
                            fences,
                            seqs,
                            [group.topic for group in published],
                            [group.partition for group in published],
                            [group.base_offset for group in published],
                            firsts,
                            [
                                first + len(g.rows) - 1
                                for first, g in zip(firsts, published, strict=True)
                            ],
                        )
                        recorded = int(status.rsplit(" ", 1)[-1])
                        if recorded:
                            await conn.execute(sql.RECORD_PROGRESS, config.instance_id, recorded)
                        if recorded < len(seqs):
                            self.metrics.fenced.inc(len(seqs) - recorded)
                            log.warning(
                                "lane changed owner while publishing; the new owner republishes",
                                extra={"events": len(seqs) - recorded},
                            )
                    if failed:
                        rows = await conn.fetch(
                            sql.RECORD_FAILED,
                            config.instance_id,
                            lanes,
                            fences,
                            [row.seq for row, _ in failed],
                            [f.name for _, f in failed],
                            [f.retriable for _, f in failed],
                            delays,
                            config.max_attempts,
                        )
                        self._count_failures(failed, rows)
                return
            except _DB_ERRORS as exc:
                attempt += 1
                # Past the lease the write would be fenced anyway: give the rows up to
                # the next owner (or to ourselves after the next claim) for republishing.
                if time.monotonic() > self._lanes.leases.valid_until:
                    log.warning(
                        "could not record acknowledgements before the lease ended; "
                        "the events will be published again",
                        extra={
                            "events": sum(len(g.rows) for g in published),
                            "cause": unavailable_cause(exc),
                        },
                    )
                    return
                await anyio.sleep(
                    backoff_ms(attempt, base_ms=100, cap_ms=2_000, rng=self._rng) / 1000
                )

    def _count_failures(
        self, failed: list[tuple[OutboxRow, FailureClass]], rows: list[Any]
    ) -> None:
        by_class = Counter(failure for _, failure in failed if failure is not LANE_LOST)
        for failure, count in by_class.items():
            if failure.retriable:
                self.metrics.retries.labels(failure.name).inc(count)
            else:
                self.metrics.failures.labels(failure.name).inc(count)
            # One line per batch and cause, not per event.
            log.warning(
                "publish failed",
                extra={
                    "error_class": failure.name,
                    "retriable": failure.retriable,
                    "events": count,
                },
            )
        quarantined = sum(1 for r in rows if r[1])
        if quarantined:
            self.metrics.quarantined.inc(quarantined)
            log.error("events quarantined", extra={"events": quarantined})

    # -- housekeeping ------------------------------------------------------------------------
    async def _prune_round(self) -> None:
        assert self._pool is not None
        config = self.config
        while True:
            async with pooled(self._pool) as conn:
                status = await conn.execute(
                    sql.PRUNE_RECEIPTS, config.receipt_retention_ms, config.prune_batch_size
                )
            pruned = int(status.rsplit(" ", 1)[-1])
            self.metrics.receipts_pruned.inc(pruned)
            if pruned < config.prune_batch_size:
                return
            self.liveness.tick("prune", self._allowance(config.prune_interval_ms))
            await anyio.sleep(0.05)  # let the writers in between bounded batches

    async def _observe_round(self) -> None:
        assert self._pool is not None
        async with pooled(self._pool) as conn:
            pending, quarantined, oldest_age = await conn.fetchrow(sql.PENDING_SUMMARY)
            writer = await conn.fetchrow(sql.OLDEST_OUTBOX_WRITER)
        self.metrics.pending.set(pending)
        self.metrics.quarantined_pending.set(quarantined)
        self.metrics.oldest_pending_age.set(float(oldest_age or 0.0))
        writer_age = float(writer[1]) if writer else 0.0
        self.metrics.oldest_writer_age.set(writer_age)
        if writer and writer_age * 1000 > self.config.blocking_transaction_warn_ms:
            log.warning(
                "an open transaction has written to the outbox and not committed; "
                "its events and the vacuum of published rows wait for it",
                extra={"pid": writer[0], "transaction_age_s": round(writer_age, 1)},
            )


# The outbox swings from empty to a large burst faster than autovacuum re-analyzes it;
# with stale statistics the planner chose a full scan plus sort for the fetch (seconds
# per batch on a 200k backlog) or a nested loop over the whole table. Every relay
# statement is written for its index, so the relay's own sessions simply rule out the
# alternatives; JIT only adds latency to these short statements.
RELAY_SESSION_SETTINGS = {
    "application_name": "outbox-relay",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "enable_sort": "off",
    "jit": "off",
}


async def _create_pool(url: str | None) -> asyncpg.Pool:
    return await create_pool(url, min_size=2, max_size=4, server_settings=RELAY_SESSION_SETTINGS)
