"""Topics and ACLs on the test broker, made by a super user over the PLAINTEXT listener.

aiokafka's admin client has no ACL calls, so the Kafka protocol's CreateAcls/DeleteAcls
requests are sent through it directly. Each ACL is scoped to one test's topic prefix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest

from tests.support.kafka import create_topics
from tests.support.tls import service_file

# Kafka's wire codes (org.apache.kafka.common.acl / resource).
TOPIC = 2
PREFIXED = 4
WRITE = 4
DESCRIBE = 8
DESCRIBE_CONFIGS = 10
ALLOW = 3
# Strimzi's names of the operations (KafkaUser spec.authorization.acls[].operations).
OPERATION_CODES = {"Write": WRITE, "Describe": DESCRIBE, "DescribeConfigs": DESCRIBE_CONFIGS}

# What docs/security.md says the relay's principal needs on its topics (Kafka >= 3.0).
RELAY_TOPIC_OPERATIONS = (WRITE, DESCRIBE)


@dataclass(frozen=True)
class Listener:
    """One secured listener and how the relay authenticates on it."""

    name: str
    bootstrap: str
    principal: str
    protocol: str
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    password_file: str | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def password(self) -> str | None:
        """The SASL password, read from the file the test services wrote."""
        if self.password_file is None:
            return None
        with open(self.password_file, encoding="utf-8") as handle:
            return handle.read().strip()


def listener(name: str) -> Listener:
    """``scram``, ``plain`` or ``ssl``: the test broker's secured listeners."""
    if name == "ssl":
        return Listener(
            name=name,
            bootstrap=service_file("KAFKA_SSL_BOOTSTRAP"),
            principal="User:CN=outbox-relay-client",
            protocol="SSL",
            certfile=service_file("KAFKA_TEST_CLIENT_CERTFILE"),
            keyfile=service_file("KAFKA_TEST_CLIENT_KEYFILE"),
        )
    mechanism, user, variable = {
        "scram": ("SCRAM-SHA-512", "relay", "KAFKA_TEST_SCRAM_RELAY_PASSWORD_FILE"),
        "plain": ("PLAIN", "relay-plain", "KAFKA_TEST_PLAIN_RELAY_PASSWORD_FILE"),
    }[name]
    return Listener(
        name=name,
        bootstrap=service_file("KAFKA_SASL_SSL_BOOTSTRAP"),
        principal=f"User:{user}",
        protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_username=user,
        password_file=service_file(variable),
    )


@contextlib.asynccontextmanager
async def topics_with_acls(
    plaintext_bootstrap: str,
    prefix: str,
    topics: list[str],
    principal: str,
    operations: tuple[int, ...] = RELAY_TOPIC_OPERATIONS,
    partitions: int = 3,
) -> AsyncIterator[None]:
    """Create ``topics`` and allow ``principal`` only ``operations`` on ``prefix``."""
    await create_topics(plaintext_bootstrap, topics, partitions=partitions)
    admin = AIOKafkaAdminClient(bootstrap_servers=plaintext_bootstrap)
    await admin.start()
    try:
        for operation in operations:
            response = await admin._send_request(
                CreateAclsRequest(TOPIC, prefix, PREFIXED, principal, "*", operation, ALLOW)
            )
            assert [r[0] for r in response.creation_responses] == [0], response
        yield
    finally:
        with contextlib.suppress(Exception):
            for operation in operations:
                await admin._send_request(
                    DeleteAclsRequest(TOPIC, prefix, PREFIXED, principal, "*", operation, ALLOW)
                )
            await admin.delete_topics(topics)
        await admin.close()


def ca_file() -> str:
    """The CA that signed the broker's certificate."""
    return service_file("KAFKA_TEST_CAFILE")


def environment_without_secrets() -> dict[str, str]:
    """The test process's environment minus every variable that names a test secret."""
    return {k: v for k, v in os.environ.items() if "PASSWORD" not in k and k != "DATABASE_URL"}
