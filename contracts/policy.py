"""The operator's health policy: bounds per family, with no built-in SLO defaults.

A family is either configured with every bound or disabled (``enabled = false`` in the
file, ``None`` here). Only :class:`EvaluationSettings` has defaults: they describe how
often the sidecar looks, not what counts as healthy.
"""

from __future__ import annotations

import enum
from typing import assert_never

import msgspec


class Family(enum.StrEnum):
    """The health families, in report order."""

    OUTBOX = "outbox"
    SCORING_JOBS = "scoring_jobs"
    COMPLETION_OUTBOX = "completion_outbox"
    RELAY = "relay"


class OutboxPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds on the relay's own backlog (rows not yet published)."""

    max_pending_count: int
    max_pending_age_ms: int
    max_quarantined_count: int
    gates_readiness: bool


class ScoringJobsPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The scoring service's ``ScoringJobBacklogPolicy``, field for field."""

    max_active_job_count: int
    max_active_job_age_ms: int
    max_quarantined_job_count: int
    max_expired_lease_count: int
    gates_readiness: bool


class CompletionOutboxPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Terminal jobs older than ``grace_ms`` and younger than ``lookback_ms`` must have an event."""

    grace_ms: int
    lookback_ms: int
    max_missing_count: int
    gates_readiness: bool


class RelayPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The relay's own progress, read from its heartbeat and lane tables."""

    max_heartbeat_age_ms: int
    """Newest relay heartbeat may be at most this old."""
    max_unowned_lane_count: int
    """Lanes with no owner or an expired lease."""
    max_publish_stall_ms: int
    """How long ready work may wait with no publish at all."""
    max_blocking_transaction_age_ms: int
    """Oldest open transaction holding a lock on ``outbox`` (it holds the relay back)."""
    gates_readiness: bool


class EvaluationSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the sidecar evaluates; not bounds, so these have defaults."""

    interval_ms: int = 5000
    timeout_ms: int = 4000
    """Budget for one whole evaluation (connect + every probe)."""
    max_evidence_age_ms: int = 15000
    """A cached report older than this is served as unknown."""


FamilyPolicy = OutboxPolicy | ScoringJobsPolicy | CompletionOutboxPolicy | RelayPolicy


class Policy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole policy file; a family that is ``None`` is disabled."""

    outbox: OutboxPolicy | None
    scoring_jobs: ScoringJobsPolicy | None
    completion_outbox: CompletionOutboxPolicy | None
    relay: RelayPolicy | None
    evaluation: EvaluationSettings = EvaluationSettings()

    def family(self, family: Family) -> FamilyPolicy | None:
        """The section for one family, or None when it is disabled."""
        # A match, not getattr: a Family member without its field fails the type check.
        match family:
            case Family.OUTBOX:
                return self.outbox
            case Family.SCORING_JOBS:
                return self.scoring_jobs
            case Family.COMPLETION_OUTBOX:
                return self.completion_outbox
            case Family.RELAY:
                return self.relay
            case _:
                assert_never(family)

    def enabled_families(self) -> tuple[Family, ...]:
        """Families with a policy, in report order."""
        return tuple(f for f in Family if self.family(f) is not None)
