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

from contracts.health import (
    Classification,
    CompletionOutboxEvidence,
    HealthReport,
    OutboxEvidence,
    RelayEvidence,
    ScoringJobsEvidence,
)
from contracts.policy import Family
from health.render import measurements

# (metric name, help, evidence type, measurement name, scale to seconds?)
_EVIDENCE_GAUGES: tuple[tuple[str, str, type[object], str, bool], ...] = (
    (
        "outbox_relay_outbox_pending_events",
        "Outbox rows not yet published (not quarantined).",
        OutboxEvidence,
        "pending_count",
        False,
    ),
    (
        "outbox_relay_outbox_oldest_pending_age_seconds",
        "Age of the oldest pending outbox row, from its write time.",
        OutboxEvidence,
        "oldest_pending_age",
        True,
    ),
    (
        "outbox_relay_outbox_retrying_events",
        "Pending outbox rows whose last attempt failed.",
        OutboxEvidence,
        "retrying_count",
        False,
    ),
    (
        "outbox_relay_outbox_quarantined_events",
        "Quarantined outbox rows.",
        OutboxEvidence,
        "quarantined_count",
        False,
    ),
    (
        "outbox_relay_scoring_jobs_active",
        "Scoring jobs queued, leased or retry_scheduled.",
        ScoringJobsEvidence,
        "active_count",
        False,
    ),
    (
        "outbox_relay_scoring_jobs_oldest_active_age_seconds",
        "Age of the oldest active scoring job, from its created_at.",
        ScoringJobsEvidence,
        "oldest_active_age",
        True,
    ),
    (
        "outbox_relay_scoring_jobs_quarantined",
        "Quarantined scoring jobs.",
        ScoringJobsEvidence,
        "quarantined_count",
        False,
    ),
    (
        "outbox_relay_scoring_jobs_expired_leases",
        "Leased scoring jobs whose lease expired by the database clock.",
        ScoringJobsEvidence,
        "expired_lease_count",
        False,
    ),
    (
        "outbox_relay_scoring_jobs_oldest_expired_lease_age_seconds",
        "Time since the oldest expired lease expired.",
        ScoringJobsEvidence,
        "oldest_expired_lease_age",
        True,
    ),
    (
        "outbox_relay_completion_outbox_missing_events",
        "Terminal scoring jobs past the grace period with no outbox event.",
        CompletionOutboxEvidence,
        "missing_count",
        False,
    ),
    (
        "outbox_relay_relay_live_instances",
        "Relay instances with a fresh heartbeat.",
        RelayEvidence,
        "live_instance_count",
        False,
    ),
    (
        "outbox_relay_relay_heartbeat_age_seconds",
        "Age of the newest relay heartbeat.",
        RelayEvidence,
        "heartbeat_age",
        True,
    ),
    (
        "outbox_relay_relay_unowned_lanes",
        "Relay lanes with no owner or an expired lease.",
        RelayEvidence,
        "unowned_lane_count",
        False,
    ),
    (
        "outbox_relay_relay_blocking_transaction_age_seconds",
        "Age of the oldest other open transaction holding a lock on the outbox table.",
        RelayEvidence,
        "oldest_blocking_transaction_age",
        True,
    ),
)


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
    ) -> None:
        self._report = report
        self._counters = counters
        self._families = families

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
        gauges = {name: GaugeMetricFamily(name, text) for name, text, *_ in _EVIDENCE_GAUGES}
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
                if result.evidence is None:
                    continue
                values = {m.name: m.value for m in measurements(result.evidence)}
                for name, _, kind, measurement, seconds in _EVIDENCE_GAUGES:
                    value = values.get(measurement)
                    if isinstance(result.evidence, kind) and value is not None:
                        gauges[name].add_metric([], value / 1000 if seconds else float(value))
        evaluations.add_metric([], float(self._counters.evaluations))
        for family in self._families:
            failures.add_metric([family.value], float(self._counters.probe_failures[family]))
        yield classification
        yield ready
        yield evaluated
        yield evaluations
        yield failures
        yield from gauges.values()
