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
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
from aiokafka import AIOKafkaProducer

from relay import sql
from relay.config import RelayConfig
from relay.db import DB_ERRORS as _DB_ERRORS
from relay.db import connect, pooled, unavailable_cause
from relay.lanes import LaneKeeper
from relay.metrics import RelayMetrics
from relay.publisher import BatchPublisher, PendingAck
from relay.records import KafkaRecord, OutboxRow, RecordMapper, RecordRejected
from relay.retry import LANE_LOST, PRODUCER_STATE, FailureClass, backoff_ms, classify_failure

log = logging.getLogger("outbox_relay.relay")


@dataclass
class Batch:
    """Rows handed to the producer together, acknowledged and recorded together."""

    rows: list[OutboxRow]
    fences: dict[int, int]
    # Per row: its place in a submitted batch, the failure found before sending, or None
    # when the row was held back because an earlier row of its key failed in this batch.
    outcomes: list[PendingAck | BaseException | None] = field(default_factory=list)


@dataclass
class Liveness:
    """When each loop last made progress; /livez reads it."""

    ticks: dict[str, float] = field(default_factory=dict)

    def tick(self, name: str) -> None:
        self.ticks[name] = time.monotonic()

    def stale(self, max_age_s: float) -> list[str]:
        now = time.monotonic()
        return sorted(name for name, at in self.ticks.items() if now - at > max_age_s)


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
        self._held_keys: set[str] = set()
        self._broker_failure_streak = 0
        self._producer_broken = False  # set on a sequence error: replace the producer
        self._last_lane_tick_ok = 0.0
        self._rng = random.Random()  # noqa: S311 - jitter only

    # -- what the health sidecar asks -------------------------------------------------
    def live(self) -> bool:
        """True while every loop keeps ticking."""
        budget = max(10.0, 3 * self.config.poll_interval_ms / 1000, self.config.lease_ttl_ms / 1000)
        return not self.liveness.stale(budget)

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
                self.liveness.tick("fetch")
                self.liveness.tick("ack")
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
            self.liveness.tick(name)
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
        while True:
            self.liveness.tick("listen")
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
                    self.liveness.tick("listen")
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
        assert self._pool is not None and self._lanes is not None
        config = self.config
        # A send started now must be settled before the lease could pass to another
        # instance; the renewal cadence keeps the window open in between.
        margin_s = config.send_timeout_ms / 1000
        cursor = 0
        while not stop.is_set():
            self.liveness.tick("fetch")
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
            try:
                async with pooled(self._pool) as conn:
                    records = await conn.fetch(
                        sql.FETCH_READY,
                        None if len(lanes) == sql.LANE_COUNT else lanes,
                        cursor,
                        config.batch_size,
                    )
            except _DB_ERRORS as exc:
                self._slots.release()
                log.warning("fetch failed", extra={"cause": unavailable_cause(exc)})
                await anyio.sleep(backoff_ms(1, base_ms=200, cap_ms=2_000, rng=self._rng) / 1000)
                continue
            if records:
                cursor = records[-1]["seq"]
            rows = [
                OutboxRow.from_record(r) for r in records if r["aggregateid"] not in self._held_keys
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
            if len(records) < config.batch_size:
                # End of this pass. The next one starts from the beginning, which needs
                # the pipeline empty: wait for that, or for news.
                await self._wait_for_pass_end()
        await self._queue.put(None)

    async def _replace_producer(self, stop: anyio.Event) -> None:
        """Start a new producer (new producer id, fresh sequences) once nothing is in flight."""
        while self._in_flight:
            self._drained.clear()
            await self._drained.wait()
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

    async def _wait_for_pass_end(self) -> None:
        with anyio.move_on_after(self.config.poll_interval_ms / 1000):
            while self._in_flight:
                self._drained.clear()
                await self._drained.wait()
            if not self._wake.is_set():
                await self._wake.wait()

    async def _send(self, rows: list[OutboxRow], fences: dict[int, int]) -> Batch:
        assert self._publisher is not None
        records: list[KafkaRecord | BaseException | None] = []
        failed_keys: set[str] = set()
        for row in rows:
            if row.aggregateid in failed_keys:
                records.append(None)  # held back behind its key's failed row
                continue
            try:
                records.append(self._mapper.to_record(row))
            except RecordRejected as exc:
                failed_keys.add(row.aggregateid)
                records.append(exc)
        outcomes = await self._publisher.submit(records)
        return Batch(rows=rows, fences=fences, outcomes=outcomes)

    # -- acknowledge and record ------------------------------------------------------------
    async def _ack_loop(self) -> None:
        while True:
            self.liveness.tick("ack")
            batch = await self._queue.get()
            if batch is None:
                return
            try:
                await self._settle(batch)
            finally:
                self._slots.release()

    async def _settle(self, batch: Batch) -> None:
        futures = {o.future for o in batch.outcomes if isinstance(o, PendingAck)}
        if futures:
            with anyio.move_on_after(2 * self.config.send_timeout_ms / 1000):
                await asyncio.wait(futures)
        published: list[tuple[OutboxRow, str, int, int]] = []
        failed: list[tuple[OutboxRow, FailureClass]] = []
        for row, outcome in zip(batch.rows, batch.outcomes, strict=True):
            if outcome is None:
                continue
            if isinstance(outcome, PendingAck):
                future = outcome.future
                if not future.done() or future.cancelled():
                    failed.append((row, classify_failure(TimeoutError())))
                elif (exc := future.exception()) is not None:
                    failed.append((row, classify_failure(exc)))
                else:
                    meta = future.result()
                    published.append((row, meta.topic, meta.partition, outcome.offset()))
            else:
                failed.append((row, classify_failure(outcome)))
        for row, failure in failed:
            self._held_keys.add(row.aggregateid)
            if failure is PRODUCER_STATE:
                self._producer_broken = True
        await self._record(batch, published, failed)
        for row in batch.rows:
            self._in_flight.pop(row.seq, None)
        if not self._in_flight:
            self._drained.set()
        for row, _ in failed:
            self._held_keys.discard(row.aggregateid)
        if published:
            now_ms = time.time() * 1000
            self.metrics.published.inc(len(published))
            self.metrics.latency.observe_many(
                max(0.0, (now_ms - p[0].created_at_ms) / 1000) for p in published
            )
        if any(f.retriable for _, f in failed) and not published:
            self._broker_failure_streak += 1
        elif published:
            self._broker_failure_streak = 0

    async def _record(
        self,
        batch: Batch,
        published: list[tuple[OutboxRow, str, int, int]],
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
                        status = await conn.execute(
                            sql.RECORD_PUBLISHED,
                            config.instance_id,
                            lanes,
                            fences,
                            [p[0].seq for p in published],
                            [p[1] for p in published],
                            [p[2] for p in published],
                            [p[3] for p in published],
                        )
                        recorded = int(status.rsplit(" ", 1)[-1])
                        if recorded:
                            await conn.execute(sql.RECORD_PROGRESS, config.instance_id, recorded)
                        if recorded < len(published):
                            self.metrics.fenced.inc(len(published) - recorded)
                            log.warning(
                                "lane changed owner while publishing; the new owner republishes",
                                extra={"events": len(published) - recorded},
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
                        extra={"events": len(published), "cause": unavailable_cause(exc)},
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
            self.liveness.tick("prune")
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


async def _create_pool(url: str | None) -> asyncpg.Pool:
    from relay.db import create_pool

    return await create_pool(url, min_size=2, max_size=4)
