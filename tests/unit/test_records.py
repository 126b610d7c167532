"""Outbox row → Kafka record (README, "What consumers read"), without any service."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from relay.errors import RecordRejected
from relay.records import (
    MAX_FETCHED_ROW_BYTES,
    MAX_RECORD_BYTES,
    RESERVED_HEADERS,
    KafkaRecord,
    OutboxRow,
    RecordMapper,
    record_size,
)
from tests.support.rows import EVENT_ID, make_row

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def mapper(**kwargs: Any) -> RecordMapper:
    options: dict[str, Any] = {
        "topic_template": "outbox.event.{aggregatetype}",
        "ce_source": "urn:test",
    }
    options.update(kwargs)
    return RecordMapper(**options)


def headers_of(record: KafkaRecord) -> dict[str, bytes]:
    names = [name for name, _ in record.headers]
    assert len(names) == len(set(names)), f"duplicate header in {names}"
    return dict(record.headers)


# -- topic ------------------------------------------------------------------------------------
def test_default_topic_follows_debezium_routing() -> None:
    assert mapper().to_record(make_row()).topic == "outbox.event.scoring_job"


def test_topic_template_is_filled_with_the_aggregatetype() -> None:
    m = mapper(topic_template="prod.{aggregatetype}.v1")
    assert m.to_record(make_row(aggregatetype="order")).topic == "prod.order.v1"
    assert m.to_record(make_row(aggregatetype="invoice")).topic == "prod.invoice.v1"


def test_a_template_without_a_field_is_one_topic_for_all() -> None:
    m = mapper(topic_template="all-events")
    assert m.to_record(make_row(aggregatetype="a")).topic == "all-events"
    assert m.to_record(make_row(aggregatetype="b")).topic == "all-events"


def test_the_rows_topic_overrides_the_template() -> None:
    record = mapper().to_record(make_row(topic="custom.topic-1_x"))
    assert record.topic == "custom.topic-1_x"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("topic", "has space", id="space"),
        pytest.param("topic", "bang!", id="bang"),
        pytest.param("topic", "t" * 250, id="250-chars"),
        pytest.param("topic", ".", id="dot"),
        pytest.param("topic", "..", id="dotdot"),
        pytest.param("topic", "a/b", id="slash"),
        pytest.param("topic", "tópico", id="non-ascii"),
        pytest.param("aggregatetype", "scoring job", id="template-yields-space"),
        pytest.param("aggregatetype", "x" * 240, id="template-yields-too-long"),
    ],
)
def test_invalid_topic_names_are_rejected(field: str, value: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(**{field: value}))
    assert caught.value.cause == "invalid_topic"


def test_longest_valid_topic_name_is_accepted() -> None:
    assert mapper().to_record(make_row(topic="t" * 249)).topic == "t" * 249


def test_a_rejected_topic_is_not_remembered_as_valid() -> None:
    m = mapper()
    for _ in range(2):
        with pytest.raises(RecordRejected):
            m.to_record(make_row(topic="bad topic"))


# -- key and value ----------------------------------------------------------------------------
def test_key_is_the_aggregateid_in_utf8() -> None:
    assert mapper().to_record(make_row(aggregateid="job-7f3a")).key == b"job-7f3a"
    assert mapper().to_record(make_row(aggregateid="clé-ü")).key == "clé-ü".encode()


def test_value_is_compact_json_from_jsonb_text() -> None:
    payload = '{"a": 1, "b": [1, 2, {"c": null}], "d": {"e": "f g", "h": true}}'
    value = mapper().to_record(make_row(payload=payload)).value
    assert value == b'{"a":1,"b":[1,2,{"c":null}],"d":{"e":"f g","h":true}}'
    assert json.loads(value) == json.loads(payload)


def test_value_preserves_unicode_and_string_contents() -> None:
    payload = '{"name": "Zoë 日本 🚀", "text": "a, b: c", "esc": "q\\"uote\\n"}'
    value = mapper().to_record(make_row(payload=payload)).value
    assert value is not None
    assert "Zoë 日本 🚀".encode() in value
    assert b'"a, b: c"' in value  # separators inside strings are data, not layout
    assert json.loads(value) == {"name": "Zoë 日本 🚀", "text": "a, b: c", "esc": 'q"uote\n'}


def test_a_payload_nested_deeper_than_the_formatter_is_published_as_jsonb_wrote_it() -> None:
    # jsonb takes 2000 levels; the formatter's recursion limit raised out of the relay.
    payload = "[" * 2000 + "]" * 2000
    assert mapper().to_record(make_row(payload=payload)).value == payload.encode()


def test_scalar_payloads_are_valid_json_values() -> None:
    for payload, expected in (('"text"', b'"text"'), ("42", b"42"), ("[]", b"[]"), ("{}", b"{}")):
        assert mapper().to_record(make_row(payload=payload)).value == expected


def test_null_payload_is_a_tombstone_without_content_type() -> None:
    record = mapper().to_record(make_row(payload=None))
    assert record.value is None
    assert record.key == b"job-7f3a"
    headers = headers_of(record)
    assert "content-type" not in headers
    assert headers["id"] == EVENT_ID.encode()


# -- headers ----------------------------------------------------------------------------------
def test_standard_headers() -> None:
    headers = headers_of(mapper(ce_source="urn:scoring").to_record(make_row()))
    assert headers == {
        "id": EVENT_ID.encode(),
        "ce_specversion": b"1.0",
        "ce_id": EVENT_ID.encode(),
        "ce_source": b"urn:scoring",
        "ce_type": b"scoring.result.completed",
        "ce_time": b"2026-01-02T03:04:05.678901Z",
        "content-type": b"application/json",
    }


def test_optional_columns_become_headers() -> None:
    row = make_row(
        traceparent=TRACEPARENT,
        tenant_ref="tenant-1",
        schema_version="2",
        correlation_ref="corr-1",
        causation_ref="cause-1",
    )
    headers = headers_of(mapper().to_record(row))
    assert headers["traceparent"] == TRACEPARENT.encode()
    assert headers["tenant_ref"] == b"tenant-1"
    assert headers["schema_version"] == b"2"
    assert headers["correlation_ref"] == b"corr-1"
    assert headers["causation_ref"] == b"cause-1"


def test_absent_optional_columns_add_no_headers() -> None:
    headers = headers_of(mapper().to_record(make_row()))
    for name in ("traceparent", "tenant_ref", "schema_version", "correlation_ref"):
        assert name not in headers


def test_the_rows_own_headers_are_appended_in_order() -> None:
    record = mapper().to_record(make_row(headers='{"x-b": "2", "x-a": "ü", "empty": ""}'))
    assert record.headers[-3:] == [("x-b", b"2"), ("x-a", "ü".encode()), ("empty", b"")]
    assert headers_of(record)["id"] == EVENT_ID.encode()


@pytest.mark.parametrize(
    "name",
    sorted(RESERVED_HEADERS | {"tenant_ref", "schema_version", "correlation_ref", "causation_ref"}),
)
def test_reserved_headers_cannot_be_overridden(name: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(headers=json.dumps({name: "forged"})))
    assert caught.value.cause == "invalid_headers"


@pytest.mark.parametrize("name", ["ID", "Ce_Id", "CONTENT-TYPE", "TraceParent", "Tenant_Ref"])
def test_reserved_header_names_are_refused_in_any_case(name: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(headers=json.dumps({name: "forged"})))
    assert caught.value.cause == "invalid_headers"


@pytest.mark.parametrize(
    "name",
    [
        "\u0131d",  # dotless i: Java's equalsIgnoreCase takes it for "id"
        "ce_\u0131d",
        "ce_t\u0131me",
        "ce_\u017fource",  # long s: Python's casefold and Java's toUpperCase take it for "s"
        "ce_\u017fpecver\u017fion",
        "\uff49\uff44",  # fullwidth "id": the same name after NFKC
        "CE_\uff34\uff39\uff30\uff25",  # fullwidth "TYPE"
    ],
)
def test_look_alikes_of_reserved_header_names_are_refused(name: str) -> None:
    """A consumer that looks header names up case-insensitively (Java, Go) must not read a
    writer's header as one the relay sets."""
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(headers=json.dumps({name: "forged"})))
    assert caught.value.cause == "invalid_headers"


def test_other_cloudevents_extension_headers_stay_allowed() -> None:
    record = mapper().to_record(make_row(headers='{"ce_partitionkey": "p", "Ce_Dataref": "d"}'))
    assert headers_of(record)["ce_partitionkey"] == b"p"


@pytest.mark.parametrize(
    "traceparent",
    [
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    ],
)
def test_a_traceparent_a_receiver_must_ignore_is_not_forwarded_and_is_counted(
    traceparent: str,
) -> None:
    dropped: list[None] = []
    m = mapper(on_void_traceparent=lambda: dropped.append(None))
    record = m.to_record(make_row(traceparent=traceparent))
    assert "traceparent" not in headers_of(record)
    assert len(dropped) == 1


def test_a_valid_traceparent_is_forwarded_unchanged() -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    record = mapper().to_record(make_row(traceparent=traceparent))
    assert headers_of(record)["traceparent"] == traceparent.encode()


def test_a_row_too_large_to_be_fetched_whole_is_too_large_with_its_size() -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(payload=None, size=MAX_FETCHED_ROW_BYTES + 1))
    assert caught.value.cause == "too_large"
    assert str(MAX_FETCHED_ROW_BYTES + 1) in str(caught.value)


@pytest.mark.parametrize("topic", ["other.orders", "outbox.events", "outbox.event.Orders"])
def test_a_topic_outside_the_allowed_pattern_is_refused(topic: str) -> None:
    m = mapper(allowed_topics=re.compile(r"outbox\.event\.[a-z_]+"))
    with pytest.raises(RecordRejected) as caught:
        m.to_record(make_row(topic=topic))
    assert caught.value.cause == "topic_not_allowed"


def test_a_topic_the_pattern_allows_is_published_to() -> None:
    m = mapper(allowed_topics=re.compile(r"outbox\.event\.[a-z_]+"))
    assert m.to_record(make_row(aggregatetype="orders")).topic == "outbox.event.orders"


def test_a_topic_name_with_a_trailing_newline_is_invalid() -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(topic="orders\n"))
    assert caught.value.cause == "invalid_topic"


def test_an_empty_header_name_is_rejected() -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(headers='{"": "x"}'))
    assert caught.value.cause == "invalid_headers"


@pytest.mark.parametrize(
    "headers",
    ['{"x-n": 1}', '{"x-n": null}', '{"x-n": ["a"]}', '{"x-n": {"a": "b"}}', '["a"]', '"a"'],
)
def test_non_string_header_values_are_rejected(headers: str) -> None:
    with pytest.raises(RecordRejected) as caught:
        mapper().to_record(make_row(headers=headers))
    assert caught.value.cause == "invalid_headers"


def test_record_rejected_carries_a_stable_cause() -> None:
    error = RecordRejected("invalid_topic", "detail")
    assert error.cause == "invalid_topic"
    assert str(error) == "invalid_topic: detail"


# -- size -------------------------------------------------------------------------------------
def test_oversized_payload_is_rejected() -> None:
    m = mapper(max_record_bytes=2_000)
    big = json.dumps({"blob": "x" * 3_000})
    with pytest.raises(RecordRejected) as caught:
        m.to_record(make_row(payload=big))
    assert caught.value.cause == "too_large"


def test_oversized_headers_are_rejected() -> None:
    m = mapper(max_record_bytes=2_000)
    with pytest.raises(RecordRejected) as caught:
        m.to_record(make_row(payload=None, headers=json.dumps({"x-big": "y" * 3_000})))
    assert caught.value.cause == "too_large"


def test_a_record_just_under_the_limit_passes_and_its_size_is_bounded() -> None:
    m = mapper(max_record_bytes=2_000)
    record = m.to_record(make_row(payload=json.dumps({"blob": "x" * 1_000})))
    size = record_size(record)
    assert size <= 2_000
    # The bound covers key, value and every header.
    assert size >= len(record.key) + len(record.value or b"") + sum(
        len(n) + len(v) for n, v in record.headers
    )


def test_default_limit_is_the_producers_request_size() -> None:
    assert MAX_RECORD_BYTES == 1_048_576
    payload = json.dumps({"blob": "x" * (MAX_RECORD_BYTES + 1)})
    with pytest.raises(RecordRejected, match="too_large"):
        mapper().to_record(make_row(payload=payload))


def test_a_row_is_built_from_the_fetch_s_columns_in_field_order() -> None:
    row = make_row()
    values = tuple(getattr(row, name) for name in OutboxRow._fields)
    assert OutboxRow._make(values) == row
    assert OutboxRow._make(values).aggregateid == row.aggregateid


# -- ce_time ----------------------------------------------------------------------------------
def _ce_time(m: RecordMapper, created_at: datetime) -> bytes:
    return headers_of(m.to_record(make_row(created_at=created_at)))["ce_time"]


def test_ce_time_is_rfc_3339_in_utc_with_microseconds_in_every_year() -> None:
    m = mapper()
    for when, printed in [
        (datetime(2026, 1, 2, 3, 4, 5, 0, tzinfo=UTC), b"2026-01-02T03:04:05.000000Z"),
        (datetime(1, 1, 1, tzinfo=UTC), b"0001-01-01T00:00:00.000000Z"),
        (datetime(999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), b"0999-12-31T23:59:59.999999Z"),
        (datetime.max.replace(tzinfo=UTC), b"9999-12-31T23:59:59.999999Z"),
    ]:
        assert _ce_time(m, when) == printed
        assert _ce_time(mapper(), when) == printed  # the same on a first row


def test_ce_time_follows_rows_across_seconds_in_any_order() -> None:
    m = mapper()
    base = datetime(2026, 6, 30, 23, 59, 59, 999_998, tzinfo=UTC)
    steps = [0, 1, 2, 3, -1, 1_000_000, -2, 86_400_000_000, 2]
    for step in steps:
        when = base + timedelta(microseconds=step)
        expected = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ").encode()
        assert _ce_time(m, when) == expected, when


def test_a_created_at_outside_rfc_3339_years_is_rejected() -> None:
    # FETCH_READY returns NULL for a time outside the years 1-9999 (infinity too).
    with pytest.raises(RecordRejected) as rejected:
        mapper().to_record(make_row(created_at=None))
    assert rejected.value.cause == "invalid_created_at"
