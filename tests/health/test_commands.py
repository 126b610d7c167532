"""`check` and `status`: one evaluation, the report text and the monitoring-plugins exit code."""

from __future__ import annotations

import datetime as dt
import json

import asyncpg

from health.commands import check, status
from tests.support.health_rows import SECRET_MARK, db_now, insert_job
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy, relay_policy
from tests.support.ports import free_port


async def test_check_within_bounds_exits_0(database_url: str) -> None:
    text, code = await check(
        database_url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS
    )
    assert code == 0
    document = json.loads(text)
    assert document["status"] == "pass"
    assert document["checks"]["outbox:classification"][0]["classification"] == "within_bounds"


async def test_check_stalled_exits_2(database_url: str, db: asyncpg.Connection) -> None:
    await insert_job(db, "completed", updated_at=await db_now(db) - dt.timedelta(minutes=5))
    text, code = await check(
        database_url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS
    )
    assert code == 2
    assert json.loads(text)["checks"]["completion_outbox:missing_count"][0]["observedValue"] == 1


async def test_check_unknown_exits_3_without_receipt_retention(database_url: str) -> None:
    _, code = await check(database_url, loose_policy(), receipt_retention_ms=None)
    assert code == 3


async def test_stalled_beats_unknown_in_the_exit_code(
    database_url: str, db: asyncpg.Connection
) -> None:
    await insert_job(db, "quarantined")
    policy = loose_policy(relay=relay_policy())  # no relay running: stalled too
    _, code = await check(database_url, policy, receipt_retention_ms=None)
    assert code == 2


async def test_unreachable_database_exits_3_without_leaking_the_url() -> None:
    port = free_port()
    url = f"postgresql://outbox:pw-{SECRET_MARK}@127.0.0.1:{port}/db_{SECRET_MARK}"
    for command in (check, status):
        text, code = await command(url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS)
        assert code == 3
        assert "database unavailable: connection refused" in text
        assert SECRET_MARK not in text
        assert str(port) not in text


async def test_status_is_a_readable_table(database_url: str, db: asyncpg.Connection) -> None:
    await insert_job(db, "queued")
    # Wide enough for every family's measurements beside it (tests/operator/test_terminal.py
    # has the narrower layouts).
    text, code = await status(
        database_url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS, width=200
    )
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split() == ["FAMILY", "CLASSIFICATION", "GATES", "MEASUREMENTS"]
    jobs = next(line for line in lines if line.startswith("scoring_jobs"))
    assert "within_bounds" in jobs
    assert "active_count=1" in jobs
    assert lines[-1].startswith("overall: within_bounds; readiness: within_bounds")
