"""Each part at work under a role granted only its part, and what each role is refused.

Real PostgreSQL (each server of the run) and the real broker (PLAINTEXT here; the TLS and
SASL listeners are in test_kafka_security.py).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from contracts.health import Classification
from health.commands import EXIT_CODES, check, evaluate_once
from relay.redrive import RedriveFilter, redrive
from relay.store import RelayStore
from scoring.worker import claim_next_due, enqueue_job
from scoring.writer import EventDetails, complete_job
from tests.security.conftest import MakeRole
from tests.security.process import Service, policy_file, run_cli
from tests.support.kafka import read_topic
from tests.support.kafka_acl import environment_without_secrets
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy, relay_policy
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.roles import grant
from tests.support.waiting import wait_until

DENIED = asyncpg.InsufficientPrivilegeError
REPO = Path(__file__).resolve().parents[2]

EVERY_TABLE = (
    "outbox",
    "outbox_receipt",
    "relay_lane",
    "relay_instance",
    "scoring_job_state",
    "outbox_relay_migration",
)


async def test_the_parts_do_their_work_under_their_own_roles(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    writer, relay, sidecar = [await make_role(p) for p in ("writer", "relay", "sidecar")]
    for role, part in ((writer, "writer"), (relay, "relay"), (sidecar, "sidecar")):
        await grant(database_url, role.name, part)

    # The scoring service (the table's owner) queues and leases a job; the writer completes it.
    assert await enqueue_job(db, job_ref="job-roles", request_ref="req-roles", max_attempts=3)
    claimed = await claim_next_due(db, worker_ref="worker-a", lease_ms=60_000)
    assert claimed is not None
    as_writer = await asyncpg.connect(writer.url)
    try:
        details = EventDetails(
            source="urn:test", tenant_ref="tenant-a", correlation_ref="corr-a", schema_version="1"
        )
        outcome = await complete_job(
            as_writer,
            job_ref="job-roles",
            fencing_token=claimed.fencing_token,
            result_ref="result-a",
            event=details,
        )
        assert outcome.enqueue.value == "inserted"
        await as_writer.execute(INSERT, "order", "order-1", "order.placed", '{"n": 1}')
    finally:
        await as_writer.close()

    config = fast_config(relay.url, kafka_bootstrap, topic_namespace)
    stores: list[RelayStore] = []

    def kept_store(pool: asyncpg.Pool, **options: Any) -> RelayStore:
        stores.append(RelayStore(pool, **options))
        return stores[-1]

    async with running_relay(config, store_factory=kept_store) as running:
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 64 FROM relay_lane WHERE owner_id IS NOT NULL"),
            what="every lane held",
        )
        records = await read_topic(
            kafka_bootstrap,
            [f"{topic_namespace}.scoring_job", f"{topic_namespace}.order"],
            count=2,
        )
        assert sorted(r.key for r in records) == [b"job-roles", b"order-1"]
        assert running.relay.ready()
        # Its full passes are bounded by the sequence it may read (docs/relay.md).
        (store,) = stores
        drawn = await db.fetchval("SELECT last_value FROM outbox_seq_seq")
        assert await store.seq_allocated() == drawn

        # The sidecar, with every family on, sees a clean system under its read-only role.
        policy = loose_policy(relay=relay_policy())
        report = await evaluate_once(sidecar.url, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
        assert report.classification is Classification.WITHIN_BOUNDS, report
        text, code = await check(sidecar.url, policy, receipt_retention_ms=RECEIPT_RETENTION_MS)
        assert code == EXIT_CODES[Classification.WITHIN_BOUNDS] == 0, text


async def test_redrive_runs_under_the_relays_role(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay")
    event_id = uuid.uuid4()
    await db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, attempts, "
        "quarantined_at, last_error_class) "
        "VALUES ($1, 'order', 'order-q', 'order.placed', '{}', 5, clock_timestamp(), 'too_large')",
        event_id,
    )
    conn = await asyncpg.connect(relay.url)
    try:
        assert await redrive(conn, RedriveFilter(ids=[event_id])) == 1
    finally:
        await conn.close()
    assert await db.fetchval("SELECT quarantined_at IS NULL FROM outbox WHERE id = $1", event_id)

    # And as operators run it: the command checks the schema is migrated first.
    await db.execute("UPDATE outbox SET quarantined_at = clock_timestamp() WHERE id = $1", event_id)
    env = environment_without_secrets()
    dry = run_cli("redrive", "--database-url", relay.url, "--all", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would return 1 quarantined event(s)" in dry.stdout
    done = run_cli("redrive", "--database-url", relay.url, "--id", str(event_id), env=env)
    assert done.returncode == 0, done.stderr
    assert "returned 1 quarantined event(s)" in done.stdout
    assert await db.fetchval("SELECT quarantined_at IS NULL FROM outbox WHERE id = $1", event_id)


async def _refused(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        with pytest.raises(DENIED):
            await conn.execute(statement)
    finally:
        await conn.close()


async def test_the_sidecar_cannot_write_any_table_nor_call_a_function(
    database_url: str, make_role: MakeRole
) -> None:
    sidecar = await make_role("sidecar")
    await grant(database_url, sidecar.name, "sidecar")
    for table in EVERY_TABLE:
        await _refused(sidecar.url, f"INSERT INTO {table} DEFAULT VALUES")
        await _refused(sidecar.url, f"DELETE FROM {table}")
        await _refused(sidecar.url, f"TRUNCATE {table}")
    for table, column in (
        ("outbox", "attempts"),
        ("outbox_receipt", "topic"),
        ("relay_lane", "owner_id"),
        ("relay_instance", "heartbeat_at"),
        ("scoring_job_state", "scoring_state"),
        ("outbox_relay_migration", "name"),
    ):
        await _refused(sidecar.url, f"UPDATE {table} SET {column} = {column}")
    await _refused(sidecar.url, "SELECT outbox_relay_notify()")


async def test_the_relay_cannot_write_scoring_job_state(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay", "sidecar")  # even as the combined `run`
    await _refused(
        relay.url,
        "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state, "
        "max_attempts) VALUES ('job-x', 'req-x', 'queued', 1)",
    )
    await _refused(relay.url, "UPDATE scoring_job_state SET scoring_state = 'cancelled'")
    await _refused(relay.url, "DELETE FROM scoring_job_state")
    # Nor rewrite an event: only the failure bookkeeping columns are its to update.
    await _refused(relay.url, "UPDATE outbox SET payload = '{}'")
    await _refused(
        relay.url, "INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', 'b', 'c')"
    )
    # It reads the outbox sequence's last value, and cannot draw from it or set it.
    as_relay = await asyncpg.connect(relay.url)
    try:
        assert await as_relay.fetchval("SELECT last_value FROM outbox_seq_seq") is not None
    finally:
        await as_relay.close()
    await _refused(relay.url, "SELECT nextval('outbox_seq_seq')")
    await _refused(relay.url, "SELECT setval('outbox_seq_seq', 1)")


async def test_the_writer_cannot_delete_outbox_rows_or_receipts(
    database_url: str, make_role: MakeRole
) -> None:
    writer = await make_role("writer")
    await grant(database_url, writer.name, "writer")
    await _refused(writer.url, "DELETE FROM outbox")
    await _refused(writer.url, "DELETE FROM outbox_receipt")
    await _refused(writer.url, "TRUNCATE outbox")
    await _refused(writer.url, "UPDATE outbox SET payload = '{}'")
    await _refused(
        writer.url,
        "INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, kafka_partition, kafka_offset, created_at) VALUES (gen_random_uuid(), 'a', 'b', 'c', 't', 0, 0, now())",
    )
    await _refused(writer.url, "DELETE FROM scoring_job_state")
    await _refused(writer.url, "UPDATE scoring_job_state SET max_attempts = 9")


async def test_a_sidecar_role_without_its_grant_is_unknown_naming_the_refusal(
    database_url: str, make_role: MakeRole
) -> None:
    bare = await make_role("bare")
    report = await evaluate_once(
        bare.url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS
    )
    assert report.classification is Classification.UNKNOWN
    text, code = await check(bare.url, loose_policy(), receipt_retention_ms=RECEIPT_RETENTION_MS)
    assert code == 3
    # Checked before any probe: the role may not even read the migration level.
    assert (
        "the sidecar's role may not read the migration level (outbox_relay_migration): "
        "run `outbox-relay grant --to ROLE --as sidecar`"
    ) in text
    assert bare.password not in text


def _policy_without_relay_family() -> str:
    # The example policy, minus the relay family: this sidecar runs without a relay.
    example = (REPO / "docs" / "policy.example.toml").read_text(encoding="utf-8")
    before, _, rest = example.partition("[relay]")
    _, _, after = rest.partition("[evaluation]")
    return f"{before}[relay]\nenabled = false\n\n[evaluation]{after}"


async def test_the_sidecar_process_is_within_bounds_under_its_role(
    database_url: str, make_role: MakeRole, tmp_path: Path
) -> None:
    sidecar = await make_role("sidecar")
    await grant(database_url, sidecar.name, "sidecar")
    env = environment_without_secrets()
    env.update(
        DATABASE_URL=sidecar.url,
        OUTBOX_RELAY_POLICY=policy_file(tmp_path, _policy_without_relay_family()),
    )
    service = Service(env, "--no-relay")
    try:
        await wait_until(
            lambda: service.get("/health")[0] == 200, timeout=30, what="/health answers 200"
        )
        _, body = service.get("/health")
        assert json.loads(body)["classification"] == "within_bounds", body
        assert service.get("/readyz")[0] == 200
    finally:
        assert service.stop() == 0


async def test_a_relay_role_without_its_grant_is_unready_naming_the_refusal(
    database_url: str, make_role: MakeRole, kafka_bootstrap: str, tmp_path: Path
) -> None:
    bare = await make_role("bare")
    env = environment_without_secrets()
    env.update(
        DATABASE_URL=bare.url,
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        OUTBOX_RELAY_POLICY=policy_file(tmp_path),
    )
    service = Service(env)
    try:
        line = service.wait_for_line(lambda text: "the relay waits for its schema" in text)
        assert json.loads(line)["cause"] == (
            "the relay's role may not read the migration level (outbox_relay_migration): "
            "run `outbox-relay grant --to ROLE --as relay`"
        )
        await wait_until(lambda: service.get("/readyz")[0] == 503, what="/readyz answers 503")
        assert not [text for text in service.lines if "database round failed" in text]
    finally:
        assert service.stop() == 0
    assert not any(bare.password in text for text in service.lines)


async def test_a_relay_whose_role_loses_the_sequence_while_running_still_delivers_and_says_so(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # At start the relay waits for every privilege its part is granted
    # (tests/security/test_schema_privileges.py); one taken away later is a backstop's job.
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay")
    caplog.set_level("WARNING", logger="relay.engine")
    async with running_relay(fast_config(relay.url, kafka_bootstrap, topic_namespace)) as running:
        await running.holds_every_lane()
        await db.execute(f'REVOKE ALL ON SEQUENCE outbox_seq_seq FROM "{relay.name}"')
        for n in range(3):
            await db.execute(INSERT, "order", f"order-{n}", "order.placed", json.dumps({"n": n}))
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
        # Several full passes (one every poll interval), one warning.
        await wait_until(
            lambda: db.fetchval(
                "SELECT count(*) = 3 FROM outbox_receipt WHERE published_at < now() - "
                "interval '600 ms'"
            ),
            timeout=10,
            what="three receipts older than the retention",
        )
    said = [r.getMessage() for r in caplog.records if "outbox sequence" in r.getMessage()]
    assert len(said) == 1, said
    assert "outbox-relay grant" in said[0]


async def test_a_relay_whose_role_loses_the_template_column_while_running_still_works(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    make_role: MakeRole,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Without UPDATE on the instance's topic template (taken away after the start, which
    waits for it) a relay still heartbeats and publishes, and says once what to run."""
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay")
    config = fast_config(relay.url, kafka_bootstrap, topic_namespace)
    with caplog.at_level(logging.WARNING, logger="relay.lanes"):
        async with running_relay(config) as running:
            await running.holds_every_lane()
            await db.execute(
                f'REVOKE UPDATE (topic_template) ON relay_instance FROM "{relay.name}"'
            )
            await db.execute(INSERT, "order", "order-1", "order.placed", '{"n": 1}')
            await wait_until(lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"))
            await running.holds_every_lane()  # a lane round after the revoke
    said = [r for r in caplog.records if "topic template" in r.getMessage()]
    assert len(said) == 1
