"""The Strimzi overlay's relay, run as its manifest says against the real broker's SASL_SSL
listener: logged in with SCRAM-SHA-512 as its KafkaUser, holding only that user's ACLs, the
broker's certificate checked against the mounted cluster CA and PostgreSQL's against the
mounted database CA, with verified transport required. It publishes to the KafkaTopic's
topic, and with PostgreSQL reached without TLS it refuses to start.

The cluster's names stand for this machine's: the user's principal for the broker's SCRAM
user, the topics' prefix for this test's, the Secrets' contents for the test services' CA
and password files. TLS to PostgreSQL is Debian's build only (pg18's has no TLS)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from tests.deploy.conftest import one
from tests.deploy.pods import Cluster, Pod, run_once, running
from tests.support.http import get
from tests.support.kafka import read_topic
from tests.support.kafka_acl import OPERATION_CODES, listener, topics_with_acls
from tests.support.tls import service_file
from tests.support.waiting import wait_until

EVENTS = 10
_INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'scoring_job', 'job-' || n, 'scoring.result.completed', jsonb_build_object('n', n)
FROM generate_series(1, $1) AS n
"""


def _verified(database_url: str) -> str:
    """The test database at the host name its certificate carries, verify-full, no root
    certificate named: the relay must find it where PGSSLROOTCERT points, in the mount."""
    parts = urlsplit(database_url)
    netloc = f"{parts.username}:{parts.password}@localhost:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode({"sslmode": "verify-full"})))


def _text(variable: str) -> str:
    """The content of a file the test services name."""
    return Path(service_file(variable)).read_text()


async def _ready(port: int) -> bool:
    try:
        return (await get(("127.0.0.1", port), "/readyz")).status == 200
    except OSError:
        return False


@pytest.mark.timeout(300)
async def test_the_strimzi_relay_publishes_over_verified_tls_as_its_kafka_user(
    rendered_strimzi: list[dict[str, Any]],
    image: dict[str, Any],
    pg_server: Any,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> None:
    if pg_server.name != "pg-debian":
        pytest.skip("this PostgreSQL build has no TLS support")
    scram = listener("scram")
    user = one(rendered_strimzi, "KafkaUser", "outbox-relay")
    cluster_name = user["metadata"]["labels"]["strimzi.io/cluster"]
    (acl,) = user["spec"]["authorization"]["acls"]
    (topic_object,) = [o for o in rendered_strimzi if o["kind"] == "KafkaTopic"]
    config = one(rendered_strimzi, "ConfigMap", "outbox-relay-config")["data"]

    def ours(name: str) -> str:  # the cluster's topic names, in this test's namespace
        return re.sub(r"^outbox\.", f"{topic_namespace}.", name)

    template = ours(config.get("OUTBOX_RELAY_TOPIC_TEMPLATE", "outbox.event.{aggregatetype}"))
    topic = ours(topic_object["spec"]["topicName"])
    database_env = tmp_path / "database.env"
    database_env.write_text(f"relay-url={_verified(database_url)}\n")
    cluster = Cluster(
        rendered_strimzi,
        image,
        database_env=database_env,
        server_url=_verified(database_url),
        settings={
            "KAFKA_BOOTSTRAP_SERVERS": scram.bootstrap,
            "KAFKA_SASL_USERNAME": scram.sasl_username or "",
            "OUTBOX_RELAY_TOPIC_TEMPLATE": template,
        },
        suffix="",
        workdir=tmp_path,
        secrets={
            f"{cluster_name}-cluster-ca-cert": {"ca.crt": _text("KAFKA_TEST_CAFILE")},
            user["metadata"]["name"]: {"password": scram.password() or ""},
            "outbox-relay-postgres-ca": {"ca.crt": _text("PG_TEST_CAFILE")},
        },
    )
    (relay,) = cluster.pods("Deployment", "outbox-relay")
    assert relay.env["OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT"] == "on"
    operations = tuple(OPERATION_CODES[name] for name in acl["operations"])
    prefix = ours(acl["resource"]["name"])
    async with (
        topics_with_acls(
            kafka_bootstrap,
            prefix,
            [topic],
            scram.principal,
            operations,
            partitions=topic_object["spec"]["partitions"],
        ),
        running(relay, tmp_path) as process,
    ):
        assert relay.port is not None
        port = relay.port
        log = tmp_path / f"{relay.name}.log"
        try:
            await wait_until(lambda: _ready(port), what="the relay ready", timeout=90)
        except AssertionError:
            raise AssertionError(f"exit {process.returncode}: {log.read_text()}") from None
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(_INSERT, EVENTS)
        finally:
            await conn.close()
        records = await read_topic(kafka_bootstrap, topic, count=EVENTS, timeout=60)
        assert sorted(r.key for r in records) == sorted(f"job-{n}".encode() for n in range(1, 11))
        metrics = (await get(("127.0.0.1", port), "/metrics")).text
        assert 'outbox_relay_unverified_transport{path="postgres"} 0.0' in metrics
        assert 'outbox_relay_unverified_transport{path="kafka"} 0.0' in metrics

    # The same pod with a database URL whose certificate is not checked (sslmode=require, an
    # address that is no loopback one): refused before it connects, one line, exit 2.
    unchecked = "postgresql://outbox@192.0.2.1:5432/scoring?sslmode=require"
    refused = Pod(relay.name, relay.argv, {**relay.env, "DATABASE_URL": unchecked}, None)
    code, output = await run_once(refused)
    assert code == 2, output
    assert "--require-verified-transport: PostgreSQL is reached with" in output
