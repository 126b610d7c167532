"""Probe blind spots against a real PostgreSQL: a row held behind its key's quarantined event
is not the relay's stall, every stored timestamp a classification uses is checked for lying
in the future (not only the oldest), and an unmigrated database says to migrate."""

from __future__ import annotations

import datetime as dt
from typing import Any

import asyncpg
import pytest

from contracts.health import Classification
from contracts.policy import CompletionOutboxPolicy, Family, OutboxPolicy
from health.commands import check, status
from health.evaluate import evaluate
from health.families.completion_tracker import CompletionTracker
from tests.support.health_rows import db_now, insert_event, insert_job
from tests.support.policies import (
    RECEIPT_RETENTION_MS,
    SIDECAR_RECHECK_MS,
    loose_policy,
    relay_policy,
)

W, S, U = Classification.WITHIN_BOUNDS, Classification.STALLED, Classification.UNKNOWN
HOUR = dt.timedelta(hours=1)


async def results(
    db: asyncpg.Connection, *, completion: CompletionTracker | None = None, **policy: Any
) -> dict[Family, Any]:
    report = await evaluate(
        db,
        loose_policy(**policy),
        receipt_retention_ms=RECEIPT_RETENTION_MS,
        completion=completion,
    )
    return {r.family: r for r in report.families}


async def live_relay_that_last_published(db: asyncpg.Connection, minutes: int) -> None:
    await db.execute(
        """INSERT INTO relay_instance (instance_id, last_publish_at)
           VALUES ('relay-a', clock_timestamp() - $1::int * interval '1 minute')""",
        minutes,
    )
    await db.execute(
        "UPDATE relay_lane SET owner_id = 'relay-a',"
        " lease_expires_at = clock_timestamp() + interval '1 h'"
    )


# --- relay: a held row is the outbox family's quarantine, not a relay stall -------------


async def test_row_held_behind_its_keys_quarantined_event_is_not_a_relay_stall(
    db: asyncpg.Connection,
) -> None:
    await live_relay_that_last_published(db, 10)
    two_minutes_ago = await db_now(db) - dt.timedelta(minutes=2)
    await insert_event(
        db, aggregateid="key-a", created_at=two_minutes_ago, quarantined=True, last_error_class="x"
    )
    await insert_event(db, aggregateid="key-a", created_at=two_minutes_ago)  # held behind it
    relay = relay_policy(max_publish_stall_ms=60_000)
    outbox = OutboxPolicy(
        max_pending_count=1000,
        max_pending_age_ms=3_600_000,
        max_quarantined_count=0,
        gates_readiness=True,
    )
    by_family = await results(db, relay=relay, outbox=outbox)
    assert by_family[Family.RELAY].classification is W, by_family[Family.RELAY].reasons
    assert by_family[Family.RELAY].evidence.oldest_ready_created_at_unix_ms is None
    # The quarantine is reported where it belongs.
    assert by_family[Family.OUTBOX].classification is S
    assert by_family[Family.OUTBOX].reasons == ("quarantined_count 1 > max_quarantined_count 0",)

    # A row held behind its key's backing-off event waits for that retry: not ready either.
    await insert_event(db, aggregateid="key-b", created_at=two_minutes_ago)
    await insert_event(db, aggregateid="key-b", created_at=two_minutes_ago)
    await db.execute(
        """UPDATE outbox SET next_attempt_at = clock_timestamp() + interval '1 h'
           WHERE seq = (SELECT min(seq) FROM outbox WHERE aggregateid = 'key-b')"""
    )
    assert (await results(db, relay=relay))[Family.RELAY].classification is W

    # A ready row of another key is still the relay's work: stalled.
    await insert_event(db, aggregateid="key-c", created_at=two_minutes_ago)
    result = (await results(db, relay=relay))[Family.RELAY]
    assert result.classification is S
    assert result.reasons[0].startswith("ready events unpublished for 12")


# --- every timestamp a classification uses, not only the oldest -------------------------


async def test_a_future_pending_created_at_behind_a_sane_oldest_is_unknown(
    db: asyncpg.Connection,
) -> None:
    now = await db_now(db)
    await insert_event(db, created_at=now - dt.timedelta(minutes=1))
    await insert_event(db, created_at=now + HOUR)
    result = (await results(db))[Family.OUTBOX]
    assert result.classification is U
    assert len(result.reasons) == 1
    assert "newest_pending_created_at_unix_ms is" in result.reasons[0]
    assert "later than the observation time" in result.reasons[0]


async def test_a_future_active_job_created_at_behind_a_sane_oldest_is_unknown(
    db: asyncpg.Connection,
) -> None:
    now = await db_now(db)
    await insert_job(db, "queued", created_at=now - dt.timedelta(minutes=1))
    await insert_job(db, "queued", created_at=now + HOUR)
    result = (await results(db))[Family.SCORING_JOBS]
    assert result.classification is U
    assert "newest_active_created_at_unix_ms is" in result.reasons[0]


async def test_a_future_ready_created_at_is_unknown_for_the_relay(db: asyncpg.Connection) -> None:
    await live_relay_that_last_published(db, 0)
    now = await db_now(db)
    await insert_event(db, created_at=now - dt.timedelta(seconds=1))
    await insert_event(db, created_at=now + HOUR)
    result = (await results(db, relay=relay_policy()))[Family.RELAY]
    assert result.classification is U
    assert "newest_ready_created_at_unix_ms is" in result.reasons[0]


@pytest.mark.parametrize("incremental", [False, True], ids=["one-shot", "sidecar"])
async def test_a_future_terminal_updated_at_is_unknown_for_completion(
    db: asyncpg.Connection, incremental: bool
) -> None:
    # Without its event and an hour ahead: outside [clock - lookback, clock - grace), so
    # counting alone would never see it.
    completion = CompletionOutboxPolicy(
        grace_ms=0, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
    )
    tracker = (
        CompletionTracker(recheck_period_ms=SIDECAR_RECHECK_MS, margin_ms=0)
        if incremental
        else None
    )
    first = await results(db, completion=tracker, completion_outbox=completion)
    assert first[Family.COMPLETION_OUTBOX].classification is W
    await insert_job(db, "completed", updated_at=await db_now(db) + HOUR)
    result = (await results(db, completion=tracker, completion_outbox=completion))[
        Family.COMPLETION_OUTBOX
    ]
    assert result.classification is U
    assert "newest_terminal_updated_at_unix_ms is" in result.reasons[0]


# --- timestamps no clock reading can be compared with ---------------------------------


async def set_created_at(db: asyncpg.Connection, table: str, when: str) -> None:
    await db.execute(f"UPDATE {table} SET created_at = $1::text::timestamptz", when)


# The reason each gets: the same as for any time before 1970 or after the observation.
REASON_OF = {"-infinity": "not a positive time", "infinity": "later than the observation time"}


@pytest.mark.parametrize("when", ["-infinity", "infinity"])
async def test_an_infinite_pending_created_at_is_classified_not_a_refused_probe(
    db: asyncpg.Connection, when: str
) -> None:
    # timestamptz takes +-infinity and a writer may set created_at; 'infinity' has no unix
    # milliseconds, and casting it failed every probe that reads the column as
    # "database refused the probe (0A000)", which blames the database for the data.
    await live_relay_that_last_published(db, 0)
    await insert_event(db)
    await set_created_at(db, "outbox", when)
    by_family = await results(db, relay=relay_policy())
    for result in (by_family[Family.OUTBOX], by_family[Family.RELAY]):
        assert result.classification is U, result.reasons
        assert REASON_OF[when] in result.reasons[0], result.reasons


@pytest.mark.parametrize("when", ["-infinity", "infinity"])
async def test_an_infinite_active_job_created_at_is_classified_not_a_refused_probe(
    db: asyncpg.Connection, when: str
) -> None:
    await insert_job(db, "queued")
    await set_created_at(db, "scoring_job_state", when)
    result = (await results(db))[Family.SCORING_JOBS]
    assert result.classification is U, result.reasons
    assert REASON_OF[when] in result.reasons[0], result.reasons


# --- an unmigrated database -------------------------------------------------------------


async def test_check_and_status_on_an_unmigrated_database_say_to_migrate(
    empty_database_url: str,
) -> None:
    policy = loose_policy(relay=relay_policy())
    for command in (check, status):
        text, code = await command(
            empty_database_url, policy, receipt_retention_ms=RECEIPT_RETENTION_MS
        )
        assert code == 3
        assert "unknown" in text
        assert "run `outbox-relay migrate`" in text
