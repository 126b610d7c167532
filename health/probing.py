"""Probe plumbing shared by every family: the clock fragment, running one statement, errors.

Each probe statement reads the database clock once (``statement_timestamp()``, so a probe
run inside a caller's long transaction is still current) and compares every stored time
with it. Times are unix milliseconds, rounded (not truncated) as the scoring service does.

Every call in a probe has pg_catalog's exact argument types (``1000::numeric``,
``$1::bigint::double precision * interval …``, ``pg_catalog.count(DISTINCT …)``), so that no
function or operator another role puts on the search path can take it
(tests/security/test_exact_calls.py).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from health.errors import ProbeFailure
from pgconnect import DB_ERRORS, unavailable_cause

# The largest magnitude of a unix-milliseconds value in evidence: JSON readers that parse
# numbers as doubles (the status page) keep every integer up to it exact.
_MS_LIMIT = 2**53 - 1


def unix_ms(timestamp: str) -> str:
    """SQL: a ``timestamptz`` expression as unix milliseconds, rounded to the nearest one.

    ``-infinity`` and ``infinity`` (which a writer may store) become -/+ 2**53 - 1: older
    or later than any bound, so they are classified, where casting them fails the probe.
    """
    # greatest and least ignore NULL, so NULL (no such time) is kept by the CASE
    return (
        f"CASE WHEN {timestamp} IS NOT NULL THEN round(greatest(-{_MS_LIMIT},"
        f" least({_MS_LIMIT}, extract(epoch FROM {timestamp}) * 1000::numeric)))::bigint END"
    )


def unix_us(timestamp: str) -> str:
    """SQL: a ``timestamptz`` expression as unix microseconds (its exact precision)."""
    return f"(extract(epoch FROM {timestamp}) * 1000000::numeric)::bigint"


# `clock` is evaluated once per statement; every comparison in a probe reads it.
CLOCK = f"""
WITH clock AS (
    SELECT statement_timestamp() AS now,
           {unix_ms("statement_timestamp()")} AS now_ms
)
"""


# What acquiring a connection may raise on top of the driver's errors: asyncpg's DSN
# parser raises ValueError. Each maps to a reason through connect_failure().
CONNECT_ERRORS: tuple[type[BaseException], ...] = (*DB_ERRORS, ValueError)


NOT_MIGRATED = "a table the probe reads is missing (42P01): run `outbox-relay migrate`"
"""The reason a probe gives when its table is missing: nearly always an unmigrated database
(or a migration job still running)."""


def connect_failure(exc: BaseException) -> str:
    """Why no connection could be had, without driver text: the reason every family gets."""
    # asyncpg's DSN parser; a certificate failure is a ValueError too, but also an OSError
    if isinstance(exc, ValueError) and not isinstance(exc, OSError):
        return "database URL could not be parsed"
    # Timeouts included: a connection attempt that timed out says nothing about a probe.
    return f"database unavailable: {unavailable_cause(exc)}"


def probe_failure(exc: BaseException) -> ProbeFailure:
    """Map a driver error to a :class:`ProbeFailure` whose reason carries no driver text."""
    if isinstance(exc, ProbeFailure):
        return exc
    if isinstance(exc, asyncpg.UndefinedTableError):
        return ProbeFailure(NOT_MIGRATED)
    if isinstance(exc, asyncpg.UndefinedColumnError):
        return ProbeFailure("a column the probe reads is missing (42703)")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return ProbeFailure("permission denied on a table the probe reads (42501)")
    if isinstance(exc, asyncpg.QueryCanceledError | TimeoutError):
        return ProbeFailure("probe timed out")
    # A backend terminated by an administrator or a server shutdown reads as its FATAL
    # message, a connection-class error or a closed socket, whichever the driver meets
    # first: one reason for all of them.
    if isinstance(
        exc,
        asyncpg.AdminShutdownError | asyncpg.CrashShutdownError | asyncpg.PostgresConnectionError,
    ):
        return ProbeFailure("database connection failed")
    if isinstance(exc, asyncpg.PostgresError):
        return ProbeFailure(f"database refused the probe ({exc.sqlstate})")
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        return ProbeFailure("database connection failed")
    # asyncpg's DSN parser; a certificate failure is a ValueError too, but also an OSError
    if isinstance(exc, ValueError) and not isinstance(exc, OSError):
        return ProbeFailure("database URL could not be parsed")
    return ProbeFailure(f"database unavailable: {unavailable_cause(exc)}")


_SAVEPOINT = "SAVEPOINT outbox_relay_health_probe"
_RELEASE = "RELEASE SAVEPOINT outbox_relay_health_probe"
_ROLLBACK = "ROLLBACK TO SAVEPOINT outbox_relay_health_probe"


async def _fetch_in_savepoint(
    conn: asyncpg.Connection, query: str, *args: object
) -> asyncpg.Record | None:
    # Plain SQL rather than conn.transaction(): the caller may have begun its
    # transaction with BEGIN, which asyncpg's nested transactions refuse.
    await conn.execute(_SAVEPOINT)
    try:
        row: asyncpg.Record | None = await conn.fetchrow(query, *args)
    except asyncpg.PostgresError:
        await conn.execute(_ROLLBACK)
        await conn.execute(_RELEASE)
        raise
    await conn.execute(_RELEASE)
    return row


async def fetch_probe(conn: asyncpg.Connection, query: str, *args: object) -> asyncpg.Record:
    """The one row of a probe statement; driver errors become :class:`ProbeFailure`."""
    try:
        # Inside a caller's transaction a failed statement would poison it; a savepoint
        # keeps the caller's transaction usable and the other probes running.
        if conn.is_in_transaction():
            row = await _fetch_in_savepoint(conn, query, *args)
        else:
            row = await conn.fetchrow(query, *args)
    except DB_ERRORS as exc:
        raise probe_failure(exc) from exc
    if row is None:  # an aggregate over `clock` always yields one row
        raise ProbeFailure("probe returned no row")
    return row


async def fetch_probe_rows(
    conn: asyncpg.Connection, query: str, *args: object
) -> list[asyncpg.Record]:
    """Every row of a statement; errors become :class:`ProbeFailure`. No savepoint: inside
    a transaction of the caller's own (the completion check's), a failure ends it."""
    try:
        rows: list[asyncpg.Record] = await conn.fetch(query, *args)
    except DB_ERRORS as exc:
        raise probe_failure(exc) from exc
    return rows


def without_newest(
    row: asyncpg.Record, newest: str, *, oldest: str | None = None
) -> dict[str, Any]:
    """The probe row minus its ``newest`` guard column, once that time is not in the future.

    A family's evidence carries the *oldest* time it judges an age by, but its counts and
    windows read every row's time: one row stamped in the future (a writer's clock, a
    back-dated import) would be counted, or fall outside a window, without a trace. So each
    probe also reads the newest such time; one later than the observation time makes the
    family unknown (fail closed), as the oldest one would. When the ``oldest`` time is
    itself in the future the classification says so already, with the evidence shown.
    """
    values = dict(row)
    newest_value = values.pop(newest)
    observed = values.get("observed_at_unix_ms")
    if newest_value is None or not isinstance(observed, int):
        return values  # nothing stored, or no clock: the classification says so
    oldest_value = values.get(oldest) if oldest is not None else None
    if oldest_value is not None and oldest_value > observed:
        return values
    if newest_value > observed:
        raise ProbeFailure(
            f"{newest} is {newest_value - observed} ms later than the observation time"
        )
    return values
