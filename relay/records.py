"""Outbox row → Kafka record: the mapping downstream consumers read. Pure.

README, "What consumers read", describes it for them.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

import msgspec

from contracts import limits
from relay.errors import RecordRejected

_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
TOPIC_PREFIX = re.compile(r"[A-Za-z0-9._-]{1,249}")
"""What may begin a topic name (a writer's route: migrations/grants.py, WriterRoutes)."""
# Headers the relay sets itself; a row's own headers may not replace them, in any case
# (consumers look header names up case-insensitively more often than not).
RESERVED_HEADERS = frozenset(
    {
        "id",
        "content-type",
        "traceparent",
        "tracestate",
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
    }
)
_OPTIONAL_COLUMN_HEADERS = ("tenant_ref", "schema_version", "correlation_ref", "causation_ref")
_RESERVED_NAMES = RESERVED_HEADERS | frozenset(_OPTIONAL_COLUMN_HEADERS)
# Compared as consumers compare them: after NFKC (fullwidth letters), case-folded (Python,
# Go: a long s is "s") and upper-cased (Java's equalsIgnoreCase: a dotless i is "I").
_RESERVED_FOLDED = frozenset(_RESERVED_NAMES) | frozenset(n.upper() for n in _RESERVED_NAMES)


def _reserved(name: str) -> bool:
    if name.isascii():
        return name.lower() in _RESERVED_NAMES
    normal = unicodedata.normalize("NFKC", name)
    return normal.casefold() in _RESERVED_FOLDED or normal.upper() in _RESERVED_FOLDED


_headers_decoder = msgspec.json.Decoder(dict[str, str])
_compact = msgspec.json.format
_SPECVERSION = ("ce_specversion", b"1.0")
_JSON_CONTENT = ("content-type", b"application/json")
_new_record = tuple.__new__
# Per-record framing in a v2 batch is at most ~21 bytes plus varints; be generous.
_RECORD_OVERHEAD = 64
# The producer's default max.request.size; a record above it can never be sent.
MAX_RECORD_BYTES = limits.MAX_RECORD_BYTES
# The largest row the fetch transfers whole, by the size of its text columns as stored
# (size_bytes, measured at the door: relay/sql.py, FETCH_READY). The door lets no row
# through above limits.MAX_ROW_BYTES; a row stored before it may be larger and still be
# a record (jsonb prints at most 1.5 bytes per byte of compact JSON, a header object at
# most 5 bytes per byte of header name and value). A larger row comes without its payload
# and headers and is quarantined as too large.
MAX_FETCHED_ROW_BYTES = 5 * MAX_RECORD_BYTES
# A W3C trace context a receiver must ignore: version ff, or an all-zero trace or parent id
# (the outbox's CHECK takes its shape only, and inserts that pass it keep passing).
_TRACEPARENT_VOID_VERSION = "ff"
_ZERO_TRACE_ID = "0" * 32
_ZERO_PARENT_ID = "0" * 16


class OutboxRow(NamedTuple):
    """One fetched outbox row; ``payload`` and ``headers`` are jsonb text as stored.

    A named tuple, not a dataclass: it is built once per event on the hot path, and
    building a tuple from the driver's record is several times cheaper.
    """

    seq: int
    id: str
    aggregatetype: str
    aggregateid: str
    type: str
    payload: str | None
    tenant_ref: str | None
    schema_version: str | None
    correlation_ref: str | None
    causation_ref: str | None
    traceparent: str | None
    headers: str | None
    topic: str | None
    # aware (UTC); None when outside the years 1-9999 that RFC 3339 can carry
    created_at: datetime | None
    lane: int
    attempts: int
    holds_key: bool = False
    """Fetched while waiting to be retried: the database held its key's later rows back."""
    size: int | None = 0
    """The bytes of its text columns as the fetch transfers them, measured at the door;
    over MAX_FETCHED_ROW_BYTES the fetch left its payload and headers out; None for a row
    stored before the door that is not measured yet (nothing of it but its key, type and
    routing came either)."""
    earlier: int | None = None
    """For a cursor fetch: the seq of the last pending row of its key on its topic at or
    below the fetch's start (relay/sql.py, FETCH_READY), if any."""
    tracestate: str | None = None
    """The W3C tracestate that goes with ``traceparent`` (migration 0008)."""
    duplicate: bool = False
    """Its id is that of an event already published with another key, aggregatetype or
    type (relay/sql.py, FETCH_READY): quarantined as duplicate_id, never sent."""


Hold = tuple[str, str]
"""What a failed row holds back until its failure is recorded and ends: the rows of its key
(second) on its topic (first) — the database's unit too (relay/sql.py, FETCH_READY)."""


class KafkaRecord(NamedTuple):
    """What is handed to the producer."""

    topic: str
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


class RecordMapper:
    """Maps rows to records for one topic template and CloudEvents source.

    Built once per relay: the source bytes and each validated topic are kept, because
    this runs for every event on the hot path.
    """

    def __init__(
        self,
        *,
        topic_template: str,
        ce_source: str,
        max_record_bytes: int = MAX_RECORD_BYTES,
        allowed_topics: re.Pattern[str] | None = None,
        on_void_traceparent: Callable[[], None] = lambda: None,
    ) -> None:
        self._template = topic_template
        self._allowed = allowed_topics
        self._on_void_traceparent = on_void_traceparent
        self._source_header = ("ce_source", ce_source.encode())
        self._max_record_bytes = max_record_bytes
        self._topics: dict[str, str] = {}  # validated names
        self._routed: dict[str, str] = {}  # aggregatetype → validated templated name
        self._held_on: dict[str, str] = {}  # aggregatetype → held_topic under the template
        # ce_time of the last second seen: its bounds and "YYYY-MM-DDTHH:MM:SS." (empty
        # until the first row)
        self._second_start = datetime.max.replace(tzinfo=UTC)
        self._second_last = datetime.min.replace(tzinfo=UTC)
        self._second_prefix = b""

    def _time_header(self, created_at: datetime | None) -> bytes:
        """``ce_time``: RFC 3339 in UTC with microseconds, byte for byte as PostgreSQL's
        ``to_char`` prints it.

        Consecutive rows fall in the same second nearly always, so the date and time of
        day are formatted once per second and only the microseconds per row.
        """
        if created_at is None:
            raise RecordRejected(
                "invalid_created_at", "created_at is outside the years 1-9999 of RFC 3339"
            )
        if not self._second_start <= created_at <= self._second_last:
            start = created_at.replace(microsecond=0)
            self._second_start, self._second_last = start, created_at.replace(microsecond=999_999)
            # isoformat, not strftime: it pads years below 1000 to four digits
            self._second_prefix = start.isoformat(timespec="seconds")[:19].encode() + b"."
        return self._second_prefix + b"%06dZ" % created_at.microsecond

    def _validated(self, wanted: str) -> str:
        topic = self._topics.get(wanted)
        if topic is None:
            if not valid_topic(wanted):
                raise RecordRejected("invalid_topic", "topic name is not a valid Kafka topic name")
            if self._allowed is not None and not self._allowed.fullmatch(wanted):
                raise RecordRejected("topic_not_allowed", "the topic is not in --allowed-topics")
            if len(self._topics) > 10_000:
                self._topics.clear()
                self._routed.clear()
            self._topics[wanted] = topic = wanted
        return topic

    def topic_for(self, row: OutboxRow) -> str:
        """The row's own topic, else the template with ``{aggregatetype}`` filled in."""
        if row.topic:
            return self._validated(row.topic)
        topic = self._routed.get(row.aggregatetype)
        if topic is None:
            topic = self._validated(self._template.replace("{aggregatetype}", row.aggregatetype))
            self._routed[row.aggregatetype] = topic
        return topic

    def hold_of(self, row: OutboxRow) -> Hold | None:
        """What the row holds back when it fails: its key on its topic; None when its topic
        can never be valid (it can go nowhere, and holds nothing else)."""
        if row.topic:
            topic = held_topic(row.topic, row.aggregatetype, self._template)
        elif (cached := self._held_on.get(row.aggregatetype)) is not None:
            topic = cached
        else:
            topic = held_topic(None, row.aggregatetype, self._template)
            if len(self._held_on) > 10_000:
                self._held_on.clear()
            self._held_on[row.aggregatetype] = topic
        return (topic, row.aggregateid) if topic else None

    def to_record(self, row: OutboxRow) -> KafkaRecord:
        """Map a row to its Kafka record or raise :class:`RecordRejected`."""
        if row.size is None or row.size > MAX_FETCHED_ROW_BYTES:
            raise RecordRejected("too_large", _too_large(row.size))
        if row.duplicate:
            raise RecordRejected(
                "duplicate_id", "an event with another key, aggregatetype or type has its id"
            )
        # The hot path of every event (mapping rows to records is the largest share of a
        # drain's own CPU, docs/benchmarks.md#the-drain): the row unpacked once, constant
        # headers prebuilt.
        (_, event_id_text, aggregatetype, aggregateid, event_type, payload, tenant_ref,
         schema_version, correlation_ref, causation_ref, traceparent, own_headers, row_topic,
         created_at) = row[:14]  # fmt: skip
        # The routed topic's cache hit inline; every other case is topic_for's.
        topic = (not row_topic and self._routed.get(aggregatetype)) or self.topic_for(row)
        event_id = event_id_text.encode()
        key = aggregateid.encode()
        headers: list[tuple[str, bytes]] = [
            ("id", event_id),
            _SPECVERSION,
            ("ce_id", event_id),
            self._source_header,
            ("ce_type", event_type.encode()),
            ("ce_time", self._time_header(created_at)),
        ]
        value: bytes | None = None
        if payload is not None:
            # jsonb prints ", " and ": "; consumers get compact JSON.
            try:
                value = _compact(payload.encode(), indent=-1)
            except RecursionError:
                # Nested deeper than the formatter goes (jsonb takes it): jsonb's own
                # text is the same JSON value, only not compact.
                value = payload.encode()
            headers.append(_JSON_CONTENT)
        if traceparent is not None:
            if _void_traceparent(traceparent):
                self._on_void_traceparent()  # forwarded, it would restart nothing but noise
            else:
                headers.append(("traceparent", traceparent.encode()))
                if row.tracestate is not None:
                    headers.append(("tracestate", row.tracestate.encode()))
        if tenant_ref is not None:
            headers.append(("tenant_ref", tenant_ref.encode()))
        if schema_version is not None:
            headers.append(("schema_version", schema_version.encode()))
        if correlation_ref is not None:
            headers.append(("correlation_ref", correlation_ref.encode()))
        if causation_ref is not None:
            headers.append(("causation_ref", causation_ref.encode()))
        if own_headers is not None:
            try:
                own = _headers_decoder.decode(own_headers)
            except msgspec.ValidationError as exc:
                raise RecordRejected(
                    "invalid_headers", "headers must map strings to strings"
                ) from exc
            for name, header_value in own.items():
                if not name or _reserved(name):
                    raise RecordRejected("invalid_headers", f"header {name!r} is reserved")
                headers.append((name, header_value.encode()))
        record = _new_record(KafkaRecord, (topic, key, value, headers))
        # Cheap bound first; the exact sum only near the limit.
        rough = len(key) + (len(value) if value is not None else 0) + len(own_headers or "") + 1024
        if (
            rough > self._max_record_bytes
            and (size := record_size(record)) > self._max_record_bytes
        ):
            raise RecordRejected(
                "too_large", f"the record is {size} bytes, over the producer's request size"
            )
        return record


def fetched_bytes(row: OutboxRow, *, in_flight: bool = False) -> int:
    """What the row cost its fetch's byte budget (relay/sql.py, FETCH_READY): its measured
    size when it came whole, else (too large, not measured, or ``in_flight``: named in the
    fetch's $8) its id, key, type and routing as they came."""
    size = row.size
    if not in_flight and size is not None and size <= MAX_FETCHED_ROW_BYTES:
        return size
    return (
        36
        + len(row.aggregatetype.encode())
        + len(row.aggregateid.encode())
        + len(row.type.encode())
        + len((row.topic or "").encode())
    )


def _too_large(size: int | None) -> str:
    if size is None:
        return "the row is not measured; it was not fetched"
    if size >= limits.NEVER_A_RECORD:
        return "the door found the row can never be a record; it was not fetched"
    return f"the row's text is {size} bytes; it was not fetched"


def valid_topic(name: str) -> bool:
    """True for a name Kafka takes as a topic's."""
    return _TOPIC.fullmatch(name) is not None and name not in (".", "..")


def held_topic(topic: str | None, aggregatetype: str, template: str) -> str:
    """Where a held row of this ``topic`` and ``aggregatetype`` holds its key back under
    ``template`` (relay/sql.py, FETCH_READY): the topic it goes to, else '' when that can
    never be a topic name (such a row holds nothing else)."""
    name = topic or template.replace("{aggregatetype}", aggregatetype)
    return name if valid_topic(name) else ""


def _void_traceparent(traceparent: str) -> bool:
    """True for a trace context the W3C spec says a receiver must ignore."""
    version, _, rest = traceparent.partition("-")
    trace_id, _, rest = rest.partition("-")
    parent_id = rest.partition("-")[0]
    return (
        version == _TRACEPARENT_VOID_VERSION
        or trace_id == _ZERO_TRACE_ID
        or parent_id == _ZERO_PARENT_ID
    )


def record_size(record: KafkaRecord) -> int:
    """An upper bound on the record's size on the wire."""
    size = len(record.key) + (len(record.value) if record.value is not None else 0)
    for name, value in record.headers:
        size += len(name) + len(value) + 10
    return size + _RECORD_OVERHEAD
