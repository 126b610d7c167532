"""Sidecar policies for tests: bounds loose enough that nothing is stalled unless a test
tightens one family, the receipt retention the sidecar is started with, and its completion
re-check period."""

from __future__ import annotations

from typing import Any

from contracts.policy import (
    CompletionOutboxPolicy,
    EvaluationSettings,
    OutboxPolicy,
    Policy,
    RelayPolicy,
    ScoringJobsPolicy,
)
from health.config import SidecarConfig

RECEIPT_RETENTION_MS = 7 * 86_400_000
SIDECAR_RECHECK_MS = SidecarConfig.completion_recheck_period_ms
"""The completion tracker's rolling re-check period as the sidecar runs it by default."""


def loose_policy(**overrides: Any) -> Policy:
    """Bounds wide enough that nothing is stalled unless a test tightens one family."""
    families: dict[str, Any] = {
        "outbox": OutboxPolicy(
            max_pending_count=1000,
            max_pending_age_ms=3_600_000,
            max_quarantined_count=10,
            gates_readiness=True,
        ),
        "scoring_jobs": ScoringJobsPolicy(
            max_active_job_count=1000,
            max_active_job_age_ms=3_600_000,
            max_quarantined_job_count=10,
            max_expired_lease_count=10,
            gates_readiness=True,
        ),
        "completion_outbox": CompletionOutboxPolicy(
            grace_ms=30_000, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
        ),
        "relay": None,
        "evaluation": EvaluationSettings(
            interval_ms=100, timeout_ms=2000, max_evidence_age_ms=5000
        ),
    }
    families.update(overrides)
    return Policy(**families)


def relay_policy(**overrides: Any) -> RelayPolicy:
    """The relay family's section, loose in the same way."""
    values: dict[str, Any] = {
        "max_heartbeat_age_ms": 10_000,
        "max_unowned_lane_count": 0,
        "max_publish_stall_ms": 30_000,
        "max_blocking_transaction_age_ms": 60_000,
        "gates_readiness": True,
    }
    values.update(overrides)
    return RelayPolicy(**values)
