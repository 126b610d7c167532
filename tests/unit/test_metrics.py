"""The relay's batch histogram against Prometheus' own bucket rule, value by value, and the
failure counters, exported for every named class from the start."""

from __future__ import annotations

import math
import random

from prometheus_client import CollectorRegistry

from relay import retry
from relay.metrics import BatchHistogram, RelayMetrics

BOUNDS = (0.002, 0.005, 0.01, 0.5, 1.0)


def _exposed(histogram: BatchHistogram) -> tuple[list[float], float]:
    (family,) = histogram.collect()
    buckets = [s.value for s in family.samples if s.name.endswith("_bucket")]
    (total,) = [s.value for s in family.samples if s.name.endswith("_sum")]
    return buckets, total


def _expected(values: list[float]) -> tuple[list[float], float]:
    # le="bound" counts values <= bound (cumulative); a negative value counts as 0.
    clamped = [max(0.0, v) for v in values]
    buckets = [float(sum(1 for v in clamped if v <= b)) for b in (*BOUNDS, math.inf)]
    return buckets, math.fsum(clamped)


def test_batches_land_in_the_buckets_one_observation_at_a_time_would() -> None:
    rng = random.Random(7)
    histogram = BatchHistogram("h", "test", BOUNDS, CollectorRegistry())
    everything: list[float] = []
    for size in (0, 1, 5, 1000, 37):
        # values exactly on a bound, negative ones (a clock step) and some past the last
        batch = [rng.choice([*BOUNDS, -0.25, 3.0, rng.uniform(-0.01, 2.0)]) for _ in range(size)]
        histogram.observe_many(batch)
        everything.extend(batch)
        buckets, total = _exposed(histogram)
        want_buckets, want_total = _expected(everything)
        assert buckets == want_buckets
        assert math.isclose(total, want_total, rel_tol=1e-12, abs_tol=1e-12)
    assert buckets[-1] == len(everything) == 1043


def test_an_empty_batch_changes_nothing() -> None:
    histogram = BatchHistogram("h", "test", BOUNDS, CollectorRegistry())
    histogram.observe_many([])
    assert _exposed(histogram) == ([0.0] * (len(BOUNDS) + 1), 0.0)


def test_every_named_failure_class_is_exported_at_zero_from_the_start() -> None:
    # A labelled counter made at its first use starts at that value, where Prometheus'
    # increase() sees nothing: OutboxRelayPermanentFailures would miss a class's first
    # failures (docs/monitoring/alerts.test.yaml shows both cases).
    registry = CollectorRegistry()
    RelayMetrics.register(registry, backlog=False)
    exported = {
        (sample.name, sample.labels.get("error_class")): sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name.endswith("_events_total")
    }
    for failure in retry.NAMED_CLASSES:
        counter = "retried" if failure.retriable else "failed"
        assert exported[(f"outbox_relay_{counter}_events_total", failure.name)] == 0.0


def test_every_failure_class_the_relay_counts_is_named() -> None:
    declared = {v for v in vars(retry).values() if isinstance(v, retry.FailureClass)}
    assert declared - set(retry.NAMED_CLASSES) == {retry.LANE_LOST}  # never counted
