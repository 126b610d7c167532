"""Classification rules, one table row per rule, and composition: pure, no database."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.health import (
    Classification,
    CompletionOutboxEvidence,
    FamilyResult,
    OutboxEvidence,
    RelayEvidence,
    ScoringJobsEvidence,
)
from contracts.policy import CompletionOutboxPolicy, Family, OutboxPolicy, ScoringJobsPolicy
from health.families.completion_outbox import classify_completion_outbox
from health.families.outbox import classify_outbox
from health.families.relay import classify_relay
from health.families.scoring_jobs import classify_scoring_jobs
from health.rules import build_report, compose, mark_stale
from tests.support.policies import relay_policy

W, S, U = Classification.WITHIN_BOUNDS, Classification.STALLED, Classification.UNKNOWN
NOW = 1_800_000_000_000

JOBS_POLICY = ScoringJobsPolicy(
    max_active_job_count=10,
    max_active_job_age_ms=60_000,
    max_quarantined_job_count=0,
    max_expired_lease_count=0,
    gates_readiness=True,
)


def jobs(**changes: Any) -> ScoringJobsEvidence:
    values: dict[str, Any] = {
        "observed_at_unix_ms": NOW,
        "active_count": 3,
        "oldest_active_created_at_unix_ms": NOW - 1000,
        "quarantined_count": 0,
        "expired_lease_count": 0,
        "oldest_expired_lease_expires_at_unix_ms": None,
    }
    return ScoringJobsEvidence(**(values | changes))


@pytest.mark.parametrize(
    ("evidence", "policy_changes", "expected", "reason"),
    [
        pytest.param(
            jobs(active_count=0, oldest_active_created_at_unix_ms=None), {}, W, None, id="empty"
        ),
        pytest.param(jobs(), {}, W, None, id="within"),
        pytest.param(jobs(active_count=10), {}, W, None, id="count-at-bound"),
        pytest.param(
            jobs(active_count=11),
            {},
            S,
            "active_count 11 > max_active_job_count 10",
            id="count-over",
        ),
        pytest.param(
            jobs(oldest_active_created_at_unix_ms=NOW - 60_000), {}, W, None, id="age-at-bound"
        ),
        pytest.param(
            jobs(oldest_active_created_at_unix_ms=NOW - 60_001),
            {},
            S,
            "oldest active job age 60001 ms > max_active_job_age_ms 60000 ms",
            id="age-over",
        ),
        pytest.param(
            jobs(quarantined_count=1),
            {},
            S,
            "quarantined_count 1 > max_quarantined_job_count 0",
            id="quarantine",
        ),
        pytest.param(
            jobs(expired_lease_count=1, oldest_expired_lease_expires_at_unix_ms=NOW - 5),
            {},
            S,
            "expired_lease_count 1 > max_expired_lease_count 0",
            id="expired-lease-bound-0",
        ),
        pytest.param(
            jobs(expired_lease_count=1, oldest_expired_lease_expires_at_unix_ms=NOW - 5),
            {"max_expired_lease_count": 1},
            W,
            None,
            id="expired-lease-bound-1",
        ),
        pytest.param(
            jobs(observed_at_unix_ms=None), {}, U, "observation time is missing", id="no-clock"
        ),
        pytest.param(
            jobs(observed_at_unix_ms=0), {}, U, "observation time is missing", id="zero-clock"
        ),
        pytest.param(
            jobs(oldest_active_created_at_unix_ms=NOW + 1),
            {},
            U,
            "oldest_active_created_at_unix_ms is 1 ms later than the observation time",
            id="future-created",
        ),
        pytest.param(
            jobs(oldest_active_created_at_unix_ms=0),
            {},
            U,
            "stored oldest_active_created_at_unix_ms is 0, not a positive time",
            id="epoch-zero-created",
        ),
        pytest.param(
            jobs(expired_lease_count=1, oldest_expired_lease_expires_at_unix_ms=-3),
            {},
            U,
            "stored oldest_expired_lease_expires_at_unix_ms is -3, not a positive time",
            id="negative-expiry",
        ),
        pytest.param(
            # Unknown is decided before any bound: a broken clock is never "stalled".
            jobs(observed_at_unix_ms=None, active_count=999),
            {},
            U,
            "observation time is missing",
            id="unknown-before-stalled",
        ),
    ],
)
def test_scoring_jobs_rules(
    evidence: ScoringJobsEvidence,
    policy_changes: dict[str, Any],
    expected: Classification,
    reason: str | None,
) -> None:
    policy = ScoringJobsPolicy(**{**_fields(JOBS_POLICY), **policy_changes})
    classification, reasons = classify_scoring_jobs(evidence, policy)
    assert classification is expected
    if reason is None:
        assert reasons == ()
    else:
        assert reason in reasons


def test_expired_lease_is_not_masked_by_healthy_count_and_age() -> None:
    evidence = jobs(
        active_count=1, expired_lease_count=1, oldest_expired_lease_expires_at_unix_ms=NOW - 1
    )
    assert classify_scoring_jobs(evidence, JOBS_POLICY)[0] is S


def test_counts_then_ages_all_reported() -> None:
    evidence = jobs(
        active_count=11, oldest_active_created_at_unix_ms=NOW - 70_000, quarantined_count=2
    )
    classification, reasons = classify_scoring_jobs(evidence, JOBS_POLICY)
    assert classification is S
    assert [r.split()[0] for r in reasons] == ["active_count", "quarantined_count", "oldest"]


OUTBOX_POLICY = OutboxPolicy(
    max_pending_count=5, max_pending_age_ms=1000, max_quarantined_count=0, gates_readiness=True
)


def outbox(**changes: Any) -> OutboxEvidence:
    values: dict[str, Any] = {
        "observed_at_unix_ms": NOW,
        "pending_count": 1,
        "oldest_pending_created_at_unix_ms": NOW - 10,
        "retrying_count": 0,
        "quarantined_count": 0,
    }
    return OutboxEvidence(**(values | changes))


@pytest.mark.parametrize(
    ("evidence", "expected", "reason"),
    [
        (outbox(pending_count=0, oldest_pending_created_at_unix_ms=None), W, None),
        (outbox(retrying_count=1), W, None),
        (outbox(pending_count=6), S, "pending_count 6 > max_pending_count 5"),
        (outbox(oldest_pending_created_at_unix_ms=NOW - 1001), S, "oldest pending age 1001 ms"),
        (outbox(quarantined_count=1), S, "quarantined_count 1 > max_quarantined_count 0"),
        (outbox(observed_at_unix_ms=None), U, "observation time is missing"),
        (outbox(oldest_pending_created_at_unix_ms=NOW + 5), U, "5 ms later than the observation"),
        (outbox(oldest_pending_created_at_unix_ms=0), U, "is 0, not a positive time"),
    ],
)
def test_outbox_rules(
    evidence: OutboxEvidence, expected: Classification, reason: str | None
) -> None:
    classification, reasons = classify_outbox(evidence, OUTBOX_POLICY)
    assert classification is expected
    assert (reasons == ()) if reason is None else any(reason in r for r in reasons)


COMPLETION_POLICY = CompletionOutboxPolicy(
    grace_ms=1000, lookback_ms=10_000, max_missing_count=0, gates_readiness=True
)


def completion(**changes: Any) -> CompletionOutboxEvidence:
    values: dict[str, Any] = {
        "observed_at_unix_ms": NOW,
        "missing_count": 0,
        "oldest_missing_updated_at_unix_ms": None,
        "grace_ms": 1000,
        "lookback_ms": 10_000,
        "receipt_retention_ms": 10_000,
    }
    return CompletionOutboxEvidence(**(values | changes))


@pytest.mark.parametrize(
    ("evidence", "expected", "reason"),
    [
        (completion(), W, None),
        (
            completion(missing_count=1, oldest_missing_updated_at_unix_ms=NOW - 2000),
            S,
            "missing_count 1 > max_missing_count 0",
        ),
        # Receipts pruned inside the window: a published event looks missing, so never stalled.
        (
            completion(
                missing_count=4,
                oldest_missing_updated_at_unix_ms=NOW - 2000,
                receipt_retention_ms=9_999,
            ),
            U,
            "lookback_ms 10000 > receipt retention 9999 ms",
        ),
        (completion(receipt_retention_ms=None), U, "receipt retention is not known"),
        (completion(observed_at_unix_ms=None), U, "observation time is missing"),
    ],
)
def test_completion_outbox_rules(
    evidence: CompletionOutboxEvidence, expected: Classification, reason: str | None
) -> None:
    classification, reasons = classify_completion_outbox(evidence, COMPLETION_POLICY)
    assert classification is expected
    assert (reasons == ()) if reason is None else any(reason in r for r in reasons)


def relay(**changes: Any) -> RelayEvidence:
    values: dict[str, Any] = {
        "observed_at_unix_ms": NOW,
        "instance_count": 1,
        "live_instance_count": 1,
        "newest_heartbeat_at_unix_ms": NOW - 1000,
        "newest_publish_at_unix_ms": NOW - 5000,
        "lane_count": 64,
        "unowned_lane_count": 0,
        "oldest_ready_created_at_unix_ms": None,
        "blocking_transaction_count": 0,
        "oldest_blocking_transaction_started_at_unix_ms": None,
    }
    return RelayEvidence(**(values | changes))


@pytest.mark.parametrize(
    ("evidence", "expected", "reason"),
    [
        (relay(), W, None),
        # Idle relay: nothing ready, so a long-ago last publish is fine.
        (relay(newest_publish_at_unix_ms=NOW - 10**9), W, None),
        (relay(unowned_lane_count=3), S, "unowned_lane_count 3 > max_unowned_lane_count 0"),
        (relay(newest_heartbeat_at_unix_ms=NOW - 10_001), S, "newest heartbeat age 10001 ms"),
        (
            relay(instance_count=0, live_instance_count=0, newest_heartbeat_at_unix_ms=None),
            S,
            "no relay instance has recorded a heartbeat",
        ),
        # Ready work older than the bound and no publish since it was written.
        (
            relay(
                oldest_ready_created_at_unix_ms=NOW - 40_000, newest_publish_at_unix_ms=NOW - 50_000
            ),
            S,
            "ready events unpublished for 40000 ms",
        ),
        # Old ready work, but the relay published recently: it is progressing.
        (
            relay(
                oldest_ready_created_at_unix_ms=NOW - 40_000, newest_publish_at_unix_ms=NOW - 100
            ),
            W,
            None,
        ),
        (
            relay(oldest_ready_created_at_unix_ms=NOW - 40_000, newest_publish_at_unix_ms=None),
            S,
            "ready events unpublished for 40000 ms",
        ),
        (
            relay(
                blocking_transaction_count=1,
                oldest_blocking_transaction_started_at_unix_ms=NOW - 60_001,
            ),
            S,
            "oldest blocking transaction age 60001 ms",
        ),
        (relay(newest_heartbeat_at_unix_ms=NOW + 1), U, "later than the observation time"),
        (relay(observed_at_unix_ms=0), U, "observation time is missing"),
    ],
)
def test_relay_rules(evidence: RelayEvidence, expected: Classification, reason: str | None) -> None:
    classification, reasons = classify_relay(evidence, relay_policy())
    assert classification is expected
    assert (reasons == ()) if reason is None else any(reason in r for r in reasons)


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((), W),
        ((W,), W),
        ((W, W), W),
        ((W, U), U),
        ((U, W), U),
        ((W, S), S),
        ((S, U), S),
        ((U, S, W), S),
    ],
)
def test_compose_worst_wins(parts: tuple[Classification, ...], expected: Classification) -> None:
    assert compose(parts) is expected


def _result(family: Family, classification: Classification, gates: bool = True) -> FamilyResult:
    return FamilyResult(
        family=family,
        classification=classification,
        reasons=(),
        gates_readiness=gates,
        evidence=None,
    )


def test_healthy_outbox_cannot_hide_stalled_scoring_queue() -> None:
    report = build_report([_result(Family.OUTBOX, W), _result(Family.SCORING_JOBS, S)], NOW)
    assert report.classification is S
    assert report.readiness is S


def test_non_gating_family_affects_overall_but_not_readiness() -> None:
    report = build_report([_result(Family.OUTBOX, W), _result(Family.RELAY, S, gates=False)], NOW)
    assert report.classification is S
    assert report.readiness is W


def test_stale_evidence_is_unknown() -> None:
    report = build_report([_result(Family.OUTBOX, W)], NOW)
    assert mark_stale(report, 1000, 1000) is report
    stale = mark_stale(report, 1001, 1000)
    assert stale.classification is U
    assert stale.readiness is U
    assert stale.families[0].reasons == ("evidence is 1001 ms old > max_evidence_age_ms 1000 ms",)


def _fields(policy: ScoringJobsPolicy) -> dict[str, Any]:
    return {name: getattr(policy, name) for name in policy.__struct_fields__}
