"""The garbage collector's share of the relay's per-event CPU, at the interpreter's young
threshold against the one ``outbox-relay run`` sets (outbox_relay/runtime.py).

Under a backlog what the relay allocates stays alive until its batch is recorded, so young
collections find nothing to free and only carry the batches in flight into the older
generations. This replays that pattern in one process, the two thresholds interleaved:
each round builds a batch of rows from fresh driver-like records, maps them to Kafka
records and keeps the last few batches alive, as the in-flight window does. It prints the
process CPU per row under each and their ratio; no time is asserted.
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections import deque
from collections.abc import Iterator

import pytest

from outbox_relay.runtime import YOUNG_COLLECTION_THRESHOLD
from relay.config import RelayConfig
from relay.records import OutboxRow, RecordMapper
from tests.support.rows import make_row

pytestmark = pytest.mark.bench

DEFAULT_YOUNG_THRESHOLD = 700  # CPython's
ROUNDS = 12
BATCHES_PER_ROUND = 50
PAYLOAD = json.dumps({"n": 1, "fill": "x" * 1000}, separators=(", ", ": "))  # as jsonb prints


@pytest.fixture
def collector_settings() -> Iterator[None]:
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()  # as `run` does: start-up's objects are not walked
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def _round(records: list[list[object]], mapper: RecordMapper, in_flight: int) -> tuple[float, int]:
    """CPU per row in microseconds, and the young collections that ran."""
    held: deque[tuple[list[OutboxRow], list[object]]] = deque(maxlen=in_flight)
    collections = gc.get_stats()[0]["collections"]
    started = time.process_time()
    for _ in range(BATCHES_PER_ROUND):
        rows = [OutboxRow._make(list(record)) for record in records]  # a fresh record each
        held.append((rows, [mapper.to_record(row) for row in rows]))
    cpu_us = (time.process_time() - started) / (BATCHES_PER_ROUND * len(records)) * 1e6
    return cpu_us, gc.get_stats()[0]["collections"] - collections


def test_collector_cost_per_event(collector_settings: None) -> None:
    config = RelayConfig(database_url=None, kafka_bootstrap="localhost:9092")
    mapper = RecordMapper(topic_template=config.topic_template, ce_source=config.ce_source)
    records = [
        list(make_row(seq=seq, aggregateid=f"key-{seq % 1000}", payload=PAYLOAD))
        for seq in range(1, config.batch_size + 1)
    ]
    _, middle, old = gc.get_threshold()
    figures: dict[int, list[float]] = {DEFAULT_YOUNG_THRESHOLD: [], YOUNG_COLLECTION_THRESHOLD: []}
    runs = dict.fromkeys(figures, 0)
    for _ in range(ROUNDS):
        for young in figures:
            gc.set_threshold(young, middle, old)
            cpu_us, collections = _round(records, mapper, config.max_in_flight_batches)
            figures[young].append(cpu_us)
            runs[young] += collections
    default, tuned = figures[DEFAULT_YOUNG_THRESHOLD], figures[YOUNG_COLLECTION_THRESHOLD]
    ratios = [b / a for a, b in zip(default, tuned, strict=True)]
    print(
        f"\nCOLLECTOR {ROUNDS} interleaved rounds of {BATCHES_PER_ROUND} batches x "
        f"{config.batch_size} rows, {config.max_in_flight_batches} batches kept alive\n"
        f"  young threshold {DEFAULT_YOUNG_THRESHOLD:>6} (CPython's):  "
        f"{statistics.median(default):.2f} us per row (median), "
        f"{runs[DEFAULT_YOUNG_THRESHOLD] / (ROUNDS * BATCHES_PER_ROUND):.1f} young collections per batch\n"
        f"  young threshold {YOUNG_COLLECTION_THRESHOLD:>6} (run's):       "
        f"{statistics.median(tuned):.2f} us per row (median), "
        f"{runs[YOUNG_COLLECTION_THRESHOLD] / (ROUNDS * BATCHES_PER_ROUND):.1f} young collections per batch\n"
        f"  ratio run's / CPython's:              {statistics.median(ratios):.2f} "
        f"(per round {min(ratios):.2f}-{max(ratios):.2f})"
    )
    # What the threshold is for (counted, not timed): a batch no longer sets off young
    # collections of its own.
    assert runs[YOUNG_COLLECTION_THRESHOLD] < runs[DEFAULT_YOUNG_THRESHOLD] / 4
