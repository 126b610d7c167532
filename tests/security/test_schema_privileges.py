"""A part whose role lacks a privilege it needs waits as it does below its migration level:
not ready, nothing claimed or probed, what is missing said in one line, and it starts by
itself once ``outbox-relay grant`` has run (DESIGN §10b). The privileges each part checks
are exactly those ``grant`` gives it."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from health import schema as health_schema
from health.config import SidecarConfig
from health.sidecar import HealthSidecar
from migrations.grants import RELAY, SEQUENCES, SIDECAR, TABLES, merged_access
from pgconnect.schema import SCHEMA_BEHIND, Privilege, SchemaNeeds
from relay import schema as relay_schema
from tests.security.conftest import MakeRole
from tests.support.kafka import read_topic
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.roles import grant
from tests.support.waiting import wait_until


def _granted(part: str) -> set[Privilege]:
    """What ``grant --as part`` gives, in the gate's terms."""
    wanted: set[Privilege] = set()
    for table in TABLES:
        access = merged_access(table, [part])
        wanted |= {Privilege("table", table, p) for p in access.privileges}
        wanted |= {Privilege("column", table, "UPDATE", c) for c in access.update_columns}
        wanted |= {Privilege("column", table, "INSERT", c) for c in access.insert_columns}
    for sequence, needs in SEQUENCES.items():
        wanted |= {Privilege("sequence", sequence, p) for p in needs.get(part, ())}
    return wanted


@pytest.mark.parametrize(
    ("needs", "part"), [(relay_schema.NEEDS, RELAY), (health_schema.NEEDS, SIDECAR)]
)
def test_each_part_checks_exactly_what_grant_gives_it(needs: SchemaNeeds, part: str) -> None:
    assert needs.part == part
    assert len(set(needs.privileges)) == len(needs.privileges)
    assert set(needs.privileges) == _granted(part)


async def test_a_relay_whose_role_lacks_a_privilege_waits_until_grant_runs_again(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    role = await make_role("relay")
    await grant(database_url, role.name, "relay")
    # As a role granted before migration 0007 added the column its heartbeat writes.
    await db.execute(f'REVOKE UPDATE (topic_template) ON relay_instance FROM "{role.name}"')
    await db.execute(INSERT, "order", "order-1", "test.gate", json.dumps({"n": 1}))
    config = fast_config(role.url, kafka_bootstrap, topic_namespace)
    async with running_relay(config) as relay:
        await wait_until(
            lambda: relay.relay.waiting_for() is not None, what="the relay waiting", timeout=15
        )
        await asyncio.sleep(1.5)
        assert relay.relay.waiting_for() == (
            "the relay's role lacks UPDATE(topic_template) on relay_instance: "
            "run `outbox-relay grant --to ROLE --as relay`"
        )
        assert not relay.relay.ready()
        assert await db.fetchval("SELECT count(*) FROM relay_instance") == 0
        assert await db.fetchval("SELECT count(*) FROM outbox") == 1
        await grant(database_url, role.name, "relay")
        await relay.holds_every_lane(timeout=15)
        assert relay.relay.waiting_for() is None
        records = await read_topic(kafka_bootstrap, f"{topic_namespace}.order", count=1)
        assert [r.key for r in records] == [b"order-1"]


async def test_a_sidecar_that_may_not_read_the_migration_level_says_to_grant(
    database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("sidecar")
    # What the sidecar part held before it read the migration level.
    await grant(database_url, role.name, "sidecar")
    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(f'REVOKE SELECT ON outbox_relay_migration FROM "{role.name}"')
    finally:
        await admin.close()
    sidecar = HealthSidecar(
        SidecarConfig(
            database_url=role.url,
            policy=loose_policy(),
            listen=("127.0.0.1", 0),
            receipt_retention_ms=RECEIPT_RETENTION_MS,
        ),
        registry=CollectorRegistry(),
    )
    async with sidecar:
        report = await sidecar.evaluate_once()
        assert not sidecar.ready()
        for result in report.families:
            assert result.reasons == (
                SCHEMA_BEHIND,
                "the sidecar's role may not read the migration level (outbox_relay_migration): "
                "run `outbox-relay grant --to ROLE --as sidecar`",
            ), result
            assert result.evidence is None
        await grant(database_url, role.name, "sidecar")
        report = await sidecar.evaluate_once()
        assert [r.classification.value for r in report.families] == ["within_bounds"] * 3
        assert sidecar.ready()
