"""The relay's database calls: typed functions over relay/sql.py.

This is the one place that knows each statement's positional parameters; the loops
call these and never run SQL themselves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import asyncpg

from pgconnect import POOLER_STARTUP_PARAMETERS, create_pool, is_open, pool_options
from relay import sql
from relay.outcome import FailedRow, PublishedGroup
from relay.records import MAX_FETCHED_ROW_BYTES, OutboxRow, held_topic

# The outbox swings from empty to a large burst faster than autovacuum re-analyzes it;
# with stale statistics the planner chose a full scan plus sort for the fetch (seconds
# per batch on a 200k backlog) or a nested loop over the whole table. Every relay
# statement is written for its index, so the relay's own sessions simply rule out the
# alternatives; JIT only adds latency to these short statements. Behind a transaction
# pooler only application_name is sent; docs/relay.md ("Behind PgBouncer") gives the
# ALTER ROLE that sets the rest for the relay's role.
#
# Each statement keeps its generic plan, made once per connection. Left to choose, the
# server priced a plan for a one-event batch's one-element arrays below the generic one and
# planned the recording statement again on every call: at a low rate, where every batch is
# one event, that planning cost the server as much as the statement's own work. Behind a
# transaction pooler no statement is kept (each is parsed and planned at every call), so
# the role is not asked for this one (NAMED_STATEMENTS_ONLY).
RELAY_SESSION_SETTINGS = {
    "application_name": "outbox-relay",
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "enable_sort": "off",
    "jit": "off",
    "plan_cache_mode": "force_generic_plan",
}
NAMED_STATEMENTS_ONLY = frozenset({"plan_cache_mode"})
DEFAULT_STATEMENT_TIMEOUT_MS = 5_000


def relay_session_settings(statement_timeout_ms: int) -> dict[str, str]:
    """:data:`RELAY_SESSION_SETTINGS` and the statement timeout: no row's content, and no
    plan gone wrong, keeps one of the relay's statements running for longer."""
    return {**RELAY_SESSION_SETTINGS, "statement_timeout": str(statement_timeout_ms)}


async def create_relay_pool(
    url: str | None,
    *,
    transaction_pooler: bool = False,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
) -> asyncpg.Pool:
    """The relay's pool: its sessions carry :func:`relay_session_settings` (directly).

    The relay keeps no session state on these connections (its only setting is local to
    a transaction; LISTEN has a connection of its own), so they are released without the
    reset round trip: on the hot path every fetch and every record releases one.
    """
    options = pool_options(
        relay_session_settings(statement_timeout_ms),
        transaction_pooler=transaction_pooler,
        session_state=False,
    )
    return await create_pool(url, min_size=2, max_size=4, **options)


class PublishedArrays(NamedTuple):
    """RECORD_PUBLISHED's arrays: one seq per event, the rest once per partition batch.

    Batch g covers the positions ``firsts[g]..lasts[g]`` (1-based) of ``seqs``; their
    offsets run on from ``base_offsets[g]``.
    """

    seqs: list[int]
    topics: list[str]
    partitions: list[int]
    base_offsets: list[int]
    firsts: list[int]
    lasts: list[int]


def published_arrays(groups: Sequence[PublishedGroup]) -> PublishedArrays:
    """Lay out acknowledged partition batches as RECORD_PUBLISHED takes them.

    A group that runs on from the one before it (same topic and partition, its offset
    the next) joins that entry: the engine hands its rows over one by one, and the
    statement matches every seq against every entry, so an entry per row would make
    recording a batch quadratic in its rows.
    """
    seqs: list[int] = []
    topics: list[str] = []
    partitions: list[int] = []
    base_offsets: list[int] = []
    firsts: list[int] = []
    lasts: list[int] = []
    for group in groups:
        runs_on = (
            bool(topics)
            and topics[-1] == group.topic
            and partitions[-1] == group.partition
            and base_offsets[-1] + (lasts[-1] - firsts[-1] + 1) == group.base_offset
        )
        if not runs_on:
            topics.append(group.topic)
            partitions.append(group.partition)
            base_offsets.append(group.base_offset)
            firsts.append(len(seqs) + 1)
            lasts.append(len(seqs))
        seqs.extend(row.seq for row in group.rows)
        lasts[-1] = len(seqs)
    return PublishedArrays(seqs, topics, partitions, base_offsets, firsts, lasts)


@dataclass(frozen=True)
class Recorded:
    """What one outcome's bookkeeping changed."""

    published: int  # rows that became receipts (fewer than acknowledged if a lane moved)
    quarantined: int


class PendingSummary(NamedTuple):
    """The backlog: rows waiting, rows in quarantine, age of the oldest waiting row."""

    pending: int
    quarantined: int
    oldest_age_s: float


class OpenWriter(NamedTuple):
    """The oldest open transaction that has written to the outbox: pid and age only."""

    pid: int
    age_s: float


async def record_published(
    conn: asyncpg.Connection,
    instance_id: str,
    fences: Mapping[int, int],
    groups: Sequence[PublishedGroup],
) -> int:
    """Turn acknowledged rows of lanes still held under ``fences`` into receipts; return
    how many (fewer than acknowledged when a lane changed owner meanwhile).

    On its own the plain insert goes first and the upsert only when a receipt of one of
    the events is already there (sql.RECORD_PUBLISHED says why); inside a transaction a
    refused statement would end it, so there the upsert goes at once.
    """
    lanes, lane_fences = _lanes_and_fences(fences)
    args = (instance_id, lanes, lane_fences, *published_arrays(groups))
    if not conn.is_in_transaction():
        try:
            published: int = await conn.fetchval(sql.RECORD_PUBLISHED, *args)
            return published
        except asyncpg.UniqueViolationError:
            pass  # an event published before: the statement changed nothing
    recorded: int = await conn.fetchval(sql.RECORD_REPUBLISHED, *args)
    return recorded


async def record_failed(
    conn: asyncpg.Connection,
    instance_id: str,
    fences: Mapping[int, int],
    failed: Sequence[FailedRow],
    delays_ms: Sequence[int],
    max_attempts: int,
    topic_template: str,
) -> int:
    """Schedule failed rows of lanes still held under ``fences`` again after their delay
    (one per row), or quarantine them, each holding its key back on its topic under
    ``topic_template``; return how many were quarantined."""
    lanes, lane_fences = _lanes_and_fences(fences)
    rows = await conn.fetch(
        sql.RECORD_FAILED,
        instance_id,
        lanes,
        lane_fences,
        [row.seq for row, _ in failed],
        [failure.name for _, failure in failed],
        [failure.retriable for _, failure in failed],
        list(delays_ms),
        max_attempts,
        [failure.final for _, failure in failed],
        [held_topic(row.topic, row.aggregatetype, topic_template) for row, _ in failed],
        topic_template,
    )
    return sum(1 for r in rows if r[1])


async def pending_summary(conn: asyncpg.Connection) -> PendingSummary:
    """The backlog: rows waiting and in quarantine, and the oldest waiting row's age."""
    pending, quarantined, oldest_age = await conn.fetchrow(sql.PENDING_SUMMARY)
    return PendingSummary(pending, quarantined, float(oldest_age or 0.0))


async def oldest_writer(conn: asyncpg.Connection) -> OpenWriter | None:
    """The oldest open transaction that has written to the outbox, if any."""
    writer = await conn.fetchrow(sql.OLDEST_OUTBOX_WRITER)
    return OpenWriter(writer[0], float(writer[1])) if writer else None


_RESOLVE_BATCH = 1_000  # held rows resolved per statement


def _lane_filter(lanes: Collection[int]) -> list[int] | None:
    """NULL asks for every lane, so a statement need not match each row against 64."""
    return None if len(lanes) == sql.LANE_COUNT else sorted(lanes)


def _lanes_and_fences(fences: Mapping[int, int]) -> tuple[list[int], list[int]]:
    lanes = sorted(fences)
    return lanes, [fences[lane] for lane in lanes]


def _status_count(status: str) -> int:
    """The row count of a command status such as ``INSERT 0 12`` or ``DELETE 3``."""
    return int(status.rsplit(" ", 1)[-1])


def seq_ranges(seqs: Sequence[int]) -> str:
    """Seqs in order as an int8multirange's text (FETCH_READY's $8): each run of
    consecutive seqs one half-open range, so a pass over rows sent in order names few."""
    ranges: list[list[int]] = []
    for seq in seqs:
        if ranges and ranges[-1][1] == seq:
            ranges[-1][1] = seq + 1
        else:
            ranges.append([seq, seq + 1])
    return "{" + ",".join(f"[{lower},{upper})" for lower, upper in ranges) + "}"


class OutboxStore(Protocol):
    """What the relay reads and writes in the database (:class:`RelayStore` over a pool).

    The engine takes a factory of these, so a test can hand it a store that pauses or
    fails at one named step.
    """

    async def fetch_ready(
        self,
        lanes: Collection[int],
        cursor: int,
        limit: int,
        *,
        check_below: int = 0,
        in_flight: Sequence[int] = (),
    ) -> list[OutboxRow]: ...

    async def seq_allocated(self) -> int | None: ...

    async def record_outcome(
        self,
        fences: Mapping[int, int],
        published: Sequence[PublishedGroup],
        failed: Sequence[FailedRow],
        delays_ms: Sequence[int],
        *,
        max_attempts: int,
    ) -> Recorded: ...

    async def prune_receipts(self, retention_ms: int, batch_size: int) -> int: ...

    async def settings_not_in_effect(self, wanted: Mapping[str, str]) -> list[str]: ...

    async def backlog(self) -> tuple[PendingSummary, OpenWriter | None]: ...

    async def ready_seqs(self, lanes: Collection[int], cursor: int, limit: int) -> list[int]: ...

    async def measure(self, seqs: Sequence[int]) -> None: ...

    async def quarantine_unfetchable(
        self, fences: Mapping[int, int], seq: int, cause: str
    ) -> bool: ...

    async def resolve_holds(self, fences: Mapping[int, int]) -> int: ...

    async def close(self) -> None: ...


class StoreFactory(Protocol):
    """Makes the relay's store over its pool (the engine calls it once per run)."""

    def __call__(
        self, pool: asyncpg.Pool, *, instance_id: str, topic_template: str, fetch_max_bytes: int
    ) -> OutboxStore: ...


# Connections the store keeps between its statements instead of giving them back to the
# pool: a fetch's and a recording's. The rest of the pool (max 4) serves the lanes' leases
# and housekeeping, and a third statement at once (two recordings overlap) borrows one.
KEPT_CONNECTIONS = 2


class _KeptConnections:
    """Up to :data:`KEPT_CONNECTIONS` of a pool's connections, kept between statements."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._kept: list[asyncpg.Connection] = []

    async def take(self) -> asyncpg.Connection:
        """A kept connection, else one from the pool. One the server closed meanwhile is
        given back (the pool opens a fresh one), as the pool itself would at checkout."""
        while self._kept:
            conn = self._kept.pop()
            if is_open(conn):
                return conn
            await self._pool.release(conn)  # nothing to do when the pool took it back
        acquired: asyncpg.Connection = await self._pool.acquire()
        return acquired

    async def keep(self, conn: asyncpg.Connection) -> None:
        """Keep a connection whose statement succeeded (beyond the number kept, or in a
        transaction still, it goes back to the pool)."""
        if len(self._kept) < KEPT_CONNECTIONS and not conn.is_in_transaction():
            self._kept.append(conn)
        else:
            await self._pool.release(conn)

    async def drop(self, conn: asyncpg.Connection) -> None:
        """Throw away a connection something went wrong on."""
        if is_open(conn):
            conn.terminate()
        await self._pool.release(conn)

    async def close(self) -> None:
        kept, self._kept = self._kept, []
        for conn in kept:
            await self._pool.release(conn)


class _Turn:
    """One statement's (or transaction's) turn on one of the store's connections.

    A connection comes back to the store when the block ends normally, and is thrown away
    (terminated, given back to the pool, which opens a fresh one) when anything went wrong
    on it: one killed or cancelled mid-protocol can be left in a state where the next
    query fails. A class, not a generator: on the hot path every fetch and every recording
    takes one, and asyncpg's pool checkout (a timeout and a shielded task per release) cost
    the relay about 5 % of its CPU at 1,000 events/s.
    """

    __slots__ = ("_conn", "_connections")

    def __init__(self, connections: _KeptConnections) -> None:
        self._connections = connections
        self._conn: asyncpg.Connection | None = None

    async def __aenter__(self) -> asyncpg.Connection:
        self._conn = await self._connections.take()
        return self._conn

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        assert self._conn is not None
        if exc_type is None:
            await self._connections.keep(self._conn)
        else:
            await self._connections.drop(self._conn)


class RelayStore:
    """The relay's reads and writes over its pool, each in the transaction it needs.

    It keeps up to :data:`KEPT_CONNECTIONS` of the pool's connections between statements
    (:class:`_Turn`); :meth:`close` gives them back, before the pool is closed.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        instance_id: str,
        topic_template: str,
        fetch_max_bytes: int,
    ) -> None:
        self._instance_id = instance_id
        self._topic_template = topic_template
        self._fetch_max_bytes = fetch_max_bytes
        self._connections = _KeptConnections(pool)

    def _turn(self) -> _Turn:
        return _Turn(self._connections)

    async def close(self) -> None:
        """Give the kept connections back to the pool (which waits for them to close)."""
        await self._connections.close()

    async def fetch_ready(
        self,
        lanes: Collection[int],
        cursor: int,
        limit: int,
        *,
        check_below: int = 0,
        in_flight: Sequence[int] = (),
    ) -> list[OutboxRow]:
        """Ready rows of ``lanes`` after ``cursor`` in seq order: at most ``limit`` rows, and
        no more bytes than the fetch budget plus one row. ``check_below`` (a cursor fetch's
        start, else 0) asks for each row's earliest pending row of its key at or below it;
        a row whose seq is one of ``in_flight`` (in order) comes without its content, as a
        row too large to take whole does."""
        async with self._turn() as conn:
            records = await conn.fetch(
                sql.FETCH_READY,
                _lane_filter(lanes),
                cursor,
                limit,
                self._topic_template,
                check_below,
                MAX_FETCHED_ROW_BYTES,
                self._fetch_max_bytes,
                seq_ranges(in_flight),
            )
        # The statement's columns are OutboxRow's fields, in order and by name
        # (tests/unit/test_store.py holds them so).
        return list(map(OutboxRow._make, records))

    async def seq_allocated(self) -> int | None:
        """The highest seq drawn so far (sql.SEQ_ALLOCATED); None when this role may not
        read the sequence (granted before the relay needed it: run ``grant`` again)."""
        async with self._turn() as conn:
            try:
                return int(await conn.fetchval(sql.SEQ_ALLOCATED))
            except asyncpg.InsufficientPrivilegeError:
                return None

    async def record_outcome(
        self,
        fences: Mapping[int, int],
        published: Sequence[PublishedGroup],
        failed: Sequence[FailedRow],
        delays_ms: Sequence[int],
        *,
        max_attempts: int,
    ) -> Recorded:
        """Record one batch's outcome in one transaction; see :func:`record_published`
        and :func:`record_failed`."""
        recorded = quarantined = 0
        if not failed:
            # The usual case: one statement, its own transaction (RECORD_PUBLISHED sets
            # the asynchronous commit itself), one round trip.
            async with self._turn() as conn:
                recorded = await record_published(conn, self._instance_id, fences, published)
            return Recorded(recorded, quarantined)
        async with self._turn() as conn, conn.transaction():
            await conn.execute(sql.ASYNC_COMMIT)
            if published:
                recorded = await record_published(conn, self._instance_id, fences, published)
            if failed:
                quarantined = await record_failed(
                    conn,
                    self._instance_id,
                    fences,
                    failed,
                    delays_ms,
                    max_attempts,
                    self._topic_template,
                )
        return Recorded(recorded, quarantined)

    async def prune_receipts(self, retention_ms: int, batch_size: int) -> int:
        """Delete up to ``batch_size`` receipts older than the retention; return how many."""
        async with self._turn() as conn:
            status = await conn.execute(sql.PRUNE_RECEIPTS, retention_ms, batch_size)
        return _status_count(status)

    async def settings_not_in_effect(self, wanted: Mapping[str, str]) -> list[str]:
        """The names of the ``wanted`` session settings (:func:`relay_session_settings`)
        the server runs with other values, among those a pooler's role must carry: not the
        start-up parameters the pooler passes on, nor :data:`NAMED_STATEMENTS_ONLY`."""
        names = sorted(wanted.keys() - POOLER_STARTUP_PARAMETERS - NAMED_STATEMENTS_ONLY)
        async with self._turn() as conn:
            rows = await conn.fetch(
                sql.SETTINGS_NOT_IN_EFFECT, names, [wanted[name] for name in names]
            )
        return [row[0] for row in rows]

    async def backlog(self) -> tuple[PendingSummary, OpenWriter | None]:
        """The pending summary and the oldest open outbox writer, read on one connection."""
        async with self._turn() as conn:
            return await pending_summary(conn), await oldest_writer(conn)

    async def ready_seqs(self, lanes: Collection[int], cursor: int, limit: int) -> list[int]:
        """The seqs :meth:`fetch_ready` would read (nothing else of the rows)."""
        async with self._turn() as conn:
            rows = await conn.fetch(
                sql.READY_SEQS, _lane_filter(lanes), cursor, limit, self._topic_template
            )
        return [row[0] for row in rows]

    async def measure(self, seqs: Sequence[int]) -> None:
        """Have the door measure these rows stored before it (sql.MEASURE)."""
        async with self._turn() as conn:
            await conn.execute(sql.MEASURE, list(seqs))

    async def quarantine_unfetchable(self, fences: Mapping[int, int], seq: int, cause: str) -> bool:
        """Quarantine the row ``seq`` with ``cause`` without reading it, if its lane is still
        held under ``fences``; True when it was."""
        lanes, lane_fences = _lanes_and_fences(fences)
        async with self._turn() as conn:
            done = await conn.fetchval(
                sql.QUARANTINE_UNFETCHABLE, self._instance_id, lanes, lane_fences, seq, cause
            )
        return done is not None

    async def resolve_holds(self, fences: Mapping[int, int]) -> int:
        """Record where each held row of the lanes held under ``fences`` holds its key under
        this relay's template, where another template (or none) decided it; how many."""
        lanes, lane_fences = _lanes_and_fences(fences)
        resolved = 0
        while True:
            async with self._turn() as conn:
                rows = await conn.fetch(
                    sql.HELD_TO_RESOLVE, lanes, self._topic_template, _RESOLVE_BATCH
                )
                if not rows:
                    return resolved
                status = await conn.execute(
                    sql.RESOLVE_HELD,
                    self._instance_id,
                    lanes,
                    lane_fences,
                    [row["seq"] for row in rows],
                    [
                        held_topic(row["topic"], row["aggregatetype"], self._topic_template)
                        for row in rows
                    ],
                    self._topic_template,
                )
            changed = _status_count(status)
            if not changed:  # the lanes moved on meanwhile: their new owner resolves them
                return resolved
            resolved += changed
