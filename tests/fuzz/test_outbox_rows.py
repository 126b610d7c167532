"""Fuzzing what writers put in the outbox: odd payloads, headers, keys, topics and sizes.

Rows are inserted by plain SQL into the real PostgreSQL while one relay runs against the
real broker. The door (migration 0009) refuses exactly the rows over its limits, naming the
column; each committed row must end up either on Kafka, intact (key, value and headers read
back byte for byte from where its receipt says it landed), or quarantined with a cause; a
row the relay could publish must not be quarantined; the relay keeps running throughout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import unicodedata
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import asyncpg
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from hypothesis import event, example, given
from hypothesis import strategies as st

from contracts import limits
from relay.records import MAX_RECORD_BYTES, RESERVED_HEADERS
from tests.fuzz.profiles import fuzz_settings
from tests.support.kafka import create_topics, kafka_admin
from tests.support.relay import RunningRelay, fast_config, running_relay
from tests.support.waiting import wait_until

CE_SOURCE = "urn:fuzz"
TYPES = ("a", "b")  # the aggregate types routed by the template, to pre-created topics
PARTITIONS = 2
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")
_OPTIONAL = ("tenant_ref", "schema_version", "correlation_ref", "causation_ref")
# Only the relay's own bound is predicted; a record just under it still fits the broker.
_COMFORTABLY_SMALL = MAX_RECORD_BYTES - 64 * 1024

# The key's tail is built by the server ($12 more 'k's): a writer can send a few bytes for
# a key of megabytes.
INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, tenant_ref, schema_version,
                    correlation_ref, causation_ref, traceparent, headers, topic)
VALUES ($1, $2 || repeat('k', $12), $3, $4::jsonb, $5, $6, $7, $8, $9, $10::jsonb, $11)
RETURNING id::text, payload::text, headers::text
"""
# How long jsonb prints a payload whose numbers print short (the door measures the same).
PRINTED = "SELECT octet_length($1::jsonb::text)"
# Rows of the example still in the outbox.
PENDING = "SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])"
# A row is settled once it left the outbox (published), was quarantined, or waits behind
# an earlier quarantined row of its key that holds it (on its topic, or on every topic:
# relay/sql.py, FETCH_READY).
UNSETTLED = """
SELECT count(*) FROM outbox o
WHERE o.id = ANY($1::uuid[]) AND o.quarantined_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM outbox h
      WHERE h.aggregateid = o.aggregateid AND h.seq < o.seq AND h.quarantined_at IS NOT NULL
        AND h.held_topic IN (coalesce(o.topic, replace($2, '{aggregatetype}', o.aggregatetype)),
                             '*')
  )
"""
RECEIPTS = """
SELECT id::text, topic, kafka_partition, kafka_offset FROM outbox_receipt
WHERE id = ANY($1::uuid[])
"""
# Quarantined rows would hold their keys back in later examples: the test removes them,
# each read as it goes (one statement: none is quarantined between the two).
FORGET_QUARANTINED = """
DELETE FROM outbox WHERE quarantined_at IS NOT NULL RETURNING id::text, last_error_class
"""


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
    key_built: int = 0  # 'k's the server appends to the key

    @property
    def key(self) -> str:
        return self.aggregateid + "k" * self.key_built


@dataclass
class World:
    namespace: str
    db: asyncpg.Connection
    relay: RunningRelay
    reader: AIOKafkaConsumer

    def topic(self, aggregatetype: str) -> str:
        return f"{self.namespace}.{aggregatetype}"


@pytest_asyncio.fixture
async def world(database_url: str, kafka_bootstrap: str) -> AsyncIterator[World]:
    namespace = f"fz{uuid.uuid4().hex[:10]}"
    topics = [f"{namespace}.{name}" for name in (*TYPES, "own")]
    await create_topics(kafka_bootstrap, topics, partitions=PARTITIONS)
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
# Around the record limit and the door's limit on the printed payload.
big_payloads = st.one_of(
    st.integers(0, MAX_RECORD_BYTES + 100_000),
    st.integers(limits.MAX_PAYLOAD_TEXT_BYTES - 200, limits.MAX_PAYLOAD_TEXT_BYTES + 200),
).map(lambda n: padded(n))
# Numbers jsonb stores in a few bytes and prints long: over the door's limit or just under.
huge_numbers = st.lists(
    st.sampled_from(
        ["1e131071", "-1e131071", "1e1000", "9e999", "1e-1001", "-1e-1000", "1e-16383", "0e-16383"]
    ),
    min_size=1,
    max_size=50,
).map(lambda numbers: "[" + ", ".join(numbers) + "]")
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


# Header values near and over the door's limit on the header set.
header_values = st.one_of(
    text,
    st.integers(limits.MAX_HEADER_SET_BYTES - 200, limits.MAX_HEADER_SET_BYTES + 200).map(
        lambda n: "v" * n
    ),
)


def long_keys() -> st.SearchStrategy[str]:
    """Long keys, compressible and not: around the door's 1,024 bytes, random hex (pglz
    cannot shrink it) and multibyte characters."""
    return st.one_of(
        st.integers(1, 2_000).map(lambda n: "k" * n),
        st.binary(min_size=500, max_size=600).map(bytes.hex),
        st.integers(500, 520).map(lambda n: "é" * n),
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
        payload=draw(st.one_of(json_values.map(json.dumps), st.none(), big_payloads, huge_numbers)),
        optional=tuple(draw(st.one_of(st.none(), text)) for _ in _OPTIONAL),
        traceparent=draw(traceparents),
        headers=draw(
            st.one_of(st.none(), st.dictionaries(header_names, header_values, max_size=4))
        ),
        topic=topic,
        key_built=draw(st.sampled_from([0, 0, 0, 0, 0, 0, 1_000, 5_242_000])),
    )


@st.composite
def held_topics(draw: st.DrawFn) -> list[Row]:
    """Rows of one key over many topics, most of which fail (an own topic that is no name,
    one the broker does not have) and each holds the key on its own topic at most; then
    the key on the routed topic, which nothing of them holds."""
    key = draw(nonempty)
    count = draw(st.integers(2, 60))
    odd = [draw(st.sampled_from(["x y", "a/b", ".", "own"])) + str(n) for n in range(count)]
    return [
        *(Row("a", key, "t", None, (None,) * 4, None, None, topic) for topic in odd),
        Row("a", key, "t", '{"last": true}', (None,) * 4, None, None, None),
    ]


def padded(size: int) -> str:
    return json.dumps({"pad": "x" * size})


def deep(depth: int) -> str:
    """JSON nested deeper than a recursive formatter's stack (jsonb takes it)."""
    return "[" * depth + "]" * depth


PLAIN = Row("a", "k", "t", '{"x": 1}', (None,) * 4, None, None, None)
# 1,024 characters of pseudo-random hex: the longest key the door takes, which pglz cannot
# shrink.
INCOMPRESSIBLE_KEY = "".join(hashlib.sha256(str(n).encode()).hexdigest() for n in range(16))


# -- what must happen ----------------------------------------------------------------------
def _numbers(value: Any) -> list[Decimal]:
    if isinstance(value, Decimal):
        return [value]
    if isinstance(value, list):
        return [n for item in value for n in _numbers(item)]
    if isinstance(value, dict):
        return [n for item in value.values() for n in _numbers(item)]
    return []


def _prints_huge(number: Decimal) -> bool:
    """More than 1,000 digits before its decimal point, or 1,000 zeros after it."""
    digits = limits.MAX_NUMBER_DIGITS
    return abs(number) >= Decimal(f"1e{digits}") or 0 < abs(number) < Decimal(f"1e-{digits}")


async def refused_column(world: World, row: Row) -> str | None:
    """The column the door must name when it refuses the row (None: it takes it)."""
    if len(row.key.encode()) > limits.MAX_AGGREGATEID_BYTES:
        return "aggregateid"
    if len(row.aggregatetype.encode()) > limits.MAX_AGGREGATETYPE_BYTES:
        return "aggregatetype"
    if len(row.type.encode()) > limits.MAX_TYPE_BYTES:
        return "type"
    if row.topic is not None and len(row.topic.encode()) > limits.MAX_TOPIC_BYTES:
        return "topic"
    header_set = sum(len((value or "").encode()) for value in row.optional)
    if row.headers is not None:
        # as jsonb prints an object of strings (the order of its keys is not its length)
        printed = json.dumps(row.headers, ensure_ascii=False, separators=(", ", ": "))
        header_set += len(printed.encode())
    if header_set > limits.MAX_HEADER_SET_BYTES:
        return "headers"
    if row.payload is not None:
        if any(map(_prints_huge, _numbers(canonical(row.payload)))):
            return "payload"
        if await world.db.fetchval(PRINTED, row.payload) > limits.MAX_PAYLOAD_TEXT_BYTES:
            return "payload"
    return None


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
    reserved |= {name.upper() for name in reserved}

    def looks_reserved(name: str) -> bool:  # as a case-insensitive consumer reads it
        normal = unicodedata.normalize("NFKC", name)
        return normal.casefold() in reserved or normal.upper() in reserved

    if row.headers and any(looks_reserved(n) or not n for n in row.headers):
        return "invalid_headers"
    if len(row.key.encode()) + payload_bytes + 4096 > _COMFORTABLY_SMALL:
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


async def insert(world: World, row: Row) -> tuple[str, str | None, str | None] | str | None:
    """The row's id and what it stored, or the column the door named when it refused it."""
    topic = world.topic("own") if row.topic == "own" else row.topic
    headers = None if row.headers is None else json.dumps(row.headers)
    try:
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
            row.key_built,
        )
    except asyncpg.ProgramLimitExceededError as refused:
        return refused.column_name
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
    assert record.key == row.key.encode()
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
@given(batch=st.one_of(st.lists(rows(), min_size=1, max_size=4), held_topics()))
# Nested deeper than msgspec formats: was a RecursionError out of the relay's send path.
@example(batch=[PLAIN, Row("a", "k2", "t", deep(2000), (None,) * 4, None, None, None)])
@example(batch=[Row("b", "k", "t", None, ("", "é", None, "\n"), None, {"ü": "\U0001f600"}, None)])
@example(batch=[Row("a", "k", "t", None, (None,) * 4, None, {"": "v", "id": "x"}, None), PLAIN])
@example(
    batch=[Row("a", "k" * 1_024, "t", padded(MAX_RECORD_BYTES), (None,) * 4, None, None, None)]
)
@example(batch=[Row("a", "k", "t", str(10**40), (None,) * 4, None, None, "a/b"), PLAIN])
# Over the door's limit: refused, naming the payload.
@example(
    batch=[
        Row("a", "k", "t", padded(limits.MAX_PAYLOAD_TEXT_BYTES), (None,) * 4, None, None, None),
        PLAIN,
    ]
)
# About 2 kB stored, more than 1 GiB printed: refused without being printed.
@example(
    batch=[
        Row(
            "a",
            "k",
            "t",
            "[" + ", ".join(["1e131071"] * 8_200) + "]",
            (None,) * 4,
            None,
            None,
            None,
        ),
        PLAIN,
    ]
)
# A key the server builds to megabytes from a few bytes: refused.
@example(batch=[Row("a", "g", "t", None, (None,) * 4, None, None, None, 5_242_000), PLAIN])
# A key at the door's limit that does not compress, whose row fails: recorded.
@example(
    batch=[Row("a", INCOMPRESSIBLE_KEY, "t", None, (None,) * 4, None, {"ID": "x"}, None), PLAIN]
)
async def test_every_committed_row_is_published_intact_or_quarantined(
    world: World, batch: list[Row]
) -> None:
    inserted = []
    for row in batch:
        payload_bytes = len(row.payload.encode()) if row.payload is not None else 0
        refused = await refused_column(world, row)
        stored = await insert(world, row)
        if not isinstance(stored, tuple):
            event(f"refused: {stored}")
            assert stored == refused, "the door refused another column than its limits say"
            continue
        assert refused is None, f"the door took a row over its limit on {refused}"
        event_id, stored_payload, stored_headers = stored
        inserted.append((row, event_id, stored_payload, stored_headers, payload_bytes))
    ids = [event_id for _, event_id, *_ in inserted]

    async def settled() -> bool:
        assert not world.relay.task.done(), "the relay stopped"
        return await world.db.fetchval(UNSETTLED, ids, world.topic("{aggregatetype}")) == 0

    # A quarantined row holds back the later rows of its key (by design, until redrive):
    # record and remove the quarantined ones, and wait again for the rows they held.
    quarantined: dict[str, str] = {}
    while await world.db.fetchval(PENDING, ids):
        await wait_until(
            settled, timeout=60, what="every row of the example published or quarantined"
        )
        forgotten = dict(await world.db.fetch(FORGET_QUARANTINED))
        quarantined.update({key: cause for key, cause in forgotten.items() if key in ids})
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
