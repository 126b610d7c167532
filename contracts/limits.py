"""What an outbox row may hold: the limits the database checks when a row is inserted.

Decided once, at the door (migrations 0009-0010): a row that can never become a Kafka record
is refused with an error its writer sees, and the relay's fetch reads the size the door
stored instead of measuring every row again. The relay and the scoring writer read the same
values; tests/relay/test_door.py holds the SQL to them.
"""

from __future__ import annotations

from typing import Final

MAX_RECORD_BYTES: Final = 1_048_576
"""The producer's default ``max.request.size``: a record above it can never be sent."""

MAX_PAYLOAD_TEXT_BYTES: Final = MAX_RECORD_BYTES * 3 // 2
"""The payload as jsonb prints it. jsonb text is at most 1.5 x the compact JSON the relay
sends (it prints ", " and ": " where compact JSON has "," and ":"), so a payload printed
longer than this can never fit a record; one in between gets the relay's exact check."""

MAX_HEADER_SET_BYTES: Final = 65_536
"""The row's own headers as jsonb prints them, plus ``tenant_ref``, ``schema_version``,
``correlation_ref`` and ``causation_ref`` (each becomes a record header)."""

MAX_AGGREGATEID_BYTES: Final = 1_024
"""The record's key."""

MAX_AGGREGATETYPE_BYTES: Final = 249
"""A topic name is at most 249 characters, and the default topic is built from it."""

MAX_TYPE_BYTES: Final = 1_024
"""The event type (``ce_type``)."""

MAX_TOPIC_BYTES: Final = 249
"""Kafka's limit on a topic name."""

MAX_NUMBER_DIGITS: Final = 1_000
"""Digits a payload's number may print before its decimal point, or zeros after it before
its first other digit. jsonb keeps ``1e131071`` in a few bytes and prints it as 131,072
digits; every IEEE double prints in fewer than 400. (Decimals the server set without
storing them count toward the payload's printed size, computed before it is printed.)"""

MAX_ROW_BYTES: Final = (
    36  # the event id as text
    + MAX_AGGREGATETYPE_BYTES
    + MAX_AGGREGATEID_BYTES
    + MAX_TYPE_BYTES
    + MAX_TOPIC_BYTES
    + MAX_PAYLOAD_TEXT_BYTES
    + MAX_HEADER_SET_BYTES
    + 55  # traceparent (the outbox's CHECK)
    + 512  # tracestate (the outbox's CHECK)
)
"""The most a row the door lets through can measure (``size_bytes``)."""

NEVER_A_RECORD: Final = 2_147_483_647
"""The size the door gives a row stored before it that can never be a record."""
