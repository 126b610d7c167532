"""The events every system is fed: 1 KiB payloads on 1,000 keys, as a backlog or a paced stream."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg

KEYS = 1000
FILL = "x" * 1000  # with the JSON around it: ~1 KiB per value
DRAIN_AGGREGATE = "bench"
LATENCY_AGGREGATE = "latency"
EVENT_TYPE = "bench.event"
BACKLOG_CHUNK = 1000  # rows per transaction while the backlog builds up

# A backlog as writers build it during downtime: many transactions of a thousand rows.
FILL_BACKLOG = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT $1, 'key-' || (g % $4), $5, jsonb_build_object('n', g, 'fill', $6::text)
FROM generate_series($2::bigint, $3::bigint) AS g
"""

# One event per transaction (autocommit): the writer's COMMIT returns when execute does.
INSERT_ONE = """
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, $4, jsonb_build_object('n', $5::bigint, 'fill', $6::text))
"""


async def fill_backlog(database_url: str, aggregate: str, events: int) -> None:
    """``events`` outbox rows, committed in chunks of BACKLOG_CHUNK."""
    conn = await asyncpg.connect(database_url)
    try:
        for first in range(1, events + 1, BACKLOG_CHUNK):
            last = min(events, first + BACKLOG_CHUNK - 1)
            await conn.execute(FILL_BACKLOG, aggregate, first, last, KEYS, EVENT_TYPE, FILL)
    finally:
        await conn.close()


class OutboxWriters:
    """One connection per writer lane, each committing one outbox event at a time."""

    def __init__(self, database_url: str, lanes: int) -> None:
        self._url = database_url
        self._lanes = lanes
        self._conns: list[asyncpg.Connection] = []

    async def __aenter__(self) -> OutboxWriters:
        self._conns = [await asyncpg.connect(self._url) for _ in range(self._lanes)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for conn in self._conns:
            await conn.close()

    def server_pids(self) -> set[int]:
        """The PostgreSQL backends of the writer connections."""
        return {conn.get_server_pid() for conn in self._conns}

    async def emit(self, lane: int, n: int) -> str:
        """Commit one event on the lane's connection; its id."""
        event_id = str(uuid.uuid4())
        await self._conns[lane].execute(
            INSERT_ONE,
            event_id,
            LATENCY_AGGREGATE,
            key_of(n * self._lanes + lane),
            EVENT_TYPE,
            n,
            FILL,
        )
        return event_id


def key_of(n: int) -> str:
    """The aggregate id of the n-th event: 1,000 keys in turn."""
    return f"key-{n % KEYS}"


def raw_record(n: int, event_id: str, stamp: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers as the relay writes them (docs: Kafka record format)."""
    value = json.dumps({"fill": FILL, "n": n}, separators=(",", ":")).encode()
    ident = event_id.encode()
    headers = [
        ("id", ident),
        ("ce_specversion", b"1.0"),
        ("ce_id", ident),
        ("ce_source", b"urn:outbox-relay:bench"),
        ("ce_type", EVENT_TYPE.encode()),
        ("ce_time", stamp.encode()),
        ("content-type", b"application/json"),
    ]
    return key_of(n).encode(), value, headers


def utc_stamp() -> str:
    """An RFC 3339 time, as ce_time carries it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Emit = Callable[[int, int], Awaitable[str]]


async def paced(emit: Emit, *, rate: float, seconds: float, lanes: int) -> dict[str, float]:
    """Call ``emit`` at ``rate`` per second over ``lanes``; each event id → when emit returned."""
    sent: dict[str, float] = {}
    deadline = time.perf_counter() + seconds
    interval = lanes / rate

    async def lane(index: int) -> None:
        due = time.perf_counter() + interval * index / lanes  # lanes spread over one interval
        n = 0
        while due < deadline:
            pause = due - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)
            event_id = await emit(index, n)
            sent[event_id] = time.time()  # the commit (or send) point: visible from here on
            n += 1
            due += interval

    await asyncio.gather(*(lane(i) for i in range(lanes)))
    return sent
