"""Delivery and the record format (README, "What consumers read"), against the real broker."""

from __future__ import annotations

import json
import uuid

import asyncpg

from tests.support.kafka import read_topic
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.waiting import wait_until


async def test_delivers_every_event_with_the_record_format(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    event_id = await db.fetchval(
        """
        INSERT INTO outbox (aggregatetype, aggregateid, type, payload, traceparent, headers,
                            tenant_ref, correlation_ref)
        VALUES ('scoring_job', 'job-7f3a', 'scoring.result.completed',
                '{"result_ref": "r-1", "score": 0.5}', $1, '{"x-origin": "test"}', 'tn-a', 'c-1')
        RETURNING id
        """,
        trace,
    )
    tombstone_id = await db.fetchval(
        INSERT + " RETURNING id", "scoring_job", "job-7f3a", "scoring.result.deleted", None
    )
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    async with running_relay(config):
        await wait_until(lambda: _empty(db), what="the outbox empty")
    topic = f"{topic_namespace}.scoring_job"
    records = await read_topic(kafka_bootstrap, topic, count=2)
    assert len(records) == 2
    first, tombstone = sorted(records, key=lambda r: r.offset)
    assert first.key == b"job-7f3a"
    # compact JSON, in jsonb's key order
    assert first.value == b'{"score":0.5,"result_ref":"r-1"}'
    assert json.loads(first.value) == {"result_ref": "r-1", "score": 0.5}
    headers = dict(first.headers)
    assert headers["id"] == str(event_id).encode()
    assert headers["ce_id"] == str(event_id).encode()
    assert headers["ce_specversion"] == b"1.0"
    assert headers["ce_type"] == b"scoring.result.completed"
    assert headers["ce_source"] == b"urn:outbox-relay"
    assert headers["content-type"] == b"application/json"
    assert headers["traceparent"] == trace.encode()
    assert headers["x-origin"] == b"test"
    assert headers["tenant_ref"] == b"tn-a"
    assert headers["correlation_ref"] == b"c-1"
    # RFC 3339 in UTC with microseconds, the time the row was written
    written = await db.fetchval(
        """SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
        FROM outbox_receipt WHERE id = $1""",
        event_id,
    )
    assert headers["ce_time"] == written.encode()
    assert tombstone.key == b"job-7f3a"
    assert tombstone.value is None
    assert "content-type" not in dict(tombstone.headers)
    assert dict(tombstone.headers)["id"] == str(tombstone_id).encode()
    # One receipt per event, nothing else, each where its record was read.
    receipts = await db.fetch("SELECT id, topic, kafka_partition, kafka_offset FROM outbox_receipt")
    assert {r["id"]: (r["topic"], r["kafka_partition"], r["kafka_offset"]) for r in receipts} == {
        event_id: (topic, first.partition, first.offset),
        tombstone_id: (topic, tombstone.partition, tombstone.offset),
    }


async def _empty(db: asyncpg.Connection) -> bool:
    return await db.fetchval("SELECT count(*) FROM outbox") == 0


async def test_row_topic_overrides_the_template(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    own_topic = f"{topic_namespace}.own-{uuid.uuid4().hex[:6]}"
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, topic) "
        "VALUES ('a', 'k1', 't', '{}', $1)",
        own_topic,
    )
    async with running_relay(fast_config(database_url, kafka_bootstrap, topic_namespace)):
        await wait_until(lambda: _empty(db), what="the outbox empty")
    records = await read_topic(kafka_bootstrap, own_topic, count=1)
    assert [r.key for r in records] == [b"k1"]
