"""Outbox row → Kafka record: the mapping downstream consumers read (DESIGN §4). Pure."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# Headers the relay sets itself; a row's own headers may not replace them.
RESERVED_HEADERS = frozenset(
    {
        "id",
        "content-type",
        "traceparent",
        "ce_specversion",
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_time",
    }
)
_OPTIONAL_COLUMN_HEADERS = ("tenant_ref", "schema_version", "correlation_ref", "causation_ref")
_headers_decoder = msgspec.json.Decoder(dict[str, str])


class RecordRejected(Exception):
    """The row cannot become a valid Kafka record; ``cause`` is a stable error class."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause = cause


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One fetched outbox row; ``payload`` and ``headers`` are jsonb text as stored."""

    seq: int
    id: uuid.UUID
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
    created_at: datetime
    lane: int
    attempts: int

    @classmethod
    def from_record(cls, record: Any) -> OutboxRow:
        return cls(*record)


@dataclass(frozen=True, slots=True)
class KafkaRecord:
    """What is handed to the producer."""

    topic: str
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


def topic_for(row: OutboxRow, template: str) -> str:
    """The row's own topic, else the template with ``{aggregatetype}`` filled in."""
    topic = row.topic or template.replace("{aggregatetype}", row.aggregatetype)
    if not _TOPIC.match(topic) or topic in (".", ".."):
        raise RecordRejected("invalid_topic", "topic name is not a valid Kafka topic name")
    return topic


def rfc3339(moment: datetime) -> str:
    """UTC timestamp with microseconds and a Z, as CloudEvents' ce_time expects."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_record(row: OutboxRow, *, topic_template: str, ce_source: str) -> KafkaRecord:
    """Map a row to its Kafka record or raise :class:`RecordRejected`."""
    topic = topic_for(row, topic_template)
    event_id = str(row.id).encode()
    headers: list[tuple[str, bytes]] = [
        ("id", event_id),
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id),
        ("ce_source", ce_source.encode()),
        ("ce_type", row.type.encode()),
        ("ce_time", rfc3339(row.created_at).encode()),
    ]
    value: bytes | None = None
    if row.payload is not None:
        # jsonb prints ", " and ": "; consumers get compact JSON.
        value = msgspec.json.format(row.payload.encode(), indent=-1)
        headers.append(("content-type", b"application/json"))
    if row.traceparent is not None:
        headers.append(("traceparent", row.traceparent.encode()))
    for column in _OPTIONAL_COLUMN_HEADERS:
        column_value = getattr(row, column)
        if column_value is not None:
            headers.append((column, column_value.encode()))
    if row.headers is not None:
        try:
            own = _headers_decoder.decode(row.headers)
        except msgspec.ValidationError as exc:
            raise RecordRejected("invalid_headers", "headers must map strings to strings") from exc
        for name, header_value in own.items():
            if name in RESERVED_HEADERS or name in _OPTIONAL_COLUMN_HEADERS or not name:
                raise RecordRejected("invalid_headers", f"header {name!r} is reserved")
            headers.append((name, header_value.encode()))
    return KafkaRecord(topic=topic, key=row.aggregateid.encode(), value=value, headers=headers)
