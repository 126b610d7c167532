"""``run`` says, before its relay claims a lane, whether a role besides the schema's owner may
create objects in the relay's schema: one warning line; with ``--refuse-open-schema``
(``OUTBOX_RELAY_REFUSE_OPEN_SCHEMA``) exit 2 with that line instead; nothing while only the
owner may (docs/security.md, "Names a neighbour cannot take over").

Real PostgreSQL (each server of the run) and the real broker: the process runs as operators
run it, under a role granted the relay and the sidecar parts.
"""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
import pytest

from tests.security.conftest import MakeRole
from tests.security.process import Service, policy_file
from tests.support.kafka_acl import environment_without_secrets
from tests.support.roles import LoginRole, grant

_SAID = "may create objects in schema public besides its owner"
_OWNED_LANES = "SELECT count(*) FROM relay_lane WHERE owner_id IS NOT NULL"


async def _role(database_url: str, make_role: MakeRole) -> LoginRole:
    role = await make_role("run")
    await grant(database_url, role.name, "relay", "sidecar")
    return role


def _env(
    role: LoginRole, kafka_bootstrap: str, topic_namespace: str, tmp_path: Path
) -> dict[str, str]:
    env = environment_without_secrets()
    env.update(
        DATABASE_URL=role.url,
        KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap,
        OUTBOX_RELAY_TOPIC_TEMPLATE=f"{topic_namespace}.{{aggregatetype}}",
        OUTBOX_RELAY_POLICY=policy_file(tmp_path),
    )
    return env


def _logged(service: Service) -> list[dict[str, object]]:
    return [json.loads(line) for line in service.lines if line.startswith("{")]


async def _close(db: asyncpg.Connection) -> None:
    # PostgreSQL 15's default for a new database, whatever the cluster's template says.
    await db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


@pytest.mark.parametrize("who", ["PUBLIC", "a role"])
async def test_run_warns_once_before_its_relay_claims_a_lane(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    who: str,
) -> None:
    await _close(db)
    role = await _role(database_url, make_role)
    grantee = "PUBLIC" if who == "PUBLIC" else f'"{(await make_role("creator")).name}"'
    await db.execute(f"GRANT CREATE ON SCHEMA public TO {grantee}")
    service = Service(_env(role, kafka_bootstrap, topic_namespace, tmp_path))
    try:
        service.wait_for_line(lambda line: '"claimed lanes"' in line)
    finally:
        assert service.stop() == 0
    messages = [entry["msg"] for entry in _logged(service)]
    warnings = [entry for entry in _logged(service) if _SAID in str(entry["msg"])]
    assert len(warnings) == 1, service.lines
    (warning,) = warnings
    assert warning["level"] == "warning"
    assert str(warning["msg"]).endswith(f"REVOKE CREATE ON SCHEMA public FROM {grantee}")
    assert messages.index(warning["msg"]) < messages.index("claimed lanes")


@pytest.mark.parametrize("how", ["flag", "variable", "sidecar alone"])
async def test_run_refuses_to_start_with_the_flag(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    how: str,
) -> None:
    role = await _role(database_url, make_role)
    await db.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    env = _env(role, kafka_bootstrap, topic_namespace, tmp_path)
    args = {"flag": ["--refuse-open-schema"], "sidecar alone": ["--no-relay"]}.get(how, [])
    if how != "flag":  # as deploy/ sets it, for the relays and the sidecar alike
        env["OUTBOX_RELAY_REFUSE_OPEN_SCHEMA"] = "on"
    service = Service(env, *args)
    code = service.process.wait(timeout=60)
    service.stop()
    assert code == 2, service.lines
    said = [line for line in service.lines if not line.startswith("{")]
    assert said == [
        f"outbox-relay: error: --refuse-open-schema: PUBLIC {_SAID}: a function or operator "
        "put there can run inside the transactions of every role that uses the schema; take "
        "it away with REVOKE CREATE ON SCHEMA public FROM PUBLIC"
    ], service.lines
    assert await db.fetchval(_OWNED_LANES) == 0
    assert not [entry for entry in _logged(service) if entry["msg"] == "claimed lanes"]


@pytest.mark.parametrize("refuse", [False, True])
async def test_run_is_silent_while_only_the_owner_may_create(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    refuse: bool,
) -> None:
    await _close(db)
    role = await _role(database_url, make_role)
    env = _env(role, kafka_bootstrap, topic_namespace, tmp_path)
    service = Service(env, *(["--refuse-open-schema"] if refuse else []))
    try:
        service.wait_for_line(lambda line: '"claimed lanes"' in line)
        assert await db.fetchval(_OWNED_LANES) > 0
    finally:
        assert service.stop() == 0
    assert not [line for line in service.lines if "may create objects" in line], service.lines
    assert not [line for line in service.lines if not line.startswith("{")], service.lines
