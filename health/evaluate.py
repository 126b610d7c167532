"""One evaluation: run each enabled family's probe, classify, compose."""

from __future__ import annotations

import time

import asyncpg

from contracts.health import Classification, Evidence, FamilyResult, HealthReport
from contracts.policy import (
    CompletionOutboxPolicy,
    Family,
    OutboxPolicy,
    Policy,
    RelayPolicy,
    ScoringJobsPolicy,
)
from health.classify import (
    Verdict,
    build_report,
    classify_completion_outbox,
    classify_outbox,
    classify_relay,
    classify_scoring_jobs,
)
from health.completion import CompletionTracker
from health.errors import ProbeFailure
from health.probes import (
    probe_completion_outbox,
    probe_failure,
    probe_outbox,
    probe_relay,
    probe_scoring_jobs,
)


def _now_unix_ms() -> int:
    return time.time_ns() // 1_000_000


async def _family(
    conn: asyncpg.Connection,
    family: Family,
    policy: Policy,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None,
) -> tuple[Evidence, Verdict]:
    section = policy.family(family)
    if isinstance(section, OutboxPolicy):
        outbox = await probe_outbox(conn)
        return outbox, classify_outbox(outbox, section)
    if isinstance(section, ScoringJobsPolicy):
        jobs = await probe_scoring_jobs(conn)
        return jobs, classify_scoring_jobs(jobs, section)
    if isinstance(section, CompletionOutboxPolicy):
        if completion is None:  # one-shot: the full check
            evidence = await probe_completion_outbox(
                conn, section, receipt_retention_ms=receipt_retention_ms
            )
        else:  # the sidecar: only what changed since its last evaluation
            evidence = await completion.probe(
                conn, section, receipt_retention_ms=receipt_retention_ms
            )
        return evidence, classify_completion_outbox(evidence, section)
    if isinstance(section, RelayPolicy):
        relay = await probe_relay(conn, section)
        return relay, classify_relay(relay, section)
    raise AssertionError(f"no probe for {family}")  # only enabled families get here


def _gates(policy: Policy, family: Family) -> bool:
    section = policy.family(family)
    return section is not None and section.gates_readiness


def unknown_report(policy: Policy, reason: str) -> HealthReport:
    """Every enabled family unknown for one reason (database unreachable, evaluation timed out)."""
    results = [
        FamilyResult(
            family=family,
            classification=Classification.UNKNOWN,
            reasons=(reason,),
            gates_readiness=_gates(policy, family),
            evidence=None,
        )
        for family in policy.enabled_families()
    ]
    return build_report(results, _now_unix_ms())


async def evaluate_connection(
    conn: asyncpg.Connection,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None = None,
) -> HealthReport:
    """Probe every enabled family on one connection; a failed probe makes only its family unknown.

    With ``completion`` (the sidecar's tracker) ``completion_outbox`` is checked
    incrementally; without it (``check``, ``status``) the whole look-back window is checked.
    """
    results = []
    for family in policy.enabled_families():
        try:
            evidence, (classification, reasons) = await _family(
                conn, family, policy, receipt_retention_ms, completion
            )
        except ProbeFailure as failure:
            results.append(
                FamilyResult(
                    family=family,
                    classification=Classification.UNKNOWN,
                    reasons=(failure.reason,),
                    gates_readiness=_gates(policy, family),
                    evidence=None,
                )
            )
            continue
        results.append(
            FamilyResult(
                family=family,
                classification=classification,
                reasons=reasons,
                gates_readiness=_gates(policy, family),
                evidence=evidence,
            )
        )
    return build_report(results, _now_unix_ms())


async def evaluate(
    source: asyncpg.Connection | asyncpg.Pool,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None = None,
) -> HealthReport:
    """One full evaluation on a connection or a pool; an unreachable database is all-unknown."""
    if isinstance(source, asyncpg.Pool):
        return await _with_pool(source, policy, receipt_retention_ms, completion)
    return await evaluate_connection(
        source, policy, receipt_retention_ms=receipt_retention_ms, completion=completion
    )


async def _with_pool(
    pool: asyncpg.Pool,
    policy: Policy,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None,
) -> HealthReport:
    try:
        async with pool.acquire() as conn:
            return await evaluate_connection(
                conn, policy, receipt_retention_ms=receipt_retention_ms, completion=completion
            )
    except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, ValueError) as exc:
        if completion is not None:
            completion.reset()
        return unknown_report(policy, probe_failure(exc).reason)
