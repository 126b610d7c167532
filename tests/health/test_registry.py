"""The family registry: every ``Family`` has one spec, consistent with the contracts, and the
public names it feeds (health+json measurement keys, metric names) stay as published."""

from __future__ import annotations

from typing import Any, get_args

import msgspec
import pytest

from contracts.health import Evidence, OutboxEvidence, RelayEvidence
from contracts.policy import Family, FamilyPolicy, Policy
from health.families import REGISTRY
from health.families.base import FamilySpec
from tests.support.policies import loose_policy, relay_policy

NOW = 1_800_000_000_000


def sample(evidence_type: type[Any]) -> Any:
    """Evidence with every field set (ints 1 ms before the observation), so every age exists."""
    values = {f.name: NOW - 1 for f in msgspec.structs.fields(evidence_type)}
    return evidence_type(**values | {"observed_at_unix_ms": NOW})


def test_registry_covers_every_family_in_report_order() -> None:
    assert list(REGISTRY) == list(Family)


@pytest.mark.parametrize("family", list(Family))
def test_spec_matches_the_policy_field_and_the_evidence_tag(family: Family) -> None:
    spec = REGISTRY[family]
    policy_fields = {f.name: f.type for f in msgspec.structs.fields(Policy)}
    assert policy_fields[family.value] == spec.policy_type | None
    assert spec.policy_type in get_args(FamilyPolicy)
    assert spec.evidence_type in get_args(Evidence)
    assert spec.evidence_type.__struct_config__.tag == family.value


@pytest.mark.parametrize("family", list(Family))
def test_every_gauge_reads_a_measurement_of_its_family(family: Family) -> None:
    spec = REGISTRY[family]
    shown = {m.name: m for m in spec.measure(sample(spec.evidence_type))}
    for gauge in spec.gauges:
        assert gauge.measurement in shown, gauge
        assert shown[gauge.measurement].value is not None, gauge
        assert (shown[gauge.measurement].unit == "ms") is gauge.seconds, gauge
        assert gauge.metric.startswith(f"outbox_relay_{family.value}_"), gauge


def test_policy_family_returns_each_section() -> None:
    policy = loose_policy(relay=relay_policy())
    for family, spec in REGISTRY.items():
        assert isinstance(policy.family(family), spec.policy_type)
    assert loose_policy().family(Family.RELAY) is None


def test_a_spec_refuses_another_familys_evidence() -> None:
    spec: FamilySpec[Any, Any] = REGISTRY[Family.OUTBOX]
    assert spec.measure(sample(OutboxEvidence))
    with pytest.raises(AssertionError):
        spec.measure(sample(RelayEvidence))


# Published names: checks["<family>:<name>"] in /health, the status table and page.
MEASUREMENTS = {
    Family.OUTBOX: [
        ("pending_count", "events"),
        ("oldest_pending_age", "ms"),
        ("retrying_count", "events"),
        ("quarantined_count", "events"),
    ],
    Family.SCORING_JOBS: [
        ("active_count", "jobs"),
        ("oldest_active_age", "ms"),
        ("quarantined_count", "jobs"),
        ("expired_lease_count", "leases"),
        ("oldest_expired_lease_age", "ms"),
    ],
    Family.COMPLETION_OUTBOX: [("missing_count", "jobs"), ("oldest_missing_age", "ms")],
    Family.RELAY: [
        ("live_instance_count", "instances"),
        ("instance_count", "instances"),
        ("heartbeat_age", "ms"),
        ("last_publish_age", "ms"),
        ("unowned_lane_count", "lanes"),
        ("lane_count", "lanes"),
        ("oldest_ready_age", "ms"),
        ("blocking_transaction_count", "transactions"),
        ("oldest_blocking_transaction_age", "ms"),
    ],
}

# Published metric names (docs/health.md), in exposition order.
GAUGES = [
    "outbox_relay_outbox_pending_events",
    "outbox_relay_outbox_oldest_pending_age_seconds",
    "outbox_relay_outbox_retrying_events",
    "outbox_relay_outbox_quarantined_events",
    "outbox_relay_scoring_jobs_active",
    "outbox_relay_scoring_jobs_oldest_active_age_seconds",
    "outbox_relay_scoring_jobs_quarantined",
    "outbox_relay_scoring_jobs_expired_leases",
    "outbox_relay_scoring_jobs_oldest_expired_lease_age_seconds",
    "outbox_relay_completion_outbox_missing_events",
    "outbox_relay_relay_live_instances",
    "outbox_relay_relay_heartbeat_age_seconds",
    "outbox_relay_relay_unowned_lanes",
    "outbox_relay_relay_blocking_transaction_age_seconds",
]


def test_published_measurement_and_metric_names_are_unchanged() -> None:
    for family, spec in REGISTRY.items():
        shown = [(m.name, m.unit) for m in spec.measure(sample(spec.evidence_type))]
        assert shown == MEASUREMENTS[family], family
    assert [g.metric for spec in REGISTRY.values() for g in spec.gauges] == GAUGES
