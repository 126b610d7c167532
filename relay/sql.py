"""The relay's SQL, as named constants. Values are always bound, never formatted in."""

from __future__ import annotations

from contracts.limits import (
    MAX_AGGREGATEID_BYTES,
    MAX_AGGREGATETYPE_BYTES,
    MAX_TOPIC_BYTES,
    MAX_TYPE_BYTES,
)

LANE_COUNT = 64

# The topic a row goes to under the relay's template ($4): its own, else the template with
# its aggregatetype (relay/records.py, RecordMapper.topic_for, does the same).
_TOPIC_OF = "coalesce({row}.topic, replace($4::text, '{{aggregatetype}}', {row}.aggregatetype))"

# What a row that is not transferred whole still brings: each of these columns whole when
# it is within the door's limit for it (contracts/limits.py), else a stand-in that is no
# topic name (a row stored before the door may carry anything). The key's stand-in is the
# same for every such row of the key, so the relay's holds meet them all; a row of the
# same over-long key that is fetched whole (stored before the door, and small enough)
# carries the key itself, so until the quarantine of the other is recorded, only the
# database holds it back.
_STAND_INS = {  # column: (its limit, its stand-in, the stand-in's length in bytes)
    "aggregatetype": (MAX_AGGREGATETYPE_BYTES, "'oversized aggregatetype'", 23),
    "aggregateid": (MAX_AGGREGATEID_BYTES, "'oversized key ' || md5(r.aggregateid)", 46),
    "type": (MAX_TYPE_BYTES, "'oversized type'", 14),
    "topic": (MAX_TOPIC_BYTES, "'oversized topic'", 15),
}


def _whole_or_stand_in(column: str) -> str:
    limit, stand_in, _ = _STAND_INS[column]
    return (
        f"CASE WHEN r.fits OR coalesce(octet_length(r.{column}), 0) <= {limit} "
        f"THEN r.{column} ELSE {stand_in} END"
    )


def _stand_in_bytes(row: str) -> str:
    """What a row that is not transferred whole costs the fetch's budget: 36 for its id
    and each of the columns above as it comes."""
    terms = [
        f"coalesce(CASE WHEN octet_length({row}.{column}) <= {limit} "
        f"THEN octet_length({row}.{column}) ELSE {length} END, 0)"
        for column, (limit, _, length) in _STAND_INS.items()
    ]
    return " + ".join(["36", *terms])


# Whether an earlier held row of {row}'s key holds it back on {topic}: one probe of
# outbox_held_topic_idx, whose predicate is the held rows' (empty while all is well). A held
# row holds its key on the topic recorded with its failure (held_topic); '*' (not resolved)
# on every topic; '' (a topic that can never be valid) on none. So a row is held when this
# finds a held row on its topic, or one on '*': two probes, each an equality on every
# column of the index (a list of the two would be searched as a filter). The keys are
# compared by function, not by operator, so that the hash index of held keys (which the
# previous release reads) cannot serve it: that one finds every held row of the key and
# tests each. The seqs too are compared by function: under the statistics of an outbox the
# relay has emptied, every index looks alike, and the unique index on seq would answer the
# look-up by reading every entry below the row (tests/relay/test_round_trips.py). OFFSET 0
# keeps it a probe per row, never a join that reads every held row.
_HELD_ON = """
    SELECT 1 FROM outbox h
    WHERE hashtextextended(h.aggregateid, 0::bigint)
              = hashtextextended({row}.aggregateid, 0::bigint)
      AND h.held_topic = {topic}
      AND int8lt(h.seq, {row}.seq)
      AND (h.quarantined_at IS NOT NULL OR h.next_attempt_at IS NOT NULL)
      AND texteq(h.aggregateid, {row}.aggregateid)
    OFFSET 0
"""


def _not_held(row: str, topic: str) -> str:
    """The condition that no earlier held row holds ``row`` back on ``topic``."""
    on_its_topic = _HELD_ON.format(row=row, topic=topic)
    on_every_topic = _HELD_ON.format(row=row, topic="'*'")
    return f"NOT EXISTS ({on_its_topic})\n  AND NOT EXISTS ({on_every_topic})"


# The rows a fetch may read: not quarantined, after $2, in the lanes $1 (NULL: every lane),
# due, and not held back by an earlier held row of their key on their topic (a failing
# event holds back only its own key on its topic, until it is published or redriven).
_READY = f"""
FROM outbox o
WHERE o.quarantined_at IS NULL
  AND o.seq > $2
  AND ($1::smallint[] IS NULL OR o.lane = ANY($1::smallint[]))
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= clock_timestamp())
  AND {_not_held("o", _TOPIC_OF.format(row="o"))}
"""

# FETCH_READY's parts. Whether a row is one the relay has in flight ($8): named once in
# the statement, since each naming is an InitPlan of its own, which parses $8 again.
_IN_FLIGHT = "o.seq OPERATOR(pg_catalog.<@) (SELECT CAST($8::text AS pg_catalog.int8multirange))"
# What a row costs the fetch's byte budget, named twice one level above its columns: its
# size when it comes whole, else what its stand-ins bring (computed only then).
_COST = f"CASE WHEN c.fits THEN c.size ELSE {_stand_in_bytes('c')} END"

# Ready rows of the given lanes (NULL: every lane) after a cursor, in insert order, minus
# every row whose key has an earlier row on its topic that failed and is not yet published:
# a failing event holds back only its own key on its topic, until it is published or
# redriven.
#
# The cursor only moves forward within one pass; a pass starts again from the beginning
# once nothing is in flight. Rows a pass stepped over (a transaction that committed
# late, a row backing off) are found by the next pass. Writers of one aggregate
# serialise on it, so within a key seq order is commit order, and a key's later row
# can never be visible while an earlier one is not.
#
# Parameters: $1 lanes, $2 the seq to read after, $3 at most this many rows, $4 the topic
# template, $5 for a cursor fetch its start (0 otherwise: see "earlier"), $6 the largest
# row the relay takes whole (bytes), $7 the fetch's byte budget, $8 the seqs of the rows in
# flight that the fetch may meet again: an int8multirange as text ('{}' for a fetch from
# above them), read once per statement (the InitPlan of _IN_FLIGHT), tested by binary
# search per row. Text, not the type itself: the driver would look the type up with a
# query of its own on the session's path (tests/security/test_exact_calls.py).
#
# A cheap read: what the row costs was measured when it was inserted (size_bytes,
# migration 0009), and where a held row holds its key was recorded with its failure
# (held_topic), so each row costs one probe of outbox_held_topic_idx and nothing is printed
# for a row that is not sent. Bounded in bytes, not only rows: rows are returned while the
# bytes before them stay under $7, every byte returned counted (a row over $6, one stored
# before the door and not measured yet, or one in flight ($8), which the relay leaves out,
# comes without its payload, headers and references: its cost is what it does bring), so
# one fetch transfers at most $7 plus one row, and a pass that meets the rows in flight
# while their batches wait on the broker transfers none of them again.
FETCH_READY = f"""
SELECT r.seq AS seq,
       r.id::text AS id,
       {_whole_or_stand_in("aggregatetype")} AS aggregatetype,
       {_whole_or_stand_in("aggregateid")} AS aggregateid,
       {_whole_or_stand_in("type")} AS type,
       CASE WHEN r.fits THEN r.payload::text END AS payload,
       CASE WHEN r.fits THEN r.tenant_ref END AS tenant_ref,
       CASE WHEN r.fits THEN r.schema_version END AS schema_version,
       CASE WHEN r.fits THEN r.correlation_ref END AS correlation_ref,
       CASE WHEN r.fits THEN r.causation_ref END AS causation_ref,
       CASE WHEN r.fits THEN r.traceparent END AS traceparent,
       CASE WHEN r.fits THEN r.headers::text END AS headers,
       {_whole_or_stand_in("topic")} AS topic,
       r.created_at AS created_at,
       r.lane AS lane,
       r.attempts AS attempts,
       r.holds_key AS holds_key,
       r.size AS size,
       r.earlier AS earlier,
       CASE WHEN r.fits THEN r.tracestate END AS tracestate,
       r.duplicate AS duplicate
FROM (
    SELECT c.*,
           {_COST} AS cost,
           -- seq is unique: ROWS, which looks for no peers, sums what RANGE would
           sum({_COST}) OVER (ORDER BY c.seq ROWS UNBOUNDED PRECEDING) AS fetched_bytes
    FROM (
        SELECT o.seq, o.id, o.aggregatetype, o.aggregateid, o.type, o.payload, o.tenant_ref,
               o.schema_version, o.correlation_ref, o.causation_ref, o.traceparent,
               o.tracestate, o.headers, o.topic,
               -- in binary, formatted by the relay (relay/records.py, "ce_time");
               -- NULL outside the years RFC 3339 (and Python) can carry, which the
               -- relay rejects
               CASE WHEN o.created_at >= '0001-01-01 00:00:00+00'
                     AND o.created_at < '10000-01-01 00:00:00+00'
                    THEN o.created_at END AS created_at,
               o.lane, o.attempts,
               -- a row waiting to be (re)tried holds its key's later rows back (the
               -- NOT EXISTS below); when it is published that hold lifts in the
               -- middle of a pass
               o.next_attempt_at IS NOT NULL AS holds_key,
               -- NULL: stored before the door and not measured yet
               o.size_bytes AS size,
               -- taken whole (its cost its size), else its stand-ins (_COST)
               coalesce(o.size_bytes <= $6, false) AND NOT {_IN_FLIGHT} AS fits,
               -- For a cursor fetch: the last earlier row of the key at or below the
               -- fetch's start that is still waiting (neither held, which holds the key
               -- through the NOT EXISTS below, nor quarantined). The fetch did not read
               -- it; unless the relay has it in flight (and then every earlier one too),
               -- it committed after the cursor passed its seq, and this row must not
               -- overtake it.
               CASE WHEN $5 > 0 THEN (
                   SELECT e.seq FROM outbox e
                   WHERE hashtextextended(e.aggregateid, 0::bigint)
                             = hashtextextended(o.aggregateid, 0::bigint)
                     AND e.seq <= $5
                     AND e.quarantined_at IS NULL
                     AND e.next_attempt_at IS NULL
                     AND e.aggregateid = o.aggregateid
                   ORDER BY e.seq DESC
                   LIMIT 1
               ) END AS earlier,
               -- its id is an event's already published with another key, aggregatetype
               -- or type (a probe of the receipts' primary key): never sent
               EXISTS (
                   SELECT 1 FROM outbox_receipt p
                   WHERE p.id = o.id
                     AND NOT (p.aggregatetype = o.aggregatetype
                              AND p.aggregateid = o.aggregateid AND p.type = o.type)
               ) AS duplicate{_READY}        ORDER BY o.seq
        LIMIT $3
    ) c
    -- a fence: pulled up into the level above, each row's cost would be computed once
    -- for every place it is named there; ordered, so that the order carries up without
    -- a sort
    ORDER BY c.seq
    OFFSET 0
) r
WHERE r.fetched_bytes - r.cost < $7
ORDER BY r.seq
"""

# The seqs FETCH_READY would read for the same $1, $2, $3 and $4, and nothing else of the
# rows: what narrowing a failed fetch (relay/narrowing.py) reads to name the row it finds.
READY_SEQS = f"""
SELECT o.seq{_READY}ORDER BY o.seq
LIMIT $3
"""

# The fenced lanes: those of $2 that this instance ($1) still holds under the fence it
# fetched them with ($3, one per lane). Every write the relay makes for a lane goes
# through it, so a stale owner's write changes nothing. Written once, used by the
# acknowledgement and the failure statements alike.
_HELD_LANES = """held AS (
    SELECT l.lane
    FROM relay_lane l
    JOIN unnest($2::smallint[], $3::bigint[]) AS f(lane, fence)
      ON f.lane = l.lane AND f.fence = l.fence
    WHERE l.owner_id = $1 AND l.lease_expires_at > clock_timestamp()
    -- KEY SHARE: blocks a claim's FOR UPDATE (it skips the lane) but not our renewals
    FOR KEY SHARE OF l
)"""

# The highest seq handed out so far (0 before the first). Read before a full pass's first
# fetch, it bounds what the pass's later fetches may send: a row that fetch stepped over
# (its transaction had not committed) commits after that read, and its key's next row
# takes its seq only then, so above the bound (docs/relay.md, "Passes and late commits").
# Needs SELECT on the sequence; with the default CACHE 1, last_value is the last seq any
# session drew.
SEQ_ALLOCATED = """
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_seq_seq
"""

# Acknowledged rows leave the hot table and become receipts in one statement, but only
# for lanes this instance still holds with the fence it fetched them under; a stale
# owner's acknowledgement changes nothing and the new owner republishes (same id). The
# same statement counts the progress on the database clock (the health sidecar compares
# like with like) and returns how many rows became receipts.
#
# One statement, one round trip: on its own it is its whole transaction, and the
# transaction-local set_config makes that commit asynchronous (ASYNC_COMMIT below says
# why that is safe). The setting is read when the transaction commits, after the
# statement, and ends with it: it never stays on the connection.
#
# Written twice (_record_published): RECORD_PUBLISHED is a plain INSERT of the receipts,
# RECORD_REPUBLISHED updates a receipt already there (an event published again, same id).
# The upsert's speculative insertion probes the primary key once more per row and logs
# one more WAL record per row, on every batch, for an event that is almost never there.
# So the plain statement goes first; when it meets an existing receipt it fails as a
# whole, having changed nothing, and the upsert runs instead.
_RECEIPT_CONFLICT = """
    ON CONFLICT (id) DO UPDATE
    SET topic = EXCLUDED.topic, kafka_partition = EXCLUDED.kafka_partition,
        kafka_offset = EXCLUDED.kafka_offset, published_at = EXCLUDED.published_at
    -- the same event only: another one's receipt is never re-pointed
    WHERE outbox_receipt.aggregatetype = EXCLUDED.aggregatetype
      AND outbox_receipt.aggregateid = EXCLUDED.aggregateid
      AND outbox_receipt.type = EXCLUDED.type"""


def _record_published(on_conflict: str) -> str:
    return f"""
WITH {_HELD_LANES}, moved AS (
    DELETE FROM outbox o
    WHERE o.seq = ANY($4::bigint[]) AND o.lane = ANY(ARRAY(SELECT lane FROM held))
    RETURNING o.seq, o.id, o.aggregatetype, o.aggregateid, o.type, o.created_at
), acked AS (
    -- $4 lists the seqs partition batch by partition batch; batch g covers the
    -- positions $8[g]..$9[g] and starts at offset $7[g] in partition $6[g] of $5[g].
    SELECT s.seq, g.topic, g.kafka_partition, g.base_offset + (s.position - g.first) AS kafka_offset
    FROM pg_catalog.unnest($4::bigint[]) WITH ORDINALITY AS s(seq, position)
    JOIN unnest($5::text[], $6::int[], $7::bigint[], $8::int[], $9::int[])
        AS g(topic, kafka_partition, base_offset, first, last)
      ON s.position BETWEEN g.first AND g.last
), receipts AS (
    INSERT INTO outbox_receipt
        (id, aggregatetype, aggregateid, type, topic, kafka_partition, kafka_offset, created_at)
    SELECT m.id, m.aggregatetype, m.aggregateid, m.type, a.topic, a.kafka_partition,
           a.kafka_offset, m.created_at
    FROM moved m
    JOIN acked a ON a.seq = m.seq{on_conflict}
    RETURNING 1
), counted AS (
    SELECT count(*) AS recorded FROM receipts
), progress AS (
    UPDATE relay_instance
    SET last_publish_at = clock_timestamp(),
        published_total = published_total + (SELECT recorded FROM counted)
    WHERE instance_id = $1 AND (SELECT recorded FROM counted) > 0
)
SELECT recorded, set_config('synchronous_commit', 'off', true) FROM counted
"""


RECORD_PUBLISHED = _record_published("")
RECORD_REPUBLISHED = _record_published(_RECEIPT_CONFLICT)

# Failed rows: a retriable failure only schedules the next try; a permanent one also
# spends an attempt and quarantines the row when the budget is used up, or at once when
# no attempt can succeed ($9, final: too large, a topic not allowed). Each row records
# where it now holds its key back ($10: the topic the relay resolved it to, '' for one
# that can never be valid) and under which template ($11).
RECORD_FAILED = f"""
WITH {_HELD_LANES}, failed AS (
    SELECT * FROM unnest($4::bigint[], $5::text[], $6::bool[], $7::int[], $9::bool[],
                         $10::text[])
        AS f(seq, error_class, retriable, delay_ms, final, held_topic)
)
UPDATE outbox o
SET attempts = o.attempts + CASE WHEN f.retriable THEN 0 ELSE 1 END,
    last_error_class = f.error_class,
    next_attempt_at = clock_timestamp() + f.delay_ms::double precision * interval '1 millisecond',
    quarantined_at = CASE
        WHEN f.final OR (NOT f.retriable AND o.attempts + 1 >= $8) THEN clock_timestamp()
    END,
    held_topic = f.held_topic,
    held_template = $11
FROM failed f
WHERE o.seq = f.seq AND o.lane IN (SELECT lane FROM held)
RETURNING o.seq, o.quarantined_at IS NOT NULL
"""

# A row whose fetch fails on its own, again, while the rows around it fetch (relay/
# narrowing.py): quarantined with its cause ($5) without its content being read. Where it
# holds its key is not known: everywhere ('*') until the relay resolves it (HELD_TO_RESOLVE).
QUARANTINE_UNFETCHABLE = f"""
WITH {_HELD_LANES}
UPDATE outbox o
SET attempts = o.attempts + 1,
    last_error_class = $5,
    next_attempt_at = clock_timestamp(),
    quarantined_at = clock_timestamp(),
    held_topic = '*',
    held_template = NULL
WHERE o.seq = $4 AND o.quarantined_at IS NULL AND o.lane IN (SELECT lane FROM held)
RETURNING o.seq
"""

# Rows stored before the door (migration 0009) have no size: setting it fires the door's
# trigger, which measures them without printing what could print huge, and gives a row
# that can never be a record a size over every limit. Run as it sees such rows.
MEASURE = """
UPDATE outbox SET size_bytes = NULL
WHERE seq = ANY($1::bigint[]) AND size_bytes IS NULL
"""

# The held rows of lanes $1 resolved under another template than $2, or never: the relay
# resolves where each now holds its key (RESOLVE_HELD) before it fetches these lanes.
# Each column as the fetch would bring it (FETCH_READY's stand-ins); reads the partial index
# of held rows, empty while all is well.
HELD_TO_RESOLVE = f"""
SELECT r.seq AS seq, {_whole_or_stand_in("aggregatetype")} AS aggregatetype,
       {_whole_or_stand_in("topic")} AS topic
FROM (
    SELECT o.seq, o.aggregatetype, o.topic, false AS fits
    FROM outbox o
    WHERE (o.quarantined_at IS NOT NULL OR o.next_attempt_at IS NOT NULL)
      AND o.lane = ANY($1::smallint[])
      AND o.held_template IS DISTINCT FROM $2
    LIMIT $3
) r
"""

# Where each of those rows ($4 seqs, $5 topics) holds its key under template $6, for lanes
# this instance still holds under their fences.
RESOLVE_HELD = f"""
WITH {_HELD_LANES}
UPDATE outbox o
SET held_topic = f.held_topic, held_template = $6
FROM unnest($4::bigint[], $5::text[]) AS f(seq, held_topic)
WHERE o.seq = f.seq AND o.lane IN (SELECT lane FROM held)
  AND (o.quarantined_at IS NOT NULL OR o.next_attempt_at IS NOT NULL)
"""

# Losing a bookkeeping commit in a server crash loses only the "published" mark, never
# an event: the rows come back and are published again (same id). So the bookkeeping
# need not wait for its WAL flush.
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"

# Which of the given settings ($1, wanted values $2) the server runs with other values.
# Behind a transaction pooler the relay's session settings come from its role, not from
# the start-up packet; this says which ones the operator has not set there.
SETTINGS_NOT_IN_EFFECT = """
SELECT w.name
FROM unnest($1::text[], $2::text[]) AS w(name, wanted)
JOIN pg_catalog.pg_settings s ON s.name = w.name
WHERE s.setting <> w.wanted  -- in the setting's own unit (statement_timeout in ms)
ORDER BY w.name
"""

HEARTBEAT = """
INSERT INTO relay_instance (instance_id) VALUES ($1)
ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = clock_timestamp()
"""

# The heartbeat with the instance's topic template ($2), which lets the health sidecar find
# a row's topic as this instance does (a role granted before the column existed may not
# update it: then the plain heartbeat, and the sidecar's rule without a template).
HEARTBEAT_WITH_TEMPLATE = """
INSERT INTO relay_instance (instance_id, topic_template) VALUES ($1, $2)
ON CONFLICT (instance_id) DO UPDATE
SET heartbeat_at = clock_timestamp(), topic_template = EXCLUDED.topic_template
"""

LIVE_INSTANCES = """
SELECT count(*) FROM relay_instance
WHERE heartbeat_at > clock_timestamp() - $1::bigint::double precision * interval '1 millisecond'
"""

FORGET_DEAD_INSTANCES = """
DELETE FROM relay_instance
WHERE heartbeat_at < clock_timestamp() - $1::bigint::double precision * interval '1 millisecond'
"""

# Extend the leases this instance still holds.
RENEW_LANES = """
UPDATE relay_lane
SET lease_expires_at = clock_timestamp() + $2::bigint::double precision * interval '1 millisecond'
WHERE owner_id = $1 AND lease_expires_at > clock_timestamp()
RETURNING lane, fence
"""

# Take free or expired lanes, up to $3 of them; each change of owner bumps the fence.
CLAIM_LANES = """
UPDATE relay_lane l
SET owner_id = $1,
    fence = l.fence + 1,
    lease_expires_at = clock_timestamp() + $2::bigint::double precision * interval '1 millisecond'
WHERE l.lane IN (
    SELECT lane FROM relay_lane
    WHERE owner_id IS NULL OR lease_expires_at <= clock_timestamp()
    ORDER BY lane
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
RETURNING l.lane, l.fence
"""

RELEASE_LANES = """
UPDATE relay_lane SET owner_id = NULL, lease_expires_at = NULL
WHERE owner_id = $1 AND lane = ANY($2::smallint[])
"""

LEAVE = "DELETE FROM relay_instance WHERE instance_id = $1"

PENDING_SUMMARY = """
SELECT count(*) FILTER (WHERE quarantined_at IS NULL),
       count(*) FILTER (WHERE quarantined_at IS NOT NULL),
       -- two epochs, not one interval: a row created at -infinity is infinitely old,
       -- where subtracting infinite timestamps fails
       extract(epoch FROM clock_timestamp())
           - extract(epoch FROM min(created_at) FILTER (WHERE quarantined_at IS NULL))
FROM outbox
"""

# The oldest open transaction that has written to the outbox: its rows are invisible
# until it commits, and it holds back vacuum of the rows the relay deletes. Only the
# pid and the transaction's age are read, never its query text. pg_locks is server-wide,
# and a database made from the same template has an outbox of the same oid: this one's.
OLDEST_OUTBOX_WRITER = """
SELECT a.pid, extract(epoch FROM clock_timestamp() - a.xact_start)
FROM pg_locks l
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.relation = 'outbox'::regclass::oid
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.mode = 'RowExclusiveLock' AND a.pid <> pg_backend_pid()
  AND a.xact_start IS NOT NULL
ORDER BY a.xact_start
LIMIT 1
"""

# Receipts past their retention ($1 ms), oldest first, at most $2 of them. The batch is
# picked from outbox_receipt_published_idx up to the bound, an index condition (the
# statement's start is stable within it; a bound on clock_timestamp() was a filter, and
# once fewer than a batch were old enough the pick read every receipt of the window), and
# deleted at the row addresses the pick read, a heap visit each (joining it on id read the
# whole primary key). A receipt updated meanwhile (its event published again) has moved,
# so this round leaves it; a later one deletes it if it is still old enough.
PRUNE_RECEIPTS = """
DELETE FROM outbox_receipt
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM outbox_receipt
    WHERE published_at
          < statement_timestamp() - $1::bigint::double precision * interval '1 millisecond'
    ORDER BY published_at
    LIMIT $2
))
"""

LISTEN_CHANNEL = "outbox_relay"

NOTIFY = "SELECT pg_notify('outbox_relay', '')"
