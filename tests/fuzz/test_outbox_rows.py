"""Fuzzing what writers put in the outbox: odd payloads, headers, keys, topics and sizes.

Rows are inserted by plain SQL into the real PostgreSQL while one relay runs against the
real broker. Each committed row must end up either on Kafka, intact (key, value and
headers read back byte for byte from where its receipt says it landed), or quarantined
with a cause; a row the relay could publish must not be quarantined; the relay keeps
running throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from hypothesis import event, example, given
from hypothesis import strategies as st

from relay.records import MAX_FETCHED_ROW_BYTES, MAX_RECORD_BYTES, RESERVED_HEADERS
from tests.fuzz.profiles import fuzz_settings
from tests.support.relay import RunningRelay, fast_config, running_relay
from tests.support.waiting import wait_until

CE_SOURCE = "urn:fuzz"
TYPES = ("a", "b")  # the aggregate types routed by the template, to pre-created topics
PARTITIONS = 2
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_OPTIONAL = ("tenant_ref", "schema_version", "correlation_ref", "causation_ref")
# Only the relay's own bound is predicted; a record just under it still fits the broker.
_COMFORTABLY_SMALL = MAX_RECORD_BYTES - 64 * 1024

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, tenant_ref, schema_version,
                    correlation_ref, causation_ref, traceparent, headers, topic)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10::jsonb, $11)
RETURNING id::text, payload::text, headers::text
"""
# Rows of the example still in the outbox.
PENDING = "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])"
# A row is settled once it left the outbox (published), was quarantined, or waits behind
# an earlier quarantined row of its key.
UNSETTLED = """
SELECT count(*) FROM outbox o
WHERE o.id = ANY($1::uuid[]) AND o.quarantined_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM outbox h
      WHERE h.aggregateid = o.aggregateid AND h.seq < o.seq AND h.quarantined_at IS NOT NULL
  )
"""
QUARANTINED = """
SELECT id::text, last_error_class FROM outbox
WHERE id = ANY($1::uuid[]) AND quarantined_at IS NOT NULL
"""
RECEIPTS = """
SELECT id::text, topic, kafka_partition, kafka_offset FROM outbox_receipt
WHERE id = ANY($1::uuid[])
"""
# Quarantined rows would hold their keys back in later examples: the test removes them.
FORGET_QUARANTINED = "DELETE FROM outbox WHERE quarantined_at IS NOT NULL"


@dataclass(frozen=True)
class Row:
    aggregatetype: str
    aggregateid: str
    type: str
    payload: str | None  # JSON text, or None for a tombstone
    optional: tuple[str | None, ...]  # tenant_ref, schema_version, correlation_ref, causation_ref
    traceparent: str | None
    headers: dict[str, str] | None
    topic: str | None  # None: routed by the template


@dataclass
class World:
    namespace: str
    db: asyncpg.Connection
    relay: RunningRelay
    reader: AIOKafkaConsumer

    def topic(self, aggregatetype: str) -> str:
        return f"{self.namespace}.{aggregatetype}"


@contextlib.asynccontextmanager
async def kafka_admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


@pytest_asyncio.fixture
async def world(database_url: str, kafka_bootstrap: str) -> AsyncIterator[World]:
    namespace = f"fz{uuid.uuid4().hex[:10]}"
    topics = [f"{namespace}.{name}" for name in (*TYPES, "own")]
    async with kafka_admin(kafka_bootstrap) as admin:
        await admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics])
    reader = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
    await reader.start()
    config = fast_config(database_url, kafka_bootstrap, namespace, max_attempts=1)
    config = type(config)(**{**config.__dict__, "ce_source": CE_SOURCE})
    db = await asyncpg.connect(database_url)
    try:
        async with running_relay(config) as relay:
            yield World(namespace, db, relay, reader)
            assert not relay.task.done(), "the relay stopped"
    finally:
        await db.close()
        await reader.stop()
    async with kafka_admin(kafka_bootstrap) as admin:
        await admin.delete_topics(topics)


# -- rows ----------------------------------------------------------------------------------
# PostgreSQL text and jsonb hold no NUL; anything else goes.
text = st.text(st.characters(codec="utf-8", blacklist_characters="\x00"), max_size=30)
nonempty = st.text(
    st.characters(codec="utf-8", blacklist_characters="\x00"), min_size=1, max_size=30
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(min_value=-(10**40), max_value=10**40),
        st.floats(allow_nan=False, allow_infinity=False),
        text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)),
    max_leaves=12,
)
big_payloads = st.integers(0, MAX_RECORD_BYTES + 100_000).map(lambda n: padded(n))
header_names = st.one_of(st.sampled_from(sorted(RESERVED_HEADERS | set(_OPTIONAL))), text)
traceparents = st.one_of(
    st.none(),
    st.builds(
        lambda t, s, f: f"00-{t:032x}-{s:016x}-{f:02x}",
        st.integers(1, 2**128 - 1),
        st.integers(1, 2**64 - 1),
        st.integers(0, 255),
    ),
    # ones a receiver must ignore: published without them
    st.sampled_from(
        [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        ]
    ),
)


def void_traceparent(traceparent: str | None) -> bool:
    """A trace context the W3C spec says a receiver must ignore."""
    if traceparent is None:
        return False
    version, trace_id, parent_id, _ = traceparent.split("-")
    return version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16


# Header values near and over the record limit.
header_values = st.one_of(
    text,
    st.integers(MAX_RECORD_BYTES - 20_000, MAX_RECORD_BYTES + 20_000).map(lambda n: "v" * n),
)


def long_keys() -> st.SearchStrategy[str]:
    """Long keys, compressible and not: random hex around B-tree's 2,704-byte entry limit
    (pglz cannot shrink it), which a key index must still take."""
    return st.one_of(
        st.integers(1, 20_000).map(lambda n: "k" * n),
        st.binary(min_size=1_000, max_size=2_000).map(bytes.hex),
    )


@st.composite
def rows(draw: st.DrawFn) -> Row:
    routed = draw(st.booleans())
    topic = None
    if not routed:
        topic = draw(
            st.one_of(
                st.just("own"),  # the pre-created topic, by its full name below
                nonempty,  # almost never a valid name: quarantined as invalid_topic
                st.sampled_from([".", "..", "x" * 249, "x" * 250, "a/b", "é", "own\n"]),
            )
        )
    return Row(
        # A routed row goes to a pre-created topic; an odd type yields an invalid name.
        aggregatetype=draw(st.sampled_from(TYPES)) if routed else draw(nonempty),
        aggregateid=draw(st.one_of(nonempty, long_keys())),
        type=draw(nonempty),
        payload=draw(st.one_of(json_values.map(json.dumps), st.none(), big_payloads)),
        optional=tuple(draw(st.one_of(st.none(), text)) for _ in _OPTIONAL),
        traceparent=draw(traceparents),
        headers=draw(
            st.one_of(st.none(), st.dictionaries(header_names, header_values, max_size=4))
        ),
        topic=topic,
    )


def padded(size: int) -> str:
    return json.dumps({"pad": "x" * size})


def deep(depth: int) -> str:
    """JSON nested deeper than a recursive formatter's stack (jsonb takes it)."""
    return "[" * depth + "]" * depth


PLAIN = Row("a", "k", "t", '{"x": 1}', (None,) * 4, None, None, None)
# 3,200 characters of pseudo-random hex: over a B-tree entry's limit even after pglz.
INCOMPRESSIBLE_KEY = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(50))


# -- what must happen ----------------------------------------------------------------------
def expected_cause(world: World, row: Row, payload_bytes: int) -> str | None:
    """The cause a row must be quarantined with, or None when it must be published."""
    topic = world.topic(row.aggregatetype) if row.topic is None else row.topic
    if row.topic == "own":
        topic = world.topic("own")
    if not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        return "invalid_topic"
    if row.topic is not None and row.topic != "own":
        return "unknown"  # a valid name the broker may create or refuse: either is fine
    reserved = RESERVED_HEADERS | set(_OPTIONAL)
    if row.headers and any(n.lower() in reserved or not n for n in row.headers):
        return "invalid_headers"
    if payload_bytes > MAX_FETCHED_ROW_BYTES + 1_000:
        return "too_large"  # never fetched whole
    if len(row.aggregateid.encode()) + payload_bytes + 4096 > _COMFORTABLY_SMALL:
        return "unknown"  # near or over the limit: published whole, or record_too_large
    return None


def canonical(value: bytes | str) -> Any:
    """The JSON value, numbers exact; nesting too deep for json.loads compares as text
    without whitespace (the deep examples hold no strings)."""
    try:
        return json.loads(value, parse_float=Decimal)
    except RecursionError:
        text = value.decode() if isinstance(value, bytes) else value
        return re.sub(r"\s", "", text)


async def insert(world: World, row: Row) -> tuple[str, str | None, str | None]:
    topic = world.topic("own") if row.topic == "own" else row.topic
    headers = None if row.headers is None else json.dumps(row.headers)
    record = await world.db.fetchrow(
        INSERT,
        row.aggregatetype,
        row.aggregateid,
        row.type,
        row.payload,
        *row.optional,
        row.traceparent,
        headers,
        topic,
    )
    return record[0], record[1], record[2]


async def read_back(world: World, topic: str, partition: int, offset: int) -> Any:
    where = TopicPartition(topic, partition)
    world.reader.assign([where])
    world.reader.seek(where, offset)
    async with asyncio.timeout(30):
        while True:
            batch = await world.reader.getmany(where, timeout_ms=500)
            for record in batch.get(where, []):
                if record.offset == offset:
                    return record


async def assert_published_intact(
    world: World,
    row: Row,
    event_id: str,
    stored_payload: str | None,
    stored_headers: str | None,
    receipt: asyncpg.Record,
) -> None:
    record = await read_back(
        world, receipt["topic"], receipt["kafka_partition"], receipt["kafka_offset"]
    )
    assert record.key == row.aggregateid.encode()
    if stored_payload is None:
        assert record.value is None
    else:
        assert record.value is not None
        assert canonical(record.value) == canonical(stored_payload)
        assert len(record.value) <= len(stored_payload.encode())
    headers = list(record.headers)
    names = [name for name, _ in headers]
    own = canonical(stored_headers) if stored_headers is not None else {}
    fixed = [
        ("id", event_id.encode()),
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode()),
        ("ce_source", CE_SOURCE.encode()),
        ("ce_type", row.type.encode()),
    ]
    assert headers[:5] == fixed
    assert names[5] == "ce_time"
    rest = headers[6:]
    if stored_payload is not None:
        assert rest.pop(0) == ("content-type", b"application/json")
    forwarded = None if void_traceparent(row.traceparent) else row.traceparent
    columns = [("traceparent", forwarded), *zip(_OPTIONAL, row.optional, strict=True)]
    for name, value in columns:
        if value is not None:
            assert rest.pop(0) == (name, value.encode())
    assert {name: value.decode() for name, value in rest} == own
    assert len(rest) == len(own)


@fuzz_settings(max_examples=40)
@given(batch=st.lists(rows(), min_size=1, max_size=4))
# Nested deeper than msgspec formats: was a RecursionError out of the relay's send path.
@example(batch=[PLAIN, Row("a", "k2", "t", deep(2000), (None,) * 4, None, None, None)])
@example(batch=[Row("b", "k", "t", None, ("", "é", None, "\n"), None, {"ü": "\U0001f600"}, None)])
@example(batch=[Row("a", "k", "t", None, (None,) * 4, None, {"": "v", "id": "x"}, None), PLAIN])
@example(
    batch=[Row("a", "k" * 20_000, "t", padded(MAX_RECORD_BYTES), (None,) * 4, None, None, None)]
)
@example(batch=[Row("a", "k", "t", str(10**40), (None,) * 4, None, None, "a/b"), PLAIN])
# Far over the record limit: quarantined as too large without being fetched whole.
@example(
    batch=[
        Row("a", "k", "t", padded(MAX_FETCHED_ROW_BYTES + 10_000), (None,) * 4, None, None, None),
        PLAIN,
    ]
)
# A key no B-tree entry can hold, whose row fails: its failure is still recorded.
@example(
    batch=[Row("a", INCOMPRESSIBLE_KEY, "t", None, (None,) * 4, None, {"ID": "x"}, None), PLAIN]
)
async def test_every_committed_row_is_published_intact_or_quarantined(
    world: World, batch: list[Row]
) -> None:
    inserted = []
    for row in batch:
        payload_bytes = len(row.payload.encode()) if row.payload is not None else 0
        event_id, stored_payload, stored_headers = await insert(world, row)
        inserted.append((row, event_id, stored_payload, stored_headers, payload_bytes))
    ids = [event_id for _, event_id, *_ in inserted]

    async def settled() -> bool:
        assert not world.relay.task.done(), "the relay stopped"
        return await world.db.fetchval(UNSETTLED, ids) == 0

    # A quarantined row holds back the later rows of its key (by design, until redrive):
    # record and remove the quarantined ones, and wait again for the rows they held.
    quarantined: dict[str, str] = {}
    while await world.db.fetchval(PENDING, ids):
        await wait_until(
            settled, timeout=60, what="every row of the example published or quarantined"
        )
        quarantined.update(dict(await world.db.fetch(QUARANTINED, ids)))
        await world.db.execute(FORGET_QUARANTINED)
    receipts = {r["id"]: r for r in await world.db.fetch(RECEIPTS, ids)}
    assert not world.relay.task.done(), "the relay stopped"
    for row, event_id, stored_payload, stored_headers, payload_bytes in inserted:
        expected = expected_cause(world, row, payload_bytes)
        if event_id in quarantined:
            assert event_id not in receipts
            cause = quarantined[event_id]
            event(f"quarantined: {cause}")
            assert cause, "quarantined without a cause"
            assert expected is not None, f"a publishable row was quarantined: {cause}"
            if expected != "unknown":
                assert cause == expected
            continue
        assert event_id in receipts, "a committed row is neither published nor quarantined"
        assert expected in (None, "unknown"), f"published, but should be {expected}"
        event("published")
        await assert_published_intact(
            world, row, event_id, stored_payload, stored_headers, receipts[event_id]
        )
