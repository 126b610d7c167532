"""The ``relay`` family: the relay's progress, read from its heartbeat and lane tables."""

from __future__ import annotations

import asyncpg
import msgspec

from contracts.health import Classification, HealthReport, RelayEvidence
from contracts.policy import Family, RelayPolicy
from health.families.base import FamilySpec, Gauge, Measurement, age
from health.probing import CLOCK, fetch_probe, unix_ms, without_newest
from health.rules import (
    Verdict,
    age_over,
    build_report,
    count_over,
    timestamp_problems,
    verdict,
)

STARTING = "starting"
"""The relay family's reason before the in-process relay had its first chance to claim lanes."""


def _first_ready_row(order: str) -> str:
    """SQL: the write time of the first ready row (pending, due, and not held back by an
    earlier held row of its key) in write-time ``order`` (ASC: the oldest, DESC: the newest).

    Sorts are ruled out in the sidecar's sessions, so the one plan reads
    outbox_pending_created_idx from that end and stops at the first ready row: a backlog's
    rows are not each tested for held rows on every evaluation, and the entries of rows the
    relay deleted are marked dead as the scan steps over them (health/families/outbox.py).
    """
    return f"""
    SELECT {unix_ms("event.created_at")}
    FROM outbox AS event
    -- The topic template of the instance that holds the event's lane (relay_instance,
    -- written by each relay's heartbeat); none for a lane nobody holds, or an instance
    -- of a version that did not write it.
    LEFT JOIN relay_lane AS lane ON lane.lane = event.lane
    LEFT JOIN relay_instance AS owner ON owner.instance_id = lane.owner_id
    WHERE event.quarantined_at IS NULL
      AND (event.next_attempt_at IS NULL OR event.next_attempt_at <= clock.now)
      -- The relay's own rule (relay/sql.py FETCH_READY, _HELD_ON): a row behind an
      -- earlier row of its key that is quarantined or backing off and holds the key on
      -- the row's topic (the topic recorded with the failure; '*': every topic) is held,
      -- not ready. A quarantine is the outbox family's signal; counting the rows it holds
      -- here would call the relay stalled for doing exactly what it should. Probes of
      -- outbox_held_topic_idx, one per question and row; under an owner without a
      -- template (an older relay, or none), every held row holds its key everywhere, as
      -- such a relay does. The seqs are compared by function, so that the unique index
      -- on seq cannot serve a probe: below the row it holds an entry for every row the
      -- relay deleted since the last vacuum, and small statistics made it look as cheap.
      AND NOT EXISTS (
          SELECT 1 FROM outbox AS held
          WHERE hashtextextended(held.aggregateid, 0::bigint)
                    = hashtextextended(event.aggregateid, 0::bigint)
            AND held.held_topic = coalesce(
                    event.topic,
                    replace(owner.topic_template, '{{aggregatetype}}', event.aggregatetype))
            AND int8lt(held.seq, event.seq)
            AND (held.quarantined_at IS NOT NULL OR held.next_attempt_at IS NOT NULL)
            AND texteq(held.aggregateid, event.aggregateid)
          OFFSET 0
      )
      AND NOT EXISTS (
          SELECT 1 FROM outbox AS held
          WHERE hashtextextended(held.aggregateid, 0::bigint)
                    = hashtextextended(event.aggregateid, 0::bigint)
            AND held.held_topic = '*'
            AND int8lt(held.seq, event.seq)
            AND (held.quarantined_at IS NOT NULL OR held.next_attempt_at IS NOT NULL)
            AND texteq(held.aggregateid, event.aggregateid)
          OFFSET 0
      )
      AND NOT (
          owner.topic_template IS NULL
          AND EXISTS (
              SELECT 1 FROM outbox AS held
              WHERE hashtextextended(held.aggregateid, 0::bigint)
                        = hashtextextended(event.aggregateid, 0::bigint)
                AND int8lt(held.seq, event.seq)
                AND (held.quarantined_at IS NOT NULL OR held.next_attempt_at IS NOT NULL)
                AND texteq(held.aggregateid, event.aggregateid)
              OFFSET 0
          )
      )
    ORDER BY event.created_at {order}
    LIMIT 1
"""


# $1 = max_heartbeat_age_ms (what counts as a live instance). Lock holders: pid and
# transaction start only; the query text of other sessions is never read.
RELAY_PROBE = (
    CLOCK
    + f"""
SELECT clock.now_ms AS observed_at_unix_ms,
       instances.instance_count,
       instances.live_instance_count,
       instances.newest_heartbeat_at_unix_ms,
       instances.newest_publish_at_unix_ms,
       lanes.lane_count,
       lanes.unowned_lane_count,
       ready.oldest_ready_created_at_unix_ms,
       ready.newest_ready_created_at_unix_ms,
       blocking.blocking_transaction_count,
       blocking.oldest_blocking_transaction_started_at_unix_ms
FROM clock
CROSS JOIN LATERAL (
    SELECT count(*) AS instance_count,
           count(*) FILTER (
               WHERE heartbeat_at
                     >= clock.now - $1::bigint::double precision * interval '1 millisecond'
           ) AS live_instance_count,
           {unix_ms("max(heartbeat_at)")}
               AS newest_heartbeat_at_unix_ms,
           {unix_ms("max(last_publish_at)")}
               AS newest_publish_at_unix_ms
    FROM relay_instance
) AS instances
CROSS JOIN LATERAL (
    SELECT count(*) AS lane_count,
           count(*) FILTER (
               WHERE lease_expires_at IS NULL OR lease_expires_at < clock.now
           ) AS unowned_lane_count
    FROM relay_lane
) AS lanes
CROSS JOIN LATERAL (
    SELECT ({_first_ready_row("ASC")}) AS oldest_ready_created_at_unix_ms,
           ({_first_ready_row("DESC")}) AS newest_ready_created_at_unix_ms
) AS ready
CROSS JOIN LATERAL (
    SELECT pg_catalog.count(DISTINCT activity.pid) AS blocking_transaction_count,
           -- clock.now is this statement's start: a transaction that began after it but
           -- before pg_stat_activity was read is no older than now, not "in the future"
           {unix_ms("CASE WHEN min(activity.xact_start) > clock.now THEN clock.now ELSE min(activity.xact_start) END")}
               AS oldest_blocking_transaction_started_at_unix_ms
    FROM pg_catalog.pg_locks AS lock
    JOIN pg_catalog.pg_stat_activity AS activity ON activity.pid = lock.pid
    WHERE lock.locktype = 'relation'
      AND lock.granted
      AND lock.relation = 'outbox'::regclass::oid
      AND lock.database = (SELECT oid FROM pg_catalog.pg_database
                           WHERE datname = current_database())
      AND activity.pid <> pg_backend_pid()
      AND activity.xact_start IS NOT NULL
) AS blocking
"""
)


async def probe_relay(conn: asyncpg.Connection, policy: RelayPolicy) -> RelayEvidence:
    """Evidence for the ``relay`` family."""
    row = await fetch_probe(conn, RELAY_PROBE, policy.max_heartbeat_age_ms)
    # The SQL aliases are the field names: a drift fails here, loudly.
    return RelayEvidence(
        **without_newest(
            row, "newest_ready_created_at_unix_ms", oldest="oldest_ready_created_at_unix_ms"
        )
    )


def classify_relay(evidence: RelayEvidence, policy: RelayPolicy) -> Verdict:
    """The relay's progress: fresh heartbeat, owned lanes, publishing when work is due."""
    unknown = timestamp_problems(
        evidence.observed_at_unix_ms,
        [
            ("newest_heartbeat_at_unix_ms", evidence.newest_heartbeat_at_unix_ms),
            ("newest_publish_at_unix_ms", evidence.newest_publish_at_unix_ms),
            ("oldest_ready_created_at_unix_ms", evidence.oldest_ready_created_at_unix_ms),
            (
                "oldest_blocking_transaction_started_at_unix_ms",
                evidence.oldest_blocking_transaction_started_at_unix_ms,
            ),
        ],
    )
    if unknown:
        return verdict(unknown, [], [])
    now = evidence.observed_at_unix_ms
    assert now is not None  # checked above
    counts = count_over(
        "unowned_lane_count",
        evidence.unowned_lane_count,
        "max_unowned_lane_count",
        policy.max_unowned_lane_count,
    )
    if evidence.newest_heartbeat_at_unix_ms is None:
        counts.append("no relay instance has recorded a heartbeat")
    ages = age_over(
        "newest heartbeat age",
        now,
        evidence.newest_heartbeat_at_unix_ms,
        "max_heartbeat_age_ms",
        policy.max_heartbeat_age_ms,
    )
    if evidence.oldest_ready_created_at_unix_ms is not None:
        # Work has waited since the later of its write and the last publish.
        waiting_since = max(
            evidence.oldest_ready_created_at_unix_ms, evidence.newest_publish_at_unix_ms or 0
        )
        stall = now - waiting_since
        if stall > policy.max_publish_stall_ms:
            ages.append(
                f"ready events unpublished for {stall} ms > max_publish_stall_ms "
                f"{policy.max_publish_stall_ms} ms"
            )
    ages += age_over(
        "oldest blocking transaction age",
        now,
        evidence.oldest_blocking_transaction_started_at_unix_ms,
        "max_blocking_transaction_age_ms",
        policy.max_blocking_transaction_age_ms,
    )
    return verdict([], counts, ages)


def while_starting(report: HealthReport) -> HealthReport:
    """The report with a stalled relay family turned ``unknown``/``starting``.

    Right after start the tables still show the last run (or none): no fresh heartbeat and
    every lane unowned. Until this process's relay has had one chance to claim its lanes
    that says nothing about it, so it is neither stalled nor within bounds. The evidence is
    kept; other classifications (unknown for a database problem, within bounds because
    other instances hold the lanes) stand as they are.
    """
    results = [
        msgspec.structs.replace(result, classification=Classification.UNKNOWN, reasons=(STARTING,))
        if result.family is Family.RELAY and result.classification is Classification.STALLED
        else result
        for result in report.families
    ]
    return build_report(results, report.evaluated_at_unix_ms)


def relay_measurements(evidence: RelayEvidence) -> list[Measurement]:
    """What the ``relay`` family shows."""
    now = evidence.observed_at_unix_ms
    return [
        Measurement("live_instance_count", evidence.live_instance_count, "instances"),
        Measurement("instance_count", evidence.instance_count, "instances"),
        Measurement(
            "heartbeat_age",
            age(now, evidence.newest_heartbeat_at_unix_ms),
            "ms",
            bound="max_heartbeat_age_ms",
        ),
        Measurement("last_publish_age", age(now, evidence.newest_publish_at_unix_ms), "ms"),
        Measurement(
            "unowned_lane_count",
            evidence.unowned_lane_count,
            "lanes",
            bound="max_unowned_lane_count",
        ),
        Measurement("lane_count", evidence.lane_count, "lanes"),
        Measurement("oldest_ready_age", age(now, evidence.oldest_ready_created_at_unix_ms), "ms"),
        Measurement(
            "blocking_transaction_count", evidence.blocking_transaction_count, "transactions"
        ),
        Measurement(
            "oldest_blocking_transaction_age",
            age(now, evidence.oldest_blocking_transaction_started_at_unix_ms),
            "ms",
            bound="max_blocking_transaction_age_ms",
        ),
    ]


SPEC: FamilySpec[RelayPolicy, RelayEvidence] = FamilySpec(
    policy_type=RelayPolicy,
    evidence_type=RelayEvidence,
    probe=lambda conn, policy, _context: probe_relay(conn, policy),
    classify=classify_relay,
    measurements=relay_measurements,
    gauges=(
        Gauge(
            "outbox_relay_relay_live_instances",
            "Relay instances with a fresh heartbeat.",
            "live_instance_count",
        ),
        Gauge(
            "outbox_relay_relay_heartbeat_age_seconds",
            "Age of the newest relay heartbeat.",
            "heartbeat_age",
            seconds=True,
        ),
        Gauge(
            "outbox_relay_relay_unowned_lanes",
            "Relay lanes with no owner or an expired lease.",
            "unowned_lane_count",
        ),
        Gauge(
            "outbox_relay_relay_blocking_transaction_age_seconds",
            "Age of the oldest other open transaction holding a lock on the outbox table.",
            "oldest_blocking_transaction_age",
            seconds=True,
        ),
    ),
)
