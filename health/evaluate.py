"""One evaluation: run each enabled family's probe and classification, then compose."""

from __future__ import annotations

import time

import asyncpg

from contracts.health import Classification, Evidence, FamilyResult, HealthReport
from contracts.policy import Family, Policy
from health.errors import ProbeFailure
from health.families import REGISTRY
from health.families.base import ProbeContext
from health.families.completion_tracker import CompletionTracker
from health.probing import CONNECT_ERRORS, connect_failure, probe_failure
from health.rules import build_report
from pgconnect import DB_ERRORS
from pgconnect.schema import SCHEMA_BEHIND, SchemaNeeds, read_shortfall


def _now_unix_ms() -> int:
    return time.time_ns() // 1_000_000


def _gates(policy: Policy, family: Family) -> bool:
    section = policy.family(family)
    return section is not None and section.gates_readiness


def unknown_report(policy: Policy, *reasons: str) -> HealthReport:
    """Every enabled family unknown for one reason (database unreachable, evaluation timed
    out, the schema behind what the probes read)."""
    results = [
        FamilyResult(
            family=family,
            classification=Classification.UNKNOWN,
            reasons=reasons,
            gates_readiness=_gates(policy, family),
            evidence=None,
        )
        for family in policy.enabled_families()
    ]
    return build_report(results, _now_unix_ms())


def reissue(report: HealthReport) -> HealthReport:
    """The same results stamped now: what the sidecar serves between database retries."""
    return build_report(report.families, _now_unix_ms())


async def evaluate_connection(
    conn: asyncpg.Connection,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None = None,
    schema: SchemaNeeds | None = None,
) -> HealthReport:
    """Probe every enabled family on one connection; a failed probe makes only its family unknown.

    With ``completion`` (the sidecar's tracker) ``completion_outbox`` is checked
    incrementally; without it (``check``, ``status``) the whole look-back window is checked.
    With ``schema``, a database below it is no probe's business: every family is unknown,
    :data:`~pgconnect.schema.SCHEMA_BEHIND` and what is missing.
    """
    if schema is not None:
        try:
            shortfall = await read_shortfall(conn, schema)
        except DB_ERRORS as exc:
            return unknown_report(policy, probe_failure(exc).reason)
        if shortfall is not None:
            return unknown_report(policy, SCHEMA_BEHIND, str(shortfall))
    context = ProbeContext(receipt_retention_ms=receipt_retention_ms, completion=completion)
    results = []
    for family in policy.enabled_families():
        section = policy.family(family)
        assert section is not None  # enabled
        evidence: Evidence | None
        try:
            evidence, (classification, reasons) = await REGISTRY[family].evaluate(
                conn, section, context
            )
        except ProbeFailure as failure:
            evidence, classification, reasons = None, Classification.UNKNOWN, (failure.reason,)
        results.append(
            FamilyResult(
                family=family,
                classification=classification,
                reasons=reasons,
                gates_readiness=section.gates_readiness,
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
    schema: SchemaNeeds | None = None,
) -> HealthReport:
    """One full evaluation on a connection or a pool; an unreachable database is all-unknown."""
    if isinstance(source, asyncpg.Pool):
        report, _unreachable = await evaluate_pool(
            source,
            policy,
            receipt_retention_ms=receipt_retention_ms,
            completion=completion,
            schema=schema,
        )
        return report
    return await evaluate_connection(
        source,
        policy,
        receipt_retention_ms=receipt_retention_ms,
        completion=completion,
        schema=schema,
    )


async def evaluate_pool(
    pool: asyncpg.Pool,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    completion: CompletionTracker | None = None,
    schema: SchemaNeeds | None = None,
) -> tuple[HealthReport, str | None]:
    """One evaluation on a pool connection, and why no connection could be had (else None)."""
    if not policy.enabled_families():
        # Nothing to probe (a relay-only process): no connection is opened for it.
        return build_report((), _now_unix_ms()), None
    try:
        async with pool.acquire() as conn:
            report = await evaluate_connection(
                conn,
                policy,
                receipt_retention_ms=receipt_retention_ms,
                completion=completion,
                schema=schema,
            )
    except CONNECT_ERRORS as exc:
        if completion is not None:
            completion.reset()
        reason = connect_failure(exc)
        return unknown_report(policy, reason), reason
    return report, None
