"""The Kafka producer's life cycle: make it, start it with backoff, replace it after a
sequence error, stop it. The pipeline sees only :class:`ProducerKeeper`."""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Callable, Sequence
from functools import partial

import anyio
from aiokafka import AIOKafkaProducer

from relay.broker_check import bootstrap_failure
from relay.config import RelayConfig
from relay.errors import ProducerWasReset, Stopped
from relay.kafka_internals import check_kafka_internals
from relay.producer_reset import ProducerReset
from relay.publisher import BatchPublisher, KeyHolds, Submission
from relay.records import KafkaRecord, OutboxRow
from relay.retry import backoff_ms, classify_failure
from relay.stopping import unless_stopped
from relay.topics import MAX_BATCH_BYTES, TopicCatalog

log = logging.getLogger(__name__)

ProducerFactory = Callable[[RelayConfig], AIOKafkaProducer]

# Consecutive batches that failed retriably with nothing published: past this many the
# relay is not ready (Kafka is not answering).
_UNREADY_AFTER_FAILED_BATCHES = 3


def make_producer(config: RelayConfig) -> AIOKafkaProducer:
    """The idempotent, acks=all producer every relay instance uses."""
    return AIOKafkaProducer(
        bootstrap_servers=config.kafka_bootstrap,
        client_id=config.instance_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=config.linger_ms,
        max_batch_size=MAX_BATCH_BYTES,
        request_timeout_ms=config.send_timeout_ms,
        compression_type=config.compression,
        **config.kafka_security.client_options(),
    )


class ProducerState(enum.Enum):
    """Where the producer is in its life cycle."""

    DOWN = "down"
    """None is started (before the first start, while one is replaced, once stopped)."""
    UP = "up"
    """Started; records may be handed to it."""
    BROKEN = "broken"
    """Its sequences no longer match the broker's (a sequence error, or it was reset): it
    must be replaced once nothing is in flight, before anything is sent again."""


class ProducerKeeper:
    """Holds the current producer, its life cycle's :class:`ProducerState`, and what the
    relay knows of the broker's health."""

    def __init__(
        self,
        config: RelayConfig,
        *,
        factory: ProducerFactory = make_producer,
        on_backoff: Callable[[int], None] = lambda _delay_ms: None,
        rng: random.Random | None = None,
    ) -> None:
        self._config = config
        self._factory = factory
        self._on_backoff = on_backoff  # told each retry delay, so waiting loops stay live
        self._rng = rng or random.Random()  # noqa: S311 - jitter only
        self._producer: AIOKafkaProducer | None = None
        self._publisher: BatchPublisher | None = None
        self._reset: ProducerReset | None = None
        # Outlives producers: what is known of each topic stays across a replacement.
        self._topics = TopicCatalog(config)
        self.state = ProducerState.DOWN
        # Batches in a row that failed retriably and published nothing.
        self.failure_streak = 0
        self._internals_checked = False

    @property
    def connected(self) -> bool:
        """True while a started producer is in place."""
        return self._producer is not None

    @property
    def broken(self) -> bool:
        """True when the producer must be replaced before anything is sent again."""
        return self.state is ProducerState.BROKEN

    def sequences_lost(self) -> None:
        """The broker answered with a sequence error: replace the producer once nothing is
        in flight."""
        if self.state is ProducerState.UP:
            self.state = ProducerState.BROKEN

    def answering(self) -> bool:
        """True unless the last few batches all failed retriably."""
        return self.failure_streak < _UNREADY_AFTER_FAILED_BATCHES

    def note_outcome(self, *, published: bool, failed_retriably: bool) -> None:
        """Count a batch toward (or end) the streak of batches the broker failed."""
        if failed_retriably and not published:
            self.failure_streak += 1
        elif published:
            self.failure_streak = 0

    async def start(self, stop: anyio.Event) -> bool:
        """Start a producer, retrying with backoff; False if ``stop`` came first, also in
        the middle of an attempt or of the bootstrap check after one."""
        if not self._internals_checked:
            await check_kafka_internals()  # refuses the start: nothing below would be safe
            self._internals_checked = True
        attempt = 0
        last_cause = ""
        while not stop.is_set():
            producer = self._factory(self._config)
            try:
                # A stop ends the start at once: on a stalled path it would wait out its
                # request timeout first.
                await unless_stopped(stop, producer.start)
            except BaseException as exc:
                # Also when stopped or cancelled mid-start: its bootstrap connections close.
                with anyio.CancelScope(shield=True):
                    await producer.stop()
                if isinstance(exc, Stopped):
                    return False
                if not isinstance(exc, Exception):
                    raise
                failure = classify_failure(exc)
                delay = backoff_ms(attempt, base_ms=500, cap_ms=10_000, rng=self._rng)
                # The producer's error has no cause: name it from a connection of our own
                # (10 s at most on a stalled path; a stop ends it at once, unlogged).
                try:
                    cause = await unless_stopped(stop, partial(bootstrap_failure, self._config))
                except Stopped:
                    return False
                # One line per change of cause, not one per retry.
                log.log(
                    logging.DEBUG if cause == last_cause else logging.WARNING,
                    "kafka not reachable, retrying",
                    extra={"error_class": failure.name, "cause": cause, "retry_in_ms": delay},
                )
                last_cause = cause
                attempt += 1
                self._on_backoff(delay)
                with anyio.move_on_after(delay / 1000):
                    await stop.wait()
                continue
            log.info("connected to kafka")
            self.state = ProducerState.UP
            self._producer = producer
            self._reset = ProducerReset(producer)
            self._topics.attach(producer)
            self._publisher = BatchPublisher(producer, self._topics)
            return True
        return False

    def reset(self, reason: str) -> None:
        """Give up on all the current producer holds, so none of it can land later; every
        batch it held fails as ``producer_reset`` and the producer is replaced before the
        next send (relay/producer_reset.py)."""
        if self._reset is None or self._reset.done:
            return
        log.warning("giving up on what the kafka producer holds", extra={"reason": reason})
        if self._publisher is not None:
            self._publisher.cancel_pending()
        self._reset.reset(ProducerWasReset(reason))
        self.state = ProducerState.BROKEN

    async def replace(self, stop: anyio.Event) -> None:
        """Start a new producer (new producer id, fresh sequences); call with nothing in flight."""
        log.warning("replacing the Kafka producer")
        old, self._producer = self._producer, None
        self.state = ProducerState.DOWN
        if old is not None:
            assert self._reset is not None  # made with the producer
            await _stop_shielded(old, self._reset)
        await self.start(stop)

    async def submit(
        self,
        rows: Sequence[OutboxRow],
        to_record: Callable[[OutboxRow], KafkaRecord],
        holds: KeyHolds,
    ) -> Submission:
        """Hand rows to the current producer as records (the rows of keys ``holds`` holds
        are skipped, and the keys of rows that fail are held there;
        :meth:`BatchPublisher.submit`)."""
        assert self._publisher is not None
        return await self._publisher.submit(rows, to_record, holds)

    async def stop(self) -> None:
        """Stop the topic lookups and the current producer, if any."""
        await self._topics.close()
        self.state = ProducerState.DOWN
        if self._producer is not None:
            assert self._reset is not None  # made with the producer
            with self._reset.stopping():
                await self._producer.stop()


async def _stop_shielded(producer: AIOKafkaProducer, tracker: ProducerReset) -> None:
    """Stop a producer we are done with, whatever its sender task was doing.

    aiokafka's ``stop`` cancels its sender task and then awaits it; when that task was
    still busy (a request on a stalled path), the await re-raises the task's own
    ``CancelledError`` in the caller. Nothing cancelled us here (the scope is shielded),
    so it is absorbed: let through, it unwound the relay as if stopped and the process
    exited 0 (tests/soak/test_found_stall_exit.py).
    """
    with tracker.stopping(), anyio.CancelScope(shield=True):
        try:
            await producer.stop()
        except asyncio.CancelledError:
            log.debug("the old kafka producer's sender task ended cancelled")
