"""New code on an old schema: a relay below the migration level it needs is not ready, claims no lane, fetches nothing, says once what is missing, and starts by
itself once the schema is there (DESIGN §10b).

The schema is made older by migrating a fresh database only up to the migration before the
relay's level; the relay is ``outbox-relay run --relay-only`` as deploy/ runs it. Its
privileges: tests/security/test_schema_privileges.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg
import pytest

from migrations.runner import apply, load_migrations
from relay import schema
from tests.support.kafka import read_topic
from tests.support.processes import FAST_RELAY
from tests.support.relay import INSERT
from tests.support.running import Running, running
from tests.support.waiting import wait_until

WAITING = "the relay waits for its schema: it claims no lane until then"
READY = "schema ready; the relay starts"
# Never a fetch of the outbox under the relay's sessions while it waits.
_FETCHES = """
SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query ILIKE '%FROM outbox o%'
"""
_OWNED_LANES = "SELECT count(*) FROM relay_lane WHERE owner_id IS NOT NULL"


async def _migrate_below(url: str, level: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await apply(conn, [m for m in load_migrations() if m.version < level])
    finally:
        await conn.close()


@pytest.mark.timeout(120)
async def test_a_relay_on_an_older_schema_waits_unready_and_starts_once_migrated(
    empty_database_url: str, kafka_bootstrap: str, topic_namespace: str, tmp_path: Path
) -> None:
    await _migrate_below(empty_database_url, schema.MIGRATION)
    admin = await asyncpg.connect(empty_database_url)
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    await admin.execute("SELECT pg_stat_statements_reset()")
    await admin.execute(INSERT, "order", "order-1", "test.gate", json.dumps({"n": 1}))
    env = {
        **FAST_RELAY,
        "DATABASE_URL": empty_database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{topic_namespace}.{{aggregatetype}}",
        "OUTBOX_RELAY_INSTANCE_ID": "gate-relay",
    }
    try:
        async with running("relay", ["run", "--relay-only"], env, tmp_path) as relay:
            await wait_until(lambda: _live(relay), what="the relay live", timeout=30)
            # Several lease rounds and schema polls later: unready, nothing claimed or
            # fetched, and one line that says what is missing.
            await asyncio.sleep(4)
            readyz = await relay.get("/readyz")
            assert readyz is not None and readyz.status == 503, readyz
            assert f"lacks migration {schema.MIGRATION:04d}" in readyz.text
            health = await relay.get("/health")
            assert health is not None and health.status == 503
            document = json.loads(health.body)
            assert document["status"] == "fail"
            assert document["checks"]["process:ready"][0]["observedValue"] is False
            assert not relay.logged("fetch failed")
            assert await admin.fetchval(_FETCHES) == 0
            assert await admin.fetchval("SELECT count(*) FROM relay_instance") == 0
            assert await admin.fetchval(_OWNED_LANES) == 0
            assert await relay.status("/livez") == 200
            (line,) = relay.logged(WAITING)
            assert f"lacks migration {schema.MIGRATION:04d}" in line["cause"], line
            assert "outbox-relay migrate" in line["cause"], line

            # The migration job finishes: the relay starts by itself and publishes.
            await _migrate_below(empty_database_url, 10_000)
            await wait_until(lambda: _ready(relay), what="the relay ready", timeout=30)
            health = await relay.get("/health")
            assert health is not None and health.status == 200
            assert json.loads(health.body)["status"] == "pass"
            records = await read_topic(kafka_bootstrap, f"{topic_namespace}.order", count=1)
            assert [r.key for r in records] == [b"order-1"]
            assert len(relay.logged(READY)) == 1
            assert len(relay.logged(WAITING)) == 1
            assert not relay.logged("fetch failed")
    finally:
        await admin.close()


async def _live(relay: Running) -> bool:
    return await relay.status("/livez") == 200


async def _ready(relay: Running) -> bool:
    return await relay.status("/readyz") == 200
