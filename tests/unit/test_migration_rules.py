"""Every migration after 0008 bounds how long it may hold writers up: a lock_timeout of at
most 1 s first, indexes built and dropped CONCURRENTLY (docs/operations.md, "Upgrades").
The check refuses what 0006-0008 did, and what a careless new file would do."""

from __future__ import annotations

import pytest

from migrations.runner import Migration, load_migrations
from tests.support.migration_rules import GRANDFATHERED, duration_ms, violations


def _migration(sql: str, version: int = 9) -> Migration:
    return Migration(version, "planted", sql, "")


def test_every_new_migration_keeps_the_lock_rules() -> None:
    # Empty until the first migration after 0008 ships; the tests below show what it refuses.
    found = {m.file_name: violations(m) for m in load_migrations() if m.version > GRANDFATHERED}
    assert {name: problems for name, problems in found.items() if problems} == {}


def test_the_rules_are_new_0006_to_0008_would_break_them() -> None:
    shipped = {m.version: m for m in load_migrations()}
    assert [v for v in range(1, GRANDFATHERED + 1) if violations(shipped[v])] == list(
        range(1, GRANDFATHERED + 1)
    )
    assert "lock_timeout '10s' is not between 1 ms and 1 s" in violations(shipped[7])
    assert "lock_timeout '2s' is not between 1 ms and 1 s" in violations(shipped[6])


@pytest.mark.parametrize(
    ("sql", "problem"),
    [
        ("ALTER TABLE outbox ADD COLUMN x text;", "its first statement must be SET"),
        ("SET LOCAL lock_timeout = '2s';\nALTER TABLE outbox ADD COLUMN x text;", "not between"),
        ("SET LOCAL lock_timeout = 5000;\nSELECT 1;", "not between"),
        ("SET lock_timeout = '1s';\nALTER TABLE outbox ADD COLUMN x text;", "SET LOCAL"),
        (
            "-- migrate: no-transaction\nSET LOCAL lock_timeout = '1s';\nSELECT 1;",
            "SET LOCAL does nothing",
        ),
        (
            "SET LOCAL lock_timeout = '1s';\nCREATE INDEX outbox_x_idx ON outbox (topic);",
            "CREATE INDEX without CONCURRENTLY",
        ),
        (
            "SET LOCAL lock_timeout = '1s';\nDROP INDEX outbox_x_idx;",
            "DROP INDEX without CONCURRENTLY",
        ),
        (
            "-- migrate: no-transaction\nSET lock_timeout = '1s';\nRESET lock_timeout;\n"
            "ALTER TABLE outbox ADD COLUMN x text;",
            "resets lock_timeout before its last statement",
        ),
        (
            "-- migrate: no-transaction\nSET lock_timeout = '1s';\n"
            "SET lock_timeout = '1min';\nSELECT 1;",
            "not between",
        ),
    ],
)
def test_a_new_migration_that_could_hold_writers_up_is_refused(sql: str, problem: str) -> None:
    found = violations(_migration(sql))
    assert any(problem in p for p in found), found


@pytest.mark.parametrize(
    "sql",
    [
        "SET LOCAL lock_timeout = '1s';\nALTER TABLE outbox ADD COLUMN IF NOT EXISTS x text;",
        "SET LOCAL lock_timeout TO 500;\nSELECT 1;",
        "-- migrate: no-transaction\n-- why\nSET lock_timeout = '1000ms';\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_x_idx ON outbox (topic);\n"
        "DROP INDEX CONCURRENTLY IF EXISTS outbox_y_idx;\nRESET lock_timeout;",
    ],
)
def test_a_migration_that_keeps_the_rules_passes(sql: str) -> None:
    assert violations(_migration(sql)) == []


@pytest.mark.parametrize(
    ("value", "ms"),
    [("'1s'", 1000), ("1000", 1000), ("'250ms'", 250), ("'1min'", 60_000), ("'0.5s'", 500)],
)
def test_durations_read_as_postgresql_reads_them(value: str, ms: float) -> None:
    assert duration_ms(value) == ms
