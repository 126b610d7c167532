"""The producer keeper: broker health from batch outcomes, start and replacement. No broker."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import relay.producer
from relay.config import RelayConfig
from relay.producer import ProducerKeeper, ProducerState

CONFIG = RelayConfig(database_url=None, kafka_bootstrap="k:9092")


class FakeProducer:
    """Stands in for AIOKafkaProducer: records start and stop."""

    def __init__(self) -> None:
        self.started = self.stopped = False
        # What ProducerReset attaches to: the client's connection factory.
        self.client = SimpleNamespace(_get_conn=self._no_connection, _conns={})
        # What the publisher reads to build batches with the producer's compression.
        self._message_accumulator = SimpleNamespace(_compression_type=0)

    async def _no_connection(self, *_: Any, **__: Any) -> None:
        return None

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True


def keeper_with(made: list[FakeProducer]) -> ProducerKeeper:
    def factory(_: RelayConfig) -> Any:
        made.append(FakeProducer())
        return made[-1]

    return ProducerKeeper(CONFIG, factory=factory)


@pytest.mark.parametrize(
    ("outcomes", "streak"),
    [
        ([], 0),
        ([(False, True)], 1),
        ([(False, True), (False, True), (False, True)], 3),
        ([(False, True), (False, True), (True, True)], 0),  # anything published ends it
        ([(False, True), (False, False)], 1),  # a permanent failure neither counts nor ends it
        ([(False, True), (True, False), (False, True)], 1),
    ],
)
def test_the_failure_streak_counts_batches_that_failed_retriably_and_published_nothing(
    outcomes: list[tuple[bool, bool]], streak: int
) -> None:
    keeper = ProducerKeeper(CONFIG)
    for published, failed_retriably in outcomes:
        keeper.note_outcome(published=published, failed_retriably=failed_retriably)
    assert keeper.failure_streak == streak
    assert keeper.answering() is (streak < 3)


async def test_start_gives_up_at_once_when_already_stopping() -> None:
    made: list[FakeProducer] = []
    keeper = keeper_with(made)
    stop = anyio.Event()
    stop.set()
    assert not await keeper.start(stop)
    assert made == []
    assert not keeper.connected


async def test_replace_stops_the_old_producer_and_starts_a_fresh_one() -> None:
    made: list[FakeProducer] = []
    keeper = keeper_with(made)
    stop = anyio.Event()
    assert await keeper.start(stop)
    assert keeper.state is ProducerState.UP
    keeper.sequences_lost()
    assert keeper.broken
    await keeper.replace(stop)
    assert [(p.started, p.stopped) for p in made] == [(True, True), (True, False)]
    assert keeper.connected
    assert keeper.state is ProducerState.UP and not keeper.broken
    await keeper.stop()
    assert made[1].stopped


async def test_a_producer_that_cannot_start_is_logged_once_per_cause(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    causes = iter(["connection refused", "connection refused", "connection refused", "timed out"])

    async def bootstrap_failure(_: RelayConfig) -> str:
        return next(causes)

    monkeypatch.setattr(relay.producer, "bootstrap_failure", bootstrap_failure)
    failures = 4

    class Refused(FakeProducer):
        async def start(self) -> None:
            nonlocal failures
            if failures:
                failures -= 1
                raise ConnectionRefusedError
            await super().start()

    def factory(_: RelayConfig) -> Any:
        return Refused()

    keeper = ProducerKeeper(CONFIG, factory=factory, rng=random.Random(0))
    monkeypatch.setattr(relay.producer, "backoff_ms", lambda *_, **__: 1)
    with caplog.at_level("DEBUG", logger="relay.producer"):
        assert await keeper.start(anyio.Event())
    said = [
        (r.levelname, getattr(r, "cause", None))
        for r in caplog.records
        if r.getMessage() == "kafka not reachable, retrying"
    ]
    assert said == [
        ("WARNING", "connection refused"),
        ("DEBUG", "connection refused"),
        ("DEBUG", "connection refused"),
        ("WARNING", "timed out"),
    ]


async def test_a_stopped_keeper_is_down_and_a_lost_sequence_before_a_start_is_ignored() -> None:
    made: list[FakeProducer] = []
    keeper = keeper_with(made)
    keeper.sequences_lost()  # no producer yet: nothing to replace
    assert keeper.state is ProducerState.DOWN and not keeper.broken
    stop = anyio.Event()
    assert await keeper.start(stop)
    await keeper.stop()
    assert keeper.state is ProducerState.DOWN
