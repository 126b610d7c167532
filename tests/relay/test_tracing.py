"""The relay's publish spans and the writer's trace context (OpenTelemetry), against the
real PostgreSQL and broker, read with the SDK's in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import Iterator

import asyncpg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import relay.tracing
from relay.records import OutboxRow
from relay.tracing import PublishTracing, link_limit
from tests.support.kafka import read_topic
from tests.support.relay import fast_config, running_relay
from tests.support.waiting import wait_until

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, traceparent, tracestate)
VALUES ('order', $1, 'placed', $2::jsonb, $3, $4) RETURNING id
"""


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()  # the SDK's default limits: 128 links a span
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield provider, spans
    provider.shutdown()


def _traceparent(n: int) -> str:
    return f"00-{n + 1:032x}-{n + 1:016x}-01"


async def test_a_batch_is_published_under_a_producer_span_linked_to_each_row_s_context(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exporter
    traced = [
        await db.fetchval(INSERT, f"k{n}", json.dumps({"n": n}), _traceparent(n), None)
        for n in range(3)
    ]
    await db.fetchval(INSERT, "k-state", "{}", _traceparent(10), "vendor=opaque,other=x")
    await db.fetchval(INSERT, "k-none", "{}", None, None)
    await db.fetchval(  # one a receiver must ignore: neither linked nor forwarded
        INSERT, "k-void", "{}", "ff-" + _traceparent(11)[3:], None
    )
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config, tracer_provider=provider):
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
    topic = f"{topic_namespace}.order"
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("send")]
    assert span.name == f"send {topic}"
    assert span.kind is SpanKind.PRODUCER
    assert span.attributes is not None
    assert span.attributes["messaging.system"] == "kafka"
    assert span.attributes["messaging.operation.type"] == "send"
    assert span.attributes["messaging.destination.name"] == topic
    assert span.attributes["messaging.batch.message_count"] == 6
    assert span.status.is_ok
    linked = {(link.context.trace_id, link.context.span_id) for link in span.links}
    assert linked == {(n + 1, n + 1) for n in (0, 1, 2, 10)}
    with_state = [link for link in span.links if link.context.trace_id == 11]
    assert with_state[0].context.trace_state.to_header() == "vendor=opaque,other=x"
    assert all(link.context.is_remote for link in span.links)
    assert len(traced) == 3
    records = {r.key: dict(r.headers) for r in await read_topic(kafka_bootstrap, topic, count=6)}
    assert records[b"k-state"]["tracestate"] == b"vendor=opaque,other=x"
    assert records[b"k-state"]["traceparent"] == _traceparent(10).encode()
    assert "traceparent" not in records[b"k-void"]


async def test_a_batch_past_the_link_limit_links_every_row(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    exporter: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, spans = exporter
    count = link_limit() + 72  # 200 with the SDK's default limit
    await db.executemany(INSERT, [(f"k{n}", "{}", _traceparent(n), None) for n in range(count)])
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config, tracer_provider=provider):
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
    sent = [s for s in spans.get_finished_spans() if s.name.startswith("send")]
    linked = [(link.context.trace_id, link.context.span_id) for s in sent for link in s.links]
    assert sorted(linked) == [(n + 1, n + 1) for n in range(count)]  # each row, once
    assert all(len(s.links) <= link_limit() for s in sent)
    assert all(s.dropped_links == 0 for s in sent)
    # One batch here (a fetch takes them all): as many spans as the link limit needs.
    assert len(sent) == -(-count // link_limit())


def test_without_the_api_no_span_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay.tracing, "trace", None)
    tracing = PublishTracing(client_id="relay-test")
    assert not tracing.enabled
    row = OutboxRow(
        1, "id", "order", "k", "t", None, None, None, None, None, None, None, None, None, 0, 0
    )
    assert tracing.start([row], ["t"]).spans == []


def test_with_the_api_and_no_sdk_no_link_is_built() -> None:
    tracing = PublishTracing(client_id="relay-test", tracer_provider=trace.NoOpTracerProvider())
    row = OutboxRow(
        1,
        "id",
        "order",
        "k",
        "t",
        None,
        None,
        None,
        None,
        None,
        _traceparent(1),
        None,
        None,
        None,
        0,
        0,
    )
    assert tracing.start([row], ["t"]).spans == []
