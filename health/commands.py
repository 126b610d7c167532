"""One-shot evaluations for ``outbox-relay check`` and ``outbox-relay status``."""

from __future__ import annotations

import contextlib
import logging

import asyncpg

from contracts import __version__
from contracts.health import Classification, HealthReport
from contracts.policy import Policy
from health import schema
from health.evaluate import evaluate, unknown_report
from health.probing import CONNECT_ERRORS, connect_failure
from health.render.document import encode_json, health_document
from health.render.table import STATUS_WIDTH, status_table
from pgconnect import DB_ERRORS, connection_options, learn_types

_log = logging.getLogger(__name__)

# Grantees of CREATE on the outbox's schema besides its owner, counted (0 is PUBLIC).
_SCHEMA_CREATORS = """
SELECT n.nspname,
       bool_or(a.grantee = 0::oid) AS public,
       count(*) FILTER (WHERE a.grantee <> 0::oid) AS roles
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN LATERAL aclexplode(coalesce(n.nspacl, acldefault('n'::"char", n.nspowner))) a
WHERE c.oid = to_regclass('outbox')::oid AND a.privilege_type = 'CREATE'
  AND a.grantee <> n.nspowner
GROUP BY n.nspname
"""

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
    warn_schema_creators: bool = False,
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
        with contextlib.suppress(*DB_ERRORS):  # the evaluation finds the database as it is
            await learn_types(conn)
        report = await evaluate(
            conn, policy, receipt_retention_ms=receipt_retention_ms, schema=schema.NEEDS
        )
        if warn_schema_creators:
            await _warn_if_others_may_create(conn)
        return report
    finally:
        conn.terminate()  # nothing to flush; never wait on a slow server here


async def _warn_if_others_may_create(conn: asyncpg.Connection) -> None:
    """One warning line when PUBLIC or a role besides its owner may create in the schema."""
    try:
        row = await conn.fetchrow(_SCHEMA_CREATORS)
    except (asyncpg.PostgresError, OSError, TimeoutError):
        return  # the evaluation already said what it could; this is advice, not health
    if row is None:
        return
    who = ["PUBLIC"] if row["public"] else []
    if row["roles"]:
        who.append(f"{row['roles']} role(s) besides its owner")
    # Counts only: the health surface names no role.
    _log.warning(
        "%s may create objects in schema %s: a function or operator put there can run "
        "inside the transactions of every role that uses the schema; take it away with "
        "REVOKE CREATE (docs/security.md, names a neighbour cannot take over)",
        " and ".join(who),
        row["nspname"] if row["nspname"].isprintable() else repr(row["nspname"]),
        extra={"public_may_create": bool(row["public"]), "roles_may_create": row["roles"]},
    )


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
        warn_schema_creators=True,
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
    width: int = STATUS_WIDTH,
) -> tuple[str, int]:
    """A human-readable table of the same evaluation, ``width`` columns wide, and the same
    exit code."""
    report = await evaluate_once(
        database_url,
        policy,
        receipt_retention_ms=receipt_retention_ms,
        transaction_pooler=transaction_pooler,
    )
    # No trailing newline: the CLI prints it.
    table = status_table(report, policy, colour=colour, width=width)
    return table.rstrip("\n"), EXIT_CODES[report.classification]
