"""What a new migration must do so that it never holds writers up for long
(docs/operations.md, "Upgrades"): the rules, as a check of one file's text.

Every migration after the grandfathered ones starts by bounding its lock waits:
``SET LOCAL lock_timeout`` (``SET`` in a ``-- migrate: no-transaction`` file, where ``SET
LOCAL`` would do nothing) to at most one second, and never raises it; an index is built,
dropped or rebuilt ``CONCURRENTLY``.
"""

from __future__ import annotations

import re

from migrations.runner import Migration, split_statements

GRANDFATHERED = 8
"""0001-0008 were applied before the rules: 0006-0008 wait up to 2 s and 10 s."""
MAX_LOCK_TIMEOUT_MS = 1000

_SET_LOCK_TIMEOUT = re.compile(
    r"SET\s+(?P<local>LOCAL\s+)?lock_timeout\s*(?:=|TO)\s*(?P<value>\S+)", re.IGNORECASE
)
_RESET_LOCK_TIMEOUT = re.compile(
    r"RESET\s+lock_timeout|SET\s+(LOCAL\s+)?lock_timeout\s*(=|TO)\s*DEFAULT", re.IGNORECASE
)
_DURATION = re.compile(r"'?(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>us|ms|s|min|h|d)?'?", re.I)
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_INDEX_WITHOUT_CONCURRENTLY = re.compile(
    r"(CREATE\s+(UNIQUE\s+)?INDEX|DROP\s+INDEX|REINDEX\s+\w+)(?!\s+CONCURRENTLY)\b", re.IGNORECASE
)


def duration_ms(value: str) -> float | None:
    """A lock_timeout value in milliseconds (PostgreSQL's units; a bare number is ms)."""
    found = _DURATION.fullmatch(value.rstrip(";"))
    if found is None:
        return None
    unit = (found["unit"] or "ms").lower()
    return float(found["number"]) * _UNIT_MS[unit]


def violations(migration: Migration) -> list[str]:
    """What ``migration`` does against the rules; empty when it keeps them."""
    statements = split_statements(migration.sql)
    problems = []
    first = _SET_LOCK_TIMEOUT.fullmatch(statements[0]) if statements else None
    if first is None:
        problems.append("its first statement must be SET [LOCAL] lock_timeout = '1s' (or less)")
    for position, statement in enumerate(statements):
        if _RESET_LOCK_TIMEOUT.fullmatch(statement):
            if position != len(statements) - 1:
                problems.append(f"it resets lock_timeout before its last statement: {statement}")
            continue
        found = _SET_LOCK_TIMEOUT.fullmatch(statement)
        if found is not None:
            waits = duration_ms(found["value"])
            if waits is None or waits <= 0 or waits > MAX_LOCK_TIMEOUT_MS:
                problems.append(f"lock_timeout {found['value']} is not between 1 ms and 1 s")
            if migration.transactional and not found["local"]:
                problems.append("in one transaction, SET LOCAL lock_timeout ends with it")
            if not migration.transactional and found["local"]:
                problems.append("outside a transaction SET LOCAL does nothing: use SET")
            continue
        index = _INDEX_WITHOUT_CONCURRENTLY.search(statement)
        if index is not None:
            problems.append(f"{index.group(1)} without CONCURRENTLY blocks writers")
    return problems
