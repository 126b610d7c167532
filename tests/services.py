"""Where the test suite finds PostgreSQL and Kafka.

Order of preference: the environment (``DATABASE_URL``, ``DATABASE_URL_PG18``,
``KAFKA_BOOTSTRAP_SERVERS``: ``make test`` starts the services with ``python -m
scripts.services up`` and sources the ``.services/env`` it writes), then
testcontainers where a Docker engine answers. Under ``OUTBOX_RELAY_REQUIRE_SERVICES=1``
a missing service fails the run instead of skipping tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

REQUIRED = os.environ.get("OUTBOX_RELAY_REQUIRE_SERVICES") == "1"


@dataclass(frozen=True)
class PostgresServer:
    name: str
    url: str


def postgres_servers_from_env() -> list[PostgresServer]:
    servers = []
    for name, var in (("pg-debian", "DATABASE_URL"), ("pg18", "DATABASE_URL_PG18")):
        url = os.environ.get(var)
        if url:
            servers.append(PostgresServer(name, url))
    return servers


def docker_engine_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
