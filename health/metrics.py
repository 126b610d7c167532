"""Prometheus metrics derived from the cached health report, read at scrape time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from contracts.health import Classification, HealthReport
from contracts.policy import Family
from health.families import REGISTRY, measurements


@dataclass
class HealthCounters:
    """Counters the evaluation loop increments."""

    evaluations: int = 0
    probe_failures: dict[Family, int] = field(default_factory=lambda: dict.fromkeys(Family, 0))


class HealthCollector(Collector):
    """Reads the current report on every scrape, so values are never stale-by-label."""

    def __init__(
        self,
        report: Callable[[], HealthReport | None],
        counters: HealthCounters,
        families: tuple[Family, ...],
        notification_queue_usage: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._report = report
        self._counters = counters
        self._families = families
        self._queue_usage = notification_queue_usage

    def describe(self) -> Iterator[Metric]:
        """Metric names only, so the registry can refuse duplicates at registration."""
        yield from self._metrics(None)

    def collect(self) -> Iterator[Metric]:
        """Current values."""
        yield from self._metrics(self._report())

    def _metrics(self, report: HealthReport | None) -> Iterator[Metric]:
        classification = GaugeMetricFamily(
            "outbox_relay_health_classification",
            "1 for the family's current classification, 0 for the others.",
            labels=["family", "classification"],
        )
        ready = GaugeMetricFamily(
            "outbox_relay_health_ready",
            "1 when every readiness-gating family is within bounds.",
        )
        evaluated = GaugeMetricFamily(
            "outbox_relay_health_last_evaluation_timestamp_seconds",
            "Wall-clock time of the last completed evaluation.",
        )
        evaluations = CounterMetricFamily(
            "outbox_relay_health_evaluations",
            "Health evaluations completed.",
        )
        failures = CounterMetricFamily(
            "outbox_relay_health_probe_failures",
            "Probes that produced no evidence (database unreachable, missing table, timeout).",
            labels=["family"],
        )
        queue = GaugeMetricFamily(
            "outbox_relay_notification_queue_usage_ratio",
            "Fraction of the PostgreSQL cluster's NOTIFY queue in use "
            "(pg_notification_queue_usage()); when it is full, every outbox INSERT fails "
            "at commit. Read by a process that evaluates database-wide families.",
        )
        # Every family's gauges, in registry order, present even before the first report.
        gauges = {
            gauge.metric: GaugeMetricFamily(gauge.metric, gauge.help)
            for spec in REGISTRY.values()
            for gauge in spec.gauges
        }
        if report is not None:
            by_family = {r.family: r for r in report.families}
            for family in self._families:
                result = by_family.get(family)
                for option in Classification:
                    current = result is not None and result.classification is option
                    classification.add_metric([family.value, option.value], 1.0 if current else 0.0)
            ready.add_metric([], 1.0 if report.readiness is Classification.WITHIN_BOUNDS else 0.0)
            evaluated.add_metric([], report.evaluated_at_unix_ms / 1000)
            for result in report.families:
                values = {m.name: m.value for m in measurements(result)}
                for gauge in REGISTRY[result.family].gauges:
                    value = values.get(gauge.measurement)
                    if value is not None:
                        gauges[gauge.metric].add_metric(
                            [], value / 1000 if gauge.seconds else float(value)
                        )
        usage = self._queue_usage() if report is not None else None
        if usage is not None:
            queue.add_metric([], usage)
        evaluations.add_metric([], float(self._counters.evaluations))
        for family in self._families:
            failures.add_metric([family.value], float(self._counters.probe_failures[family]))
        yield classification
        yield ready
        yield evaluated
        yield evaluations
        yield failures
        yield queue
        yield from gauges.values()
