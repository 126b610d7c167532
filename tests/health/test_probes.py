"""Probes against a real PostgreSQL: the scoring service's cases, the outbox, completion/outbox
consistency and the relay, plus plans that show cost does not follow terminal history."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import asyncpg
import msgspec
import pytest

from contracts.health import Classification, ScoringJobsEvidence
from contracts.policy import Family, OutboxPolicy, ScoringJobsPolicy
from health.evaluate import evaluate
from health.families.completion_outbox import COMPLETION_OUTBOX_PROBE
from health.families.outbox import OUTBOX_PROBE, probe_outbox
from health.families.relay import RELAY_PROBE, probe_relay
from health.families.scoring_jobs import (
    SCORING_JOBS_PROBE,
    classify_scoring_jobs,
    probe_scoring_jobs,
)
from migrations.runner import apply, load_migrations
from tests.support.health_rows import db_now, insert_event, insert_job, insert_receipt
from tests.support.plans import blocks_read, plan_nodes
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy, relay_policy

W, S, U = Classification.WITHIN_BOUNDS, Classification.STALLED, Classification.UNKNOWN
HOUR = dt.timedelta(hours=1)


def jobs_policy(**changes: Any) -> ScoringJobsPolicy:
    values: dict[str, Any] = {
        "max_active_job_count": 1000,
        "max_active_job_age_ms": 3_600_000,
        "max_quarantined_job_count": 10,
        "max_expired_lease_count": 10,
        "gates_readiness": True,
    }
    return ScoringJobsPolicy(**(values | changes))


async def classify_jobs(
    db: asyncpg.Connection, **changes: Any
) -> tuple[Classification, tuple[str, ...]]:
    return classify_scoring_jobs(await probe_scoring_jobs(db), jobs_policy(**changes))


async def family(db: asyncpg.Connection, which: Family, **policy: Any) -> Any:
    report = await evaluate(db, loose_policy(**policy), receipt_retention_ms=RECEIPT_RETENTION_MS)
    return next(r for r in report.families if r.family is which)


# --- scoring_jobs: the scoring service's own cases -------------------------------------


async def test_empty_backlog_is_within_bounds(db: asyncpg.Connection) -> None:
    evidence = await probe_scoring_jobs(db)
    assert evidence.active_count == 0
    assert evidence.oldest_active_created_at_unix_ms is None
    assert evidence.expired_lease_count == 0
    assert evidence.observed_at_unix_ms is not None and evidence.observed_at_unix_ms > 0
    report = await evaluate(db, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS)
    assert report.classification is W
    assert [r.family for r in report.families] == [
        Family.OUTBOX,
        Family.SCORING_JOBS,
        Family.COMPLETION_OUTBOX,
    ]


async def test_mixed_states_count_only_active_and_quarantined(db: asyncpg.Connection) -> None:
    now = await db_now(db)
    oldest = now - dt.timedelta(minutes=5)
    await insert_job(db, "queued", created_at=now - dt.timedelta(minutes=1))
    await insert_job(db, "leased", created_at=oldest)
    await insert_job(db, "retry_scheduled", created_at=now - dt.timedelta(minutes=2))
    # Terminal rows, even older, must not count as active or as the oldest.
    await insert_job(db, "completed", created_at=now - 10 * HOUR)
    await insert_job(db, "cancelled", created_at=now - 10 * HOUR)
    await insert_job(db, "quarantined", created_at=now - 10 * HOUR)
    evidence = await probe_scoring_jobs(db)
    assert evidence.active_count == 3
    assert evidence.quarantined_count == 1
    assert evidence.oldest_active_created_at_unix_ms == round(oldest.timestamp() * 1000)
    assert evidence.expired_lease_count == 0
    assert classify_scoring_jobs(evidence, jobs_policy())[0] is W


async def test_count_over_bound_is_stalled(db: asyncpg.Connection) -> None:
    for _ in range(3):
        await insert_job(db, "queued")
    assert (await classify_jobs(db, max_active_job_count=3))[0] is W
    classification, reasons = await classify_jobs(db, max_active_job_count=2)
    assert classification is S
    assert reasons == ("active_count 3 > max_active_job_count 2",)


async def test_age_over_bound_is_stalled(db: asyncpg.Connection) -> None:
    await insert_job(db, "retry_scheduled", created_at=await db_now(db) - 2 * HOUR)
    assert (await classify_jobs(db, max_active_job_age_ms=3 * 3_600_000))[0] is W
    classification, reasons = await classify_jobs(db, max_active_job_age_ms=3_600_000)
    assert classification is S
    assert reasons[0].startswith("oldest active job age 72")


async def test_quarantine_bound(db: asyncpg.Connection) -> None:
    await insert_job(db, "quarantined")
    assert (await classify_jobs(db, max_quarantined_job_count=1))[0] is W
    assert (await classify_jobs(db, max_quarantined_job_count=0))[0] is S


async def test_expired_lease_fails_with_bound_zero_and_passes_with_one(
    db: asyncpg.Connection,
) -> None:
    now_ms = round((await db_now(db)).timestamp() * 1000)
    await insert_job(db, "leased", lease_expires_at_unix_ms=now_ms - 1500)
    await insert_job(db, "leased", lease_expires_at_unix_ms=now_ms + 3_600_000)
    evidence = await probe_scoring_jobs(db)
    assert evidence.active_count == 2
    assert evidence.expired_lease_count == 1
    assert evidence.oldest_expired_lease_expires_at_unix_ms == now_ms - 1500
    classification, reasons = classify_scoring_jobs(
        evidence, jobs_policy(max_expired_lease_count=0)
    )
    assert classification is S
    assert reasons == ("expired_lease_count 1 > max_expired_lease_count 0",)
    assert classify_scoring_jobs(evidence, jobs_policy(max_expired_lease_count=1))[0] is W


async def test_future_created_at_is_unknown(db: asyncpg.Connection) -> None:
    await insert_job(db, "queued", created_at=await db_now(db) + HOUR)
    classification, reasons = await classify_jobs(db)
    assert classification is U
    assert "later than the observation time" in reasons[0]


async def test_missing_observation_time_is_unknown(db: asyncpg.Connection) -> None:
    await insert_job(db, "queued")
    evidence = await probe_scoring_jobs(db)
    for observed in (None, 0):
        blind = msgspec.structs.replace(evidence, observed_at_unix_ms=observed)
        assert classify_scoring_jobs(blind, jobs_policy()) == (U, ("observation time is missing",))


async def test_stored_epoch_zero_created_at_is_unknown(db: asyncpg.Connection) -> None:
    await insert_job(db, "queued", created_at=dt.datetime(1970, 1, 1, tzinfo=dt.UTC))
    evidence = await probe_scoring_jobs(db)
    assert evidence.oldest_active_created_at_unix_ms == 0
    classification, reasons = classify_scoring_jobs(evidence, jobs_policy())
    assert classification is U
    assert reasons == ("stored oldest_active_created_at_unix_ms is 0, not a positive time",)


@pytest.mark.parametrize(
    ("micros", "expected_ms"),
    [(600, 1), (400, 0), (1500, 2), (999_600, 1000)],
)
async def test_sub_millisecond_created_at_rounds(
    db: asyncpg.Connection, micros: int, expected_ms: int
) -> None:
    base = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    await insert_job(db, "queued", created_at=base + dt.timedelta(microseconds=micros))
    evidence = await probe_scoring_jobs(db)
    assert evidence.oldest_active_created_at_unix_ms == int(base.timestamp()) * 1000 + expected_ms


async def test_probe_inside_a_callers_transaction_reads_a_current_clock(
    db: asyncpg.Connection,
) -> None:
    async with db.transaction():
        started_ms = await db.fetchval("SELECT round(extract(epoch FROM now()) * 1000)::bigint")
        await asyncio.sleep(0.05)
        # Written after the transaction began: measured against now() it would be in the future.
        await insert_job(db, "queued")
        evidence = await probe_scoring_jobs(db)
        assert evidence.observed_at_unix_ms is not None
        assert evidence.observed_at_unix_ms >= started_ms + 50
        assert classify_scoring_jobs(evidence, jobs_policy())[0] is W
        assert evidence.active_count == 1


async def test_failed_probe_inside_a_callers_transaction_leaves_it_usable(
    db: asyncpg.Connection,
) -> None:
    await db.execute("BEGIN")
    try:
        await db.execute("ALTER TABLE outbox_receipt RENAME TO outbox_receipt_gone")
        report = await evaluate(db, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS)
        by_family = {r.family: r for r in report.families}
        assert by_family[Family.COMPLETION_OUTBOX].classification is U
        assert by_family[Family.COMPLETION_OUTBOX].reasons == (
            "a table the probe reads is missing (42P01): run `outbox-relay migrate`",
        )
        assert by_family[Family.OUTBOX].classification is W
        assert by_family[Family.SCORING_JOBS].classification is W
        assert await db.fetchval("SELECT 1") == 1  # the caller's transaction is intact
    finally:
        await db.execute("ROLLBACK")


async def test_missing_tables_are_unknown(empty_database_url: str) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        report = await evaluate(
            conn, loose_policy(relay=relay_policy()), receipt_retention_ms=RECEIPT_RETENTION_MS
        )
    finally:
        await conn.close()
    assert report.classification is U
    assert len(report.families) == 4
    for result in report.families:
        assert result.classification is U
        assert result.evidence is None
        assert result.reasons == (
            "a table the probe reads is missing (42P01): run `outbox-relay migrate`",
        )


# --- indexes and cost ----------------------------------------------------------------

HEALTH_INDEXES = {
    "scoring_job_state_active_created_idx",
    "scoring_job_state_quarantined_created_idx",
    "scoring_job_state_leased_expiry_idx",
    "scoring_job_state_terminal_updated_idx",
    "outbox_pending_created_idx",
    "outbox_quarantined_idx",
    "outbox_scoring_job_idx",
    "outbox_receipt_scoring_job_idx",
}
_INDEX_DEFS = """
SELECT c.relname, pg_get_indexdef(i.indexrelid) AS def, i.indpred IS NOT NULL AS partial,
       i.indisvalid AS valid
FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
WHERE c.relname = ANY($1::text[])
"""


async def test_health_indexes_are_partial_valid_and_idempotent(db: asyncpg.Connection) -> None:
    before = {r["relname"]: dict(r) for r in await db.fetch(_INDEX_DEFS, list(HEALTH_INDEXES))}
    assert set(before) == HEALTH_INDEXES
    assert all(r["partial"] and r["valid"] for r in before.values())
    assert await apply(db, load_migrations()) == []
    after = {r["relname"]: dict(r) for r in await db.fetch(_INDEX_DEFS, list(HEALTH_INDEXES))}
    assert after == before


async def _add_terminal_history(db: asyncpg.Connection, rows: int) -> None:
    # Old completed and cancelled jobs, each completed job with its published receipt.
    await db.execute(
        """
        INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,
            attempt_count, max_attempts, result_ref, completed_fencing_token, created_at, updated_at)
        SELECT 'hist-' || g, 'req-' || g, 'completed', 1, 3, 'res-' || g, 1,
               now() - interval '30 days', now() - interval '30 days'
        FROM generate_series(1, $1) AS g
        """,
        rows,
    )
    await db.execute(
        """
        INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,
            max_attempts, created_at, updated_at)
        SELECT 'canc-' || g, 'req-c' || g, 'cancelled', 3,
               now() - interval '30 days', now() - interval '30 days'
        FROM generate_series(1, $1) AS g
        """,
        rows,
    )
    await db.execute(
        """
        INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,
            kafka_partition, kafka_offset, created_at, published_at)
        SELECT gen_random_uuid(), 'scoring_job', 'hist-' || g, 'scoring.result.completed',
               'outbox.event.scoring_job', 0, g, now() - interval '30 days',
               now() - interval '30 days'
        FROM generate_series(1, $1) AS g
        """,
        rows,
    )
    await db.execute("VACUUM ANALYZE scoring_job_state")
    await db.execute("VACUUM ANALYZE outbox_receipt")


_PROBES: list[tuple[str, str, tuple[object, ...]]] = [
    ("outbox", OUTBOX_PROBE, ()),
    ("scoring_jobs", SCORING_JOBS_PROBE, ()),
    ("completion_outbox", COMPLETION_OUTBOX_PROBE, (30_000, 86_400_000)),
    ("relay", RELAY_PROBE, (10_000,)),
]


async def _plan(db: asyncpg.Connection, query: str, args: tuple[object, ...]) -> dict[str, Any]:
    raw = await db.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}", *args)
    plan: dict[str, Any] = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return plan


async def test_plans_use_partial_indexes_and_cost_ignores_terminal_history(
    db: asyncpg.Connection,
) -> None:
    await db.execute("ANALYZE")
    empty = {name: blocks_read(await _plan(db, q, a)) for name, q, a in _PROBES}
    await _add_terminal_history(db, 20_000)
    for name, query, args in _PROBES:
        plan = await _plan(db, query, args)
        nodes = plan_nodes(plan)
        scanned = {(n["Node Type"], n.get("Relation Name")) for n in nodes}
        indexes = {n.get("Index Name") for n in nodes} - {None}
        # The big tables are never read whole; only the (small) outbox and lane tables may be.
        assert ("Seq Scan", "scoring_job_state") not in scanned, name
        assert ("Seq Scan", "outbox_receipt") not in scanned, name
        # Planners differ (15 reads leased expiries from their own index, 18 may filter the
        # active one); either way every index read is partial and excludes terminal rows.
        # The relay's ready rows skip those held behind their key (outbox_held_key_idx, partial).
        allowed = {"relay_lane_pkey", "relay_instance_pkey", "outbox_held_key_idx"}
        assert indexes <= HEALTH_INDEXES | allowed, name
        if name == "scoring_jobs":
            assert "scoring_job_state_active_created_idx" in indexes
            assert "scoring_job_state_quarantined_created_idx" in indexes
        if name == "completion_outbox":
            assert "scoring_job_state_terminal_updated_idx" in indexes
        # §10: a full evaluation costs at most twice as much with a terminal history.
        assert blocks_read(plan) <= 2 * empty[name] + 4, (name, empty[name], blocks_read(plan))


# --- outbox ---------------------------------------------------------------------------


async def test_outbox_counts_pending_retrying_and_quarantined(db: asyncpg.Connection) -> None:
    now = await db_now(db)
    await insert_event(db, created_at=now - dt.timedelta(seconds=90))
    await insert_event(db, last_error_class="broker_timeout")
    await insert_event(db, quarantined=True, created_at=now - 5 * HOUR)
    evidence = await probe_outbox(db)
    assert evidence.pending_count == 2
    assert evidence.retrying_count == 1
    assert evidence.quarantined_count == 1
    # Quarantined rows are not pending: the oldest pending is the 90-second-old row.
    assert evidence.oldest_pending_created_at_unix_ms == round(
        (now - dt.timedelta(seconds=90)).timestamp() * 1000
    )


async def test_undrained_outbox_is_stalled_and_recovers_when_drained(
    db: asyncpg.Connection,
) -> None:
    tight = OutboxPolicy(
        max_pending_count=100,
        max_pending_age_ms=60_000,
        max_quarantined_count=0,
        gates_readiness=True,
    )
    event_id = await insert_event(db, created_at=await db_now(db) - dt.timedelta(minutes=2))
    result = await family(db, Family.OUTBOX, outbox=tight)
    assert result.classification is S
    assert result.reasons[0].startswith("oldest pending age 12")
    # The relay publishes: the row moves into the receipts in one statement.
    await db.execute(
        """
        WITH gone AS (DELETE FROM outbox WHERE id = $1 RETURNING *)
        INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic,
            kafka_partition, kafka_offset, created_at)
        SELECT id, aggregatetype, aggregateid, type, 't', 0, 1, created_at FROM gone
        """,
        event_id,
    )
    assert (await family(db, Family.OUTBOX, outbox=tight)).classification is W


# --- completion_outbox ------------------------------------------------------------------


async def test_completed_job_without_event_is_stalled_until_its_event_exists(
    db: asyncpg.Connection,
) -> None:
    now = await db_now(db)
    job = await insert_job(db, "completed", updated_at=now - dt.timedelta(minutes=5))
    result = await family(db, Family.COMPLETION_OUTBOX)
    assert result.classification is S
    assert result.reasons == ("missing_count 1 > max_missing_count 0",)
    assert result.evidence.missing_count == 1
    # The reconciling writer enqueues the event: pending in the outbox counts as covered.
    await insert_event(db, aggregateid=job)
    assert (await family(db, Family.COMPLETION_OUTBOX)).classification is W


async def test_published_event_receipt_covers_the_job(db: asyncpg.Connection) -> None:
    now = await db_now(db)
    job = await insert_job(db, "quarantined", updated_at=now - dt.timedelta(minutes=5))
    assert (await family(db, Family.COMPLETION_OUTBOX)).classification is S
    await insert_receipt(db, aggregateid=job)
    assert (await family(db, Family.COMPLETION_OUTBOX)).classification is W


async def test_completion_window_excludes_grace_lookback_and_other_events(
    db: asyncpg.Connection,
) -> None:
    now = await db_now(db)
    await insert_job(db, "completed", updated_at=now - dt.timedelta(seconds=5))  # within grace
    await insert_job(db, "completed", updated_at=now - 48 * HOUR)  # before the look-back
    await insert_job(db, "cancelled", updated_at=now - dt.timedelta(minutes=5))  # no event due
    covered_wrongly = await insert_job(db, "completed", updated_at=now - dt.timedelta(minutes=5))
    # An event of another aggregate type with the same id does not cover the job.
    await insert_event(db, aggregateid=covered_wrongly, aggregatetype="invoice")
    result = await family(db, Family.COMPLETION_OUTBOX)
    assert result.evidence.missing_count == 1
    assert result.classification is S


async def test_receipts_kept_shorter_than_lookback_make_completion_unknown(
    db: asyncpg.Connection,
) -> None:
    now = await db_now(db)
    await insert_job(db, "completed", updated_at=now - dt.timedelta(minutes=5))
    report = await evaluate(db, loose_policy(), receipt_retention_ms=3_600_000)
    result = next(r for r in report.families if r.family is Family.COMPLETION_OUTBOX)
    assert result.classification is U
    assert "receipt retention" in result.reasons[0]


# --- composition with real evidence ------------------------------------------------------


async def test_healthy_outbox_plus_stalled_scoring_is_stalled(db: asyncpg.Connection) -> None:
    await insert_job(db, "queued", created_at=await db_now(db) - 2 * HOUR)
    report = await evaluate(
        db,
        loose_policy(scoring_jobs=jobs_policy(max_active_job_age_ms=60_000)),
        receipt_retention_ms=RECEIPT_RETENTION_MS,
    )
    by_family = {r.family: r.classification for r in report.families}
    assert by_family[Family.OUTBOX] is W
    assert by_family[Family.SCORING_JOBS] is S
    assert report.classification is S
    assert report.readiness is S


async def test_expired_lease_is_masked_by_nothing(db: asyncpg.Connection) -> None:
    now_ms = round((await db_now(db)).timestamp() * 1000)
    await insert_job(db, "leased", lease_expires_at_unix_ms=now_ms - 10)
    report = await evaluate(
        db,
        loose_policy(scoring_jobs=jobs_policy(max_expired_lease_count=0)),
        receipt_retention_ms=RECEIPT_RETENTION_MS,
    )
    jobs = next(r for r in report.families if r.family is Family.SCORING_JOBS)
    assert isinstance(jobs.evidence, ScoringJobsEvidence)
    assert jobs.evidence.active_count == 1  # well under the count bound
    assert jobs.classification is S
    assert report.classification is S


# --- relay ------------------------------------------------------------------------------


async def test_relay_unowned_lanes_no_heartbeat_then_healthy(db: asyncpg.Connection) -> None:
    evidence = await probe_relay(db, relay_policy())
    assert evidence.lane_count == 64
    assert evidence.unowned_lane_count == 64
    assert evidence.instance_count == 0
    assert evidence.newest_heartbeat_at_unix_ms is None
    result = await family(db, Family.RELAY, relay=relay_policy())
    assert result.classification is S
    assert "unowned_lane_count 64 > max_unowned_lane_count 0" in result.reasons
    assert "no relay instance has recorded a heartbeat" in result.reasons

    await db.execute(
        "INSERT INTO relay_instance (instance_id, last_publish_at) VALUES ('relay-a', clock_timestamp())"
    )
    await db.execute(
        "UPDATE relay_lane SET owner_id = 'relay-a', lease_expires_at = clock_timestamp() + interval '30 s'"
    )
    await db.execute(
        "UPDATE relay_lane SET lease_expires_at = clock_timestamp() - interval '1 s' WHERE lane = 7"
    )
    evidence = await probe_relay(db, relay_policy())
    assert (evidence.instance_count, evidence.live_instance_count) == (1, 1)
    assert evidence.unowned_lane_count == 1  # the expired lease
    assert (
        await family(db, Family.RELAY, relay=relay_policy(max_unowned_lane_count=1))
    ).classification is W


async def test_relay_publish_stall_and_blocking_transaction(
    db: asyncpg.Connection, database_url: str
) -> None:
    await db.execute(
        """INSERT INTO relay_instance (instance_id, last_publish_at)
           VALUES ('relay-a', clock_timestamp() - interval '10 minutes')"""
    )
    await db.execute(
        "UPDATE relay_lane SET owner_id = 'relay-a', lease_expires_at = clock_timestamp() + interval '1 h'"
    )
    await insert_event(db, created_at=await db_now(db) - dt.timedelta(minutes=2))
    # A backing-off row is not ready work.
    await db.execute(
        "UPDATE outbox SET next_attempt_at = clock_timestamp() + interval '1 h' WHERE created_at < clock_timestamp() - interval '1 minute'"
    )
    assert (await family(db, Family.RELAY, relay=relay_policy())).classification is W
    await db.execute("UPDATE outbox SET next_attempt_at = NULL")
    result = await family(db, Family.RELAY, relay=relay_policy(max_publish_stall_ms=60_000))
    assert result.classification is S
    assert result.reasons[0].startswith("ready events unpublished for 12")

    await db.execute("DELETE FROM outbox")
    other = await asyncpg.connect(database_url)
    try:
        await other.execute("BEGIN")
        await other.execute("LOCK TABLE outbox IN ROW EXCLUSIVE MODE")
        await asyncio.sleep(0.02)
        evidence = await probe_relay(db, relay_policy())
        assert evidence.blocking_transaction_count == 1
        result = await family(
            db, Family.RELAY, relay=relay_policy(max_blocking_transaction_age_ms=10)
        )
        assert result.classification is S
        assert result.reasons[0].startswith("oldest blocking transaction age")
        await other.execute("ROLLBACK")
        assert (await probe_relay(db, relay_policy())).blocking_transaction_count == 0
    finally:
        await other.close()
