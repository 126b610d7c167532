"""Health contracts encode, decode and export a JSON Schema for downstream readers."""

from __future__ import annotations

import msgspec

from contracts.health import (
    Classification,
    FamilyResult,
    HealthReport,
    OutboxEvidence,
)
from contracts.policy import Family, Policy


def test_report_round_trips_through_json() -> None:
    report = HealthReport(
        classification=Classification.STALLED,
        readiness=Classification.WITHIN_BOUNDS,
        evaluated_at_unix_ms=1_800_000_000_000,
        families=(
            FamilyResult(
                family=Family.OUTBOX,
                classification=Classification.STALLED,
                reasons=("pending_count 2 > max_pending_count 1",),
                gates_readiness=False,
                evidence=OutboxEvidence(
                    observed_at_unix_ms=1_800_000_000_000,
                    pending_count=2,
                    oldest_pending_created_at_unix_ms=1_799_999_999_000,
                    retrying_count=0,
                    quarantined_count=0,
                ),
            ),
        ),
    )
    encoded = msgspec.json.encode(report)
    assert b'"kind":"outbox"' in encoded
    assert msgspec.json.decode(encoded, type=HealthReport) == report


def test_json_schemas_export() -> None:
    report_schema = msgspec.json.schema(HealthReport)
    assert "OutboxEvidence" in report_schema["$defs"]
    assert set(report_schema["$defs"]["Classification"]["enum"]) == {
        "within_bounds",
        "stalled",
        "unknown",
    }
    policy_schema = msgspec.json.schema(Policy)
    assert "RelayPolicy" in policy_schema["$defs"]
