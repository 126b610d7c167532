"""The relay against the real broker's secured listeners, with only the ACLs the docs list.

SASL_SSL with SCRAM-SHA-512 and with PLAIN, and SSL with a client certificate; each
principal may only WRITE and DESCRIBE its test's topic prefix (Kafka >= 3.0 needs no
IdempotentWrite on the cluster for the idempotent producer). A wrong password and an
untrusted broker certificate keep the relay unready and print no secret.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from relay.config import KafkaSecurity
from tests.security.conftest import MakeRole
from tests.security.process import Service, policy_file
from tests.support.kafka import read_topic
from tests.support.kafka_acl import (
    DESCRIBE,
    Listener,
    ca_file,
    environment_without_secrets,
    listener,
    topics_with_acls,
)
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.roles import grant
from tests.support.tls import untrusted_ca
from tests.support.waiting import wait_until

EVENTS = 20


def security_of(secured: Listener, *, cafile: str | None = None) -> KafkaSecurity:
    return KafkaSecurity(
        protocol=secured.protocol,
        sasl_mechanism=secured.sasl_mechanism,
        sasl_username=secured.sasl_username,
        sasl_password=secured.password(),
        ssl_cafile=cafile or ca_file(),
        ssl_certfile=secured.certfile,
        ssl_keyfile=secured.keyfile,
    )


@pytest.mark.parametrize("name", ["scram", "plain", "ssl"])
async def test_the_relay_publishes_through_each_secured_listener_with_only_the_documented_acls(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    name: str,
) -> None:
    secured = listener(name)
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay")
    topic = f"{topic_namespace}.order"
    async with topics_with_acls(kafka_bootstrap, topic_namespace, [topic], secured.principal):
        for i in range(EVENTS):
            await db.execute(
                INSERT, "order", f"order-{i % 4}", "order.placed", json.dumps({"n": i})
            )
        config = fast_config(
            relay.url, secured.bootstrap, topic_namespace, kafka_security=security_of(secured)
        )
        async with running_relay(config) as running:
            await wait_until(
                lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
            )
            assert running.relay.ready()
        records = await read_topic(kafka_bootstrap, topic, count=EVENTS)
    # At-least-once: a resend after a slow acknowledgement repeats an id, never loses one.
    ids = {dict(r.headers)["id"] for r in records}
    assert len(ids) == EVENTS
    assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == EVENTS


async def test_without_write_on_its_topics_the_relay_publishes_nothing(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The authorizer really decides: DESCRIBE alone is not enough to produce. Without WRITE
    # on any topic the broker refuses the idempotent producer its id (KIP-679), so the
    # relay never gets to send, says why, and nothing reaches the topic.
    secured = listener("scram")
    topic = f"{topic_namespace}.order"
    async with topics_with_acls(
        kafka_bootstrap, topic_namespace, [topic], secured.principal, operations=(DESCRIBE,)
    ):
        await db.execute(INSERT, "order", "order-1", "order.placed", "{}")
        config = fast_config(
            database_url, secured.bootstrap, topic_namespace, kafka_security=security_of(secured)
        )
        with caplog.at_level("WARNING", logger="relay.producer"):
            async with running_relay(config) as running:

                def refused() -> bool:
                    return any(
                        r.getMessage() == "kafka not reachable, retrying"
                        and getattr(r, "error_class", None) == "authorization"
                        for r in caplog.records
                    )

                await wait_until(refused, what="the broker's refusal logged")
                assert not running.relay.ready()
        assert await db.fetchval("SELECT count(*) FROM outbox") == 1
        assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == 0


def _relay_env(
    database_url: str, secured: Listener, tmp_path: Path, **extra: str
) -> dict[str, str]:
    env = environment_without_secrets()
    env.update(
        DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP_SERVERS=secured.bootstrap,
        KAFKA_SECURITY_PROTOCOL=secured.protocol,
        OUTBOX_RELAY_POLICY=policy_file(tmp_path),
        OUTBOX_RELAY_LOG_FORMAT="json",
    )
    if secured.sasl_mechanism:
        env.update(KAFKA_SASL_MECHANISM=secured.sasl_mechanism)
        env.update(KAFKA_SASL_USERNAME=secured.sasl_username or "")
    env.update(extra)
    return env


@pytest.fixture
def services() -> Iterator[list[Service]]:
    started: list[Service] = []
    yield started
    for service in started:
        service.stop()


def _kafka_warning(line: str) -> bool:
    return '"kafka not reachable' in line


def _refused_setups(tmp_path: Path) -> list[tuple[str, str, dict[str, str]]]:
    """(name, the secret the process was given, its extra environment)."""
    wrong = "wrong-kafka-password-5b1e"
    password_file = tmp_path / "wrong-password"
    password_file.write_text(wrong)
    right = listener("scram").password() or ""
    return [
        (
            "wrong password",
            wrong,
            {"KAFKA_SASL_PASSWORD_FILE": str(password_file), "KAFKA_SSL_CAFILE": ca_file()},
        ),
        (
            "untrusted broker certificate",
            right,
            {"KAFKA_SASL_PASSWORD": right, "KAFKA_SSL_CAFILE": untrusted_ca(tmp_path)},
        ),
    ]


@pytest.mark.parametrize("case", [0, 1], ids=["wrong-password", "untrusted-broker"])
def test_a_refused_connection_keeps_the_relay_unready_and_prints_no_secret(
    database_url: str, tmp_path: Path, services: list[Service], case: int
) -> None:
    _, secret, extra = _refused_setups(tmp_path)[case]
    service = Service(_relay_env(database_url, listener("scram"), tmp_path, **extra))
    services.append(service)
    warning = service.wait_for_line(_kafka_warning)
    assert json.loads(warning)["level"] == "warning"
    status, body = service.get("/readyz")
    assert status == 503
    assert service.stop() == 0
    everything = "\n".join([*service.lines, body])
    assert secret not in everything
    for line in service.lines:
        json.loads(line)  # each message is one line


@pytest.mark.parametrize(
    ("case", "cause"),
    [(0, "authentication"), (1, "certificate")],
    ids=["wrong-password", "untrusted-broker"],
)
def test_a_refused_connection_names_what_failed(
    database_url: str, tmp_path: Path, services: list[Service], case: int, cause: str
) -> None:
    _, _, extra = _refused_setups(tmp_path)[case]
    service = Service(_relay_env(database_url, listener("scram"), tmp_path, **extra))
    services.append(service)
    warning = service.wait_for_line(_kafka_warning)
    assert cause in warning


@pytest.mark.parametrize("name", ["plain", "scram"])
async def test_debug_logging_shows_neither_the_sasl_password_nor_record_contents(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
    services: list[Service],
    name: str,
) -> None:
    # At debug level the Kafka client logs every request it sends; a PLAIN
    # SaslAuthenticate request carries the password in the clear, a Produce request the
    # records' keys and values.
    secured = listener(name)
    relay = await make_role("relay")
    await grant(database_url, relay.name, "relay")
    secret = secured.password() or ""
    key, marker = "agg-debug-7f3c", "payload-marker-9d2e"
    topic = f"{topic_namespace}.order"
    async with topics_with_acls(kafka_bootstrap, topic_namespace, [topic], secured.principal):
        await db.execute(INSERT, "order", key, "order.placed", json.dumps({"m": marker}))
        env = _relay_env(
            relay.url,
            secured,
            tmp_path,
            KAFKA_SASL_PASSWORD=secret,
            KAFKA_SSL_CAFILE=ca_file(),
            OUTBOX_RELAY_TOPIC_TEMPLATE=f"{topic_namespace}.{{aggregatetype}}",
            OUTBOX_RELAY_LOG_LEVEL="debug",
        )
        service = Service(env)
        services.append(service)
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 1 FROM outbox_receipt"),
            what="one event published",
        )
        assert service.stop() == 0
    everything = "\n".join(service.lines)
    # Debug logging was on: the relay says, in counts, what each recording statement wrote.
    recorded = [json.loads(line) for line in service.lines if '"msg":"recorded"' in line]
    assert recorded and all(line["level"] == "debug" for line in recorded), everything
    assert sum(line["published"] for line in recorded) == 1
    assert secret and secret not in everything
    assert key not in everything and marker not in everything
