"""The consumer kit against the relay's real output: scoring outcomes written through the
writer API, published by a real relay to the real broker, are what docs/asyncapi.yaml and
docs/schemas say; examples/scoring_consumer.py, given one record twice on purpose (a copy
produced again, as a relay republishes after a crash) and then every record again (its
offsets lost), applies each event once, in its own database, deduplicating on
(ce_source, id)."""

from __future__ import annotations

import json
import uuid
from collections import Counter

import asyncpg
from aiokafka import AIOKafkaProducer

from examples.scoring_consumer import consume
from scoring.writer import EventDetails, complete_job, fail_job_permanently
from tests.support.consumer_kit import errors, headers_validator, outcome_validator
from tests.support.kafka import read_topic
from tests.support.relay import fast_config, running_relay
from tests.support.scoring_jobs import leased_job

JOBS = 6  # four completed, two failed, for two tenants


async def _write_outcomes(conn: asyncpg.Connection) -> dict[str, tuple[int, int]]:
    """Complete or fail JOBS leased jobs through the writer; tenant → (completed, failed)."""
    expected: Counter[tuple[str, str]] = Counter()
    for n in range(JOBS):
        job = await leased_job(conn, f"job-{n}")
        tenant = f"tenant-{n % 2}"
        event = EventDetails(
            source="urn:scoring-service",
            tenant_ref=tenant,
            correlation_ref=f"corr-{n}",
            schema_version="1",
        )
        if n < 4:
            await complete_job(
                conn,
                job_ref=job.job_ref,
                fencing_token=job.fencing_token,
                result_ref=f"result-{n}",
                payload={"score": n},
                event=event,
            )
            expected[(tenant, "completed")] += 1
        else:
            await fail_job_permanently(
                conn,
                job_ref=job.job_ref,
                fencing_token=job.fencing_token,
                cause_code="invalid_features",
                event=event,
            )
            expected[(tenant, "failed")] += 1
    return {
        tenant: (expected[(tenant, "completed")], expected[(tenant, "failed")])
        for tenant in ("tenant-0", "tenant-1")
    }


async def test_the_example_consumer_applies_each_published_event_once(
    db: asyncpg.Connection,
    database_url: str,
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    config = fast_config(database_url, kafka_bootstrap, topic_namespace)
    topic = f"{topic_namespace}.scoring_job"
    async with running_relay(config):
        expected = await _write_outcomes(db)
        published = await read_topic(kafka_bootstrap, topic, count=JOBS, timeout=60)
    assert len(published) == JOBS

    # What the relay wrote is what the consumer kit says.
    headers = headers_validator("scoringHeaders")
    payload = outcome_validator()
    for record in published:
        assert record.value is not None
        named = {name: value.decode() for name, value in record.headers}
        assert errors(headers, named) == []
        assert errors(payload, json.loads(record.value)) == []
        assert named["ce_source"] == config.ce_source
        assert uuid.UUID(named["id"]) == uuid.UUID(named["ce_id"])

    # A duplicate on purpose: one record produced again, key, value and headers as they were.
    again = published[2]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(
            topic,
            again.value,
            key=again.key,
            headers=list(again.headers),
            partition=again.partition,
        )
    finally:
        await producer.stop()

    group = f"consumer-{uuid.uuid4().hex[:8]}"
    applied, skipped = await consume(
        kafka_bootstrap, empty_database_url, topic=topic, group=group, idle_s=3.0
    )
    assert (applied, skipped) == (JOBS, 1)
    # Its offsets lost (a new group reads from the start): everything is delivered again,
    # nothing is applied again.
    applied, skipped = await consume(
        kafka_bootstrap, empty_database_url, topic=topic, group=f"{group}-again", idle_s=3.0
    )
    assert (applied, skipped) == (0, JOBS + 1)

    conn = await asyncpg.connect(empty_database_url)
    try:
        counts = {
            row["tenant_ref"]: (row["completed"], row["failed"])
            for row in await conn.fetch("SELECT * FROM tenant_outcomes")
        }
        consumed = await conn.fetchval("SELECT count(*) FROM consumed_event")
    finally:
        await conn.close()
    assert counts == expected
    assert consumed == JOBS
