"""No secret in anything the product shows: log lines, errors, /health, /metrics, the status
page, or its command line in ``ps``.

The processes get every secret the documented way: the database password through libpq's
password file, the Kafka password through a file named in the environment. Runs that fail
(wrong passwords, a role without a grant) are part of the sweep.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from tests.security.conftest import MakeRole
from tests.security.process import Service, process_list, run_cli
from tests.support.kafka_acl import ca_file, environment_without_secrets, listener, topics_with_acls
from tests.support.relay import INSERT
from tests.support.roles import LoginRole, grant
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def _url_without_password(database_url: str, role: str) -> str:
    parts = urlsplit(database_url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def _passfile(directory: Path, database_url: str, role: LoginRole, password: str) -> str:
    parts = urlsplit(database_url)
    path = directory / f"pgpass-{password[:4]}"
    path.write_text(
        f"{parts.hostname}:{parts.port}:{parts.path.lstrip('/')}:{role.name}:{password}\n"
    )
    path.chmod(0o600)
    return str(path)


def _shown_while_refused(env: dict[str, str], says: str) -> list[str]:
    """Everything a ``run`` that is refused shows (its process list, /health, /metrics and
    its output), read while it runs, once it says ``says``."""
    service = Service(env)
    try:
        service.wait_for_line(lambda line: says in line)
        shown = [process_list(service.process.pid)]
        shown += [body for _, body in (service.get("/health"), service.get("/metrics"))]
    finally:
        service.stop()
    return [*shown, *service.lines]


def _cli(env: dict[str, str], *args: str) -> tuple[list[str], str]:
    done = run_cli(*args, env=env)
    return [sys.executable, "-m", "outbox_relay", *args], done.stdout + done.stderr


async def test_no_secret_appears_in_logs_errors_endpoints_or_the_process_list(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> None:
    role = await make_role("run")
    await grant(database_url, role.name, "relay", "sidecar")
    secured = listener("scram")
    kafka_password = secured.password()
    assert kafka_password and secured.password_file
    wrong_db_password = "wrong-db-password-9c41"
    wrong_kafka_password = "wrong-kafka-password-77ad"
    secrets = [role.password, kafka_password, wrong_db_password, wrong_kafka_password]

    env = environment_without_secrets()
    env.update(
        DATABASE_URL=_url_without_password(database_url, role.name),
        PGPASSFILE=_passfile(tmp_path, database_url, role, role.password),
        KAFKA_BOOTSTRAP_SERVERS=secured.bootstrap,
        KAFKA_SECURITY_PROTOCOL="SASL_SSL",
        KAFKA_SASL_MECHANISM=secured.sasl_mechanism or "",
        KAFKA_SASL_USERNAME=secured.sasl_username or "",
        KAFKA_SASL_PASSWORD_FILE=secured.password_file,
        KAFKA_SSL_CAFILE=ca_file(),
        OUTBOX_RELAY_POLICY=str(REPO / "docs" / "policy.example.toml"),
        OUTBOX_RELAY_TOPIC_TEMPLATE=f"{topic_namespace}.{{aggregatetype}}",
        OUTBOX_RELAY_LOG_LEVEL="debug",
    )
    shown: list[str] = []  # everything a person or a scraper could read
    topic = f"{topic_namespace}.order"
    async with topics_with_acls(kafka_bootstrap, topic_namespace, [topic], secured.principal):
        for i in range(10):
            await db.execute(INSERT, "order", f"order-{i}", "order.placed", json.dumps({"n": i}))
        service = Service(env)
        try:
            await wait_until(
                lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
            )
            for path in ("/health", "/metrics", "/", "/readyz", "/livez"):
                status, body = service.get(path)
                assert status in (200, 503), path
                shown.append(body)
            shown.append(process_list(service.process.pid))
        finally:
            assert service.stop() == 0
        shown.extend(service.lines)

        # The same settings for the one-shot verbs; then the failures.
        for args in (
            ["check"],
            ["status"],
            ["grant", "--to", role.name, "--as", "relay", "--print"],
        ):
            argv, output = _cli(env, *args)
            shown += [" ".join(argv), output]

        wrong_db = {**env, "PGPASSFILE": _passfile(tmp_path, database_url, role, wrong_db_password)}
        # run keeps running on a refused login (it serves unknown and retries), so it is
        # read while it runs, like the wrong Kafka password below.
        shown += _shown_while_refused(wrong_db, "authentication failed")
        argv, output = _cli(wrong_db, "check")
        shown += [" ".join(argv), output]

        wrong_kafka = {
            **env,
            "KAFKA_SASL_PASSWORD_FILE": "",
            "KAFKA_SASL_PASSWORD": wrong_kafka_password,
        }
        shown += _shown_while_refused(wrong_kafka, "kafka not reachable")

    assert len(shown) > 20
    text = "\n".join(shown)
    for secret in secrets:
        assert secret not in text, "a secret was shown"
    assert "postgresql://" not in text
    assert os.fspath(tmp_path) not in text  # not even where the password file lives
