"""Prometheus metrics of the relay loop, registered on a registry the caller owns."""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from relay.retry import NAMED_CLASSES

# Write time → broker acknowledgement; the SLO is p99 ≤ 25 ms, so resolve that range well.
_LATENCY_BUCKETS = (
    0.002,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.035,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class BatchHistogram(Collector):
    """A histogram fed a whole batch at a time: one call per batch, not per event."""

    def __init__(
        self, name: str, documentation: str, buckets: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = [*buckets, math.inf]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        registry.register(self)

    def observe_many(self, values: Iterable[float]) -> None:
        """Count every value (a negative one, from a clock step, as 0) in its bucket.

        Sorted once, then cut at each bound: a batch of a thousand values costs a sort and
        a few bisections, not a thousand Python-level bucket lookups.
        """
        ordered = sorted(values)
        if not ordered:
            return
        counts = self._counts
        below = bisect_left(ordered, 0.0)  # clock steps count as 0
        counted = 0
        for index, bound in enumerate(self._bounds):
            upto = bisect_right(ordered, bound)  # values <= bound, as Prometheus buckets
            counts[index] += upto - counted
            counted = upto
            if counted == len(ordered):
                break
        self._sum += sum(ordered[below:])

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, running = [], 0
        for bound, count in zip(self._bounds, self._counts, strict=True):
            running += count
            cumulative.append(("+Inf" if bound == math.inf else repr(bound), running))
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=cumulative, sum_value=self._sum
        )


@dataclass(frozen=True)
class BacklogGauges:
    """Database-wide figures: the whole outbox and every open transaction writing to it.

    Any process that reads them reports the same numbers, so only one process in a
    deployment should: N relays that each read them cost the database N times and add up
    to N times the backlog in a ``sum``.
    """

    pending: Gauge
    quarantined_pending: Gauge
    oldest_pending_age: Gauge
    oldest_writer_age: Gauge

    @classmethod
    def register(cls, registry: CollectorRegistry) -> BacklogGauges:
        """Create the backlog gauges on ``registry``."""
        return cls(
            pending=Gauge(
                "outbox_relay_pending_events",
                "Outbox rows not yet published.",
                registry=registry,
            ),
            quarantined_pending=Gauge(
                "outbox_relay_quarantined_pending_events",
                "Outbox rows in quarantine.",
                registry=registry,
            ),
            oldest_pending_age=Gauge(
                "outbox_relay_oldest_pending_age_seconds",
                "Age of the oldest unpublished row, from its write time.",
                registry=registry,
            ),
            oldest_writer_age=Gauge(
                "outbox_relay_oldest_open_outbox_writer_age_seconds",
                "Age of the oldest open transaction that has written to the outbox.",
                registry=registry,
            ),
        )


def _counted_from_zero(retries: Counter, failures: Counter) -> None:
    """A child at 0 for every named failure class, on the counter that counts it."""
    for failure in NAMED_CLASSES:
        (retries if failure.retriable else failures).labels(failure.name)


@dataclass(frozen=True)
class RelayMetrics:
    published: Counter
    latency: BatchHistogram
    retries: Counter
    failures: Counter
    quarantined: Counter
    fenced: Counter
    lanes_owned: Gauge
    receipts_pruned: Counter
    fetched_bytes: Counter
    full_passes: Counter
    void_traceparents: Counter
    unrecordable: Gauge
    ready: Gauge
    backlog: BacklogGauges | None
    """None for a relay-only process: it neither reads nor exports database-wide state."""

    @classmethod
    def register(cls, registry: CollectorRegistry, *, backlog: bool = True) -> RelayMetrics:
        """Create the relay's metrics on ``registry``; the backlog gauges only with ``backlog``."""
        retries = Counter(
            "outbox_relay_retried_events",
            "Events scheduled for another try after a retriable broker failure.",
            ["error_class"],
            registry=registry,
        )
        failures = Counter(
            "outbox_relay_failed_events",
            "Events that failed with a permanent cause (each spends an attempt).",
            ["error_class"],
            registry=registry,
        )
        _counted_from_zero(retries, failures)
        return cls(
            published=Counter(
                "outbox_relay_published_events",
                "Events acknowledged by Kafka and recorded.",
                registry=registry,
            ),
            latency=BatchHistogram(
                "outbox_relay_publish_latency_seconds",
                "From the outbox row's write time to the broker's acknowledgement.",
                _LATENCY_BUCKETS,
                registry,
            ),
            retries=retries,
            failures=failures,
            quarantined=Counter(
                "outbox_relay_quarantined_events",
                "Events quarantined after their last attempt.",
                registry=registry,
            ),
            fenced=Counter(
                "outbox_relay_fenced_events",
                "Acknowledged events not recorded because their lane changed owner.",
                registry=registry,
            ),
            lanes_owned=Gauge(
                "outbox_relay_lanes_owned",
                "Lanes this instance holds a lease on.",
                registry=registry,
            ),
            receipts_pruned=Counter(
                "outbox_relay_pruned_receipts",
                "Delivery receipts pruned after retention.",
                registry=registry,
            ),
            fetched_bytes=Counter(
                "outbox_relay_fetched_bytes",
                "Bytes of outbox rows fetched whole (their text columns as stored); a row too "
                "large to publish, or one in flight that a pass meets again, is not fetched whole.",
                registry=registry,
            ),
            full_passes=Counter(
                "outbox_relay_full_passes",
                "Fetch passes started from the beginning of the outbox.",
                registry=registry,
            ),
            void_traceparents=Counter(
                "outbox_relay_void_traceparents",
                "Rows whose traceparent a receiver must ignore (version ff, an all-zero id): "
                "published without it.",
                registry=registry,
            ),
            unrecordable=Gauge(
                "outbox_relay_unrecordable_events",
                "Events whose outcome the database refused to record: left out by this "
                "process until it restarts.",
                registry=registry,
            ),
            ready=Gauge(
                "outbox_relay_ready",
                "1 while this process's relay can do its job (lanes renewed, broker answering).",
                registry=registry,
            ),
            backlog=BacklogGauges.register(registry) if backlog else None,
        )
