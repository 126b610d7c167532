"""A sidecar on a schema older than its probes read: every family ``unknown`` with reason
``schema_behind`` (never ``within_bounds``), no probe run, one log line naming what is
missing, and the families probed once the schema is there, without a restart."""

from __future__ import annotations

import asyncio
import json
import logging

import asyncpg
import pytest

from contracts.health import Classification
from contracts.policy import OutboxPolicy
from health import schema
from migrations.runner import apply, load_migrations
from pgconnect.schema import SCHEMA_BEHIND
from tests.health.test_http import running
from tests.support.http import get
from tests.support.policies import loose_policy, relay_policy

# The probes' statements, as PostgreSQL counts them: none may run below the level.
_PROBES_RUN = """
SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND (query ILIKE '%scoring_job_state%' OR query ILIKE '%FROM relay_lane%'
       OR query ILIKE '%FROM outbox%')
  AND query NOT ILIKE '%outbox_relay_migration%'  -- the level, which the gate reads
"""


async def _migrate(url: str, below: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await apply(conn, [m for m in load_migrations() if m.version < below])
    finally:
        await conn.close()


async def test_a_sidecar_below_its_level_is_unknown_then_probes_once_migrated(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await _migrate(empty_database_url, schema.MIGRATION)
    admin = await asyncpg.connect(empty_database_url)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await admin.execute("SELECT pg_stat_statements_reset()")
        policy = loose_policy(relay=relay_policy(gates_readiness=False))
        async with running(empty_database_url, policy) as sidecar:
            for _ in range(5):
                report = await sidecar.next_report()
            missing = (
                f"the database lacks migration {schema.MIGRATION:04d} (the sidecar needs "
                f"{schema.MIGRATION:04d}, the newest applied is {schema.MIGRATION - 1:04d}): "
                "run `outbox-relay migrate`"
            )
            assert [(r.family.value, r.classification, r.reasons) for r in report.families] == [
                (family, Classification.UNKNOWN, (SCHEMA_BEHIND, missing))
                for family in ("outbox", "scoring_jobs", "completion_outbox", "relay")
            ]
            assert await admin.fetchval(_PROBES_RUN) == 0
            readyz = await get(sidecar.address, "/readyz")
            assert readyz.status == 503
            health = await get(sidecar.address, "/health")
            assert health.status == 503
            document = json.loads(health.body)
            assert document["status"] == "fail"
            assert document["checks"]["relay:classification"][0]["reasons"] == [
                SCHEMA_BEHIND,
                missing,
            ]
            assert (await get(sidecar.address, "/livez")).status == 200

            await _migrate(empty_database_url, 10_000)
            async with asyncio.timeout(5):
                while (await sidecar.next_report()).readiness is not Classification.WITHIN_BOUNDS:
                    pass
            assert (await get(sidecar.address, "/readyz")).status == 200
            assert await admin.fetchval(_PROBES_RUN) > 0
    finally:
        await admin.close()
    said = [r.getMessage() for r in caplog.records if "schema" in r.getMessage()]
    assert said == [
        f"health {SCHEMA_BEHIND}: {missing}; every family is unknown until then",
        "health schema ready; the families are probed",
    ]
    # One line for every family, not one per family.
    assert not [r for r in caplog.records if r.getMessage().startswith("health outbox is unknown")]


async def test_a_sidecar_below_its_level_is_unready_even_when_no_family_gates_readiness(
    empty_database_url: str,
) -> None:
    # deploy/'s policy gates no family: readiness then hangs on the schema alone.
    await _migrate(empty_database_url, schema.MIGRATION)
    outbox = OutboxPolicy(
        max_pending_count=1000,
        max_pending_age_ms=3_600_000,
        max_quarantined_count=10,
        gates_readiness=False,
    )
    policy = loose_policy(outbox=outbox, scoring_jobs=None, completion_outbox=None)
    async with running(empty_database_url, policy) as sidecar:
        readyz = await get(sidecar.address, "/readyz")
        assert readyz.status == 503
        assert f"{SCHEMA_BEHIND} (the database lacks migration {schema.MIGRATION:04d}" in (
            readyz.text
        )
        assert (await get(sidecar.address, "/health")).status == 503
        await _migrate(empty_database_url, 10_000)
        async with asyncio.timeout(5):
            while (await get(sidecar.address, "/readyz")).status != 200:
                await sidecar.next_report()
        assert (await get(sidecar.address, "/health")).status == 200
