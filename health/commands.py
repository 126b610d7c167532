"""One-shot evaluations for ``outbox-relay check`` and ``outbox-relay status``."""

from __future__ import annotations

import asyncpg

from contracts import __version__
from contracts.health import Classification, HealthReport
from contracts.policy import Policy
from health.evaluate import evaluate, unknown_report
from health.probing import CONNECT_ERRORS, connect_failure
from health.render import encode_json, health_document, status_table
from pgconnect import connection_options

# monitoring-plugins convention: OK, CRITICAL, UNKNOWN.
EXIT_CODES = {
    Classification.WITHIN_BOUNDS: 0,
    Classification.STALLED: 2,
    Classification.UNKNOWN: 3,
}


async def evaluate_once(
    database_url: str | None,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    timeout_s: float | None = None,
    transaction_pooler: bool = False,
) -> HealthReport:
    """Connect, evaluate every enabled family, disconnect; an unreachable database is all-unknown."""
    timeout = timeout_s if timeout_s is not None else policy.evaluation.timeout_ms / 1000
    try:
        conn = await asyncpg.connect(
            database_url,
            timeout=timeout,
            command_timeout=timeout,
            **connection_options(
                {"application_name": "outbox-relay-check", "default_transaction_read_only": "on"},
                transaction_pooler=transaction_pooler,
            ),
        )
    except CONNECT_ERRORS as exc:
        return unknown_report(policy, connect_failure(exc))
    try:
        return await evaluate(conn, policy, receipt_retention_ms=receipt_retention_ms)
    finally:
        conn.terminate()  # nothing to flush; never wait on a slow server here


async def check(
    database_url: str | None,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    transaction_pooler: bool = False,
) -> tuple[str, int]:
    """The health report as ``application/health+json`` text and the exit code (0/2/3)."""
    report = await evaluate_once(
        database_url,
        policy,
        receipt_retention_ms=receipt_retention_ms,
        transaction_pooler=transaction_pooler,
    )
    document = health_document(report, release=__version__, policy=policy)
    return encode_json(document).decode("utf-8"), EXIT_CODES[report.classification]


async def status(
    database_url: str | None,
    policy: Policy,
    *,
    receipt_retention_ms: int | None,
    transaction_pooler: bool = False,
    colour: bool = False,
) -> tuple[str, int]:
    """A human-readable table of the same evaluation and the same exit code."""
    report = await evaluate_once(
        database_url,
        policy,
        receipt_retention_ms=receipt_retention_ms,
        transaction_pooler=transaction_pooler,
    )
    # No trailing newline: the CLI prints it.
    table = status_table(report, policy, colour=colour)
    return table.rstrip("\n"), EXIT_CODES[report.classification]
