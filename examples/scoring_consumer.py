"""An example consumer of the scoring outcome events (outbox.event.scoring_job) that applies
each event once, although the relay delivers at least once.

A record may come again (a relay restart, a lane's hand-over, this consumer's own crash
before it committed its offset), always with the same ``ce_source`` and ``id`` headers:
together they name the event (docs/asyncapi.yaml). The consumer records that pair in a
table of its own, in the same database transaction as the event's effect, and applies the
effect only when the pair is new; the Kafka offset is committed after the transaction. A
crash anywhere re-reads records whose effects either committed with their pair (skipped)
or did not (applied now). Here the effect counts outcomes per tenant, which a duplicate
applied twice would double.

    python -m examples.scoring_consumer --bootstrap kafka:9092 --database-url postgresql://…
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid

import asyncpg
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

TOPIC = "outbox.event.scoring_job"
SCHEMA = """
CREATE TABLE IF NOT EXISTS consumed_event (
    source      text NOT NULL,
    id          uuid NOT NULL,
    consumed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, id)
);
CREATE TABLE IF NOT EXISTS tenant_outcomes (
    tenant_ref text PRIMARY KEY,
    completed  bigint NOT NULL DEFAULT 0,
    failed     bigint NOT NULL DEFAULT 0
);
"""
FIRST_TIME = """
INSERT INTO consumed_event (source, id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING true
"""
COUNT = """
INSERT INTO tenant_outcomes AS t (tenant_ref, completed, failed) VALUES ($1, $2, $3)
ON CONFLICT (tenant_ref) DO UPDATE
SET completed = t.completed + excluded.completed, failed = t.failed + excluded.failed
"""


async def apply_once(conn: asyncpg.Connection, record: ConsumerRecord[bytes, bytes]) -> bool:
    """Apply one record's effect unless its event was applied before; True if applied."""
    if record.value is None:
        return False  # a tombstone: no event to apply (none on this topic)
    headers = {name: value.decode() for name, value in record.headers}
    event = json.loads(record.value)
    completed = event["data"]["outcome"] == "completed"
    async with conn.transaction():
        first = await conn.fetchval(FIRST_TIME, headers["ce_source"], uuid.UUID(headers["id"]))
        if not first:
            return False
        tenant = event["envelope"]["tenant_ref"]
        await conn.execute(COUNT, tenant, int(completed), int(not completed))
    return True


async def consume(
    bootstrap: str,
    database_url: str,
    *,
    topic: str = TOPIC,
    group: str = "scoring-consumer",
    idle_s: float | None = None,
) -> tuple[int, int]:
    """Consume ``topic`` until stopped (or idle for ``idle_s``); (applied, skipped)."""
    conn = await asyncpg.connect(database_url)
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,  # an offset is committed only after its effect
        auto_offset_reset="earliest",
    )
    applied = skipped = 0
    try:
        await conn.execute(SCHEMA)
        await consumer.start()
        while True:
            batches = await consumer.getmany(timeout_ms=int((idle_s or 1.0) * 1000))
            if not batches and idle_s is not None:
                return applied, skipped
            for partition, records in batches.items():
                for record in records:
                    if await apply_once(conn, record):
                        applied += 1
                    else:
                        skipped += 1
                    await consumer.commit({partition: record.offset + 1})
    finally:
        await consumer.stop()
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--topic", default=TOPIC)
    parser.add_argument("--group", default="scoring-consumer")
    args = parser.parse_args()
    asyncio.run(consume(args.bootstrap, args.database_url, topic=args.topic, group=args.group))


if __name__ == "__main__":
    main()
