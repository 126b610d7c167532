"""Where the test suite finds PostgreSQL and Kafka.

Order of preference: the environment (``DATABASE_URL``, ``DATABASE_URL_PG18``,
``KAFKA_BOOTSTRAP_SERVERS`` — ``make test`` starts local services and sets them), then
testcontainers where a Docker engine answers. Under ``OUTBOX_RELAY_REQUIRE_SERVICES=1``
a missing service fails the run instead of skipping tests.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REQUIRED = os.environ.get("OUTBOX_RELAY_REQUIRE_SERVICES") == "1"
KAFKA_CLUSTER_ID_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kafka_cluster_id.py"


def kafka_cluster_id_script() -> ModuleType:
    """scripts/kafka_cluster_id.py as a module: the cluster ids services.sh formats the
    broker's storage with, for every other broker the tests format."""
    spec = importlib.util.spec_from_file_location("kafka_cluster_id", KAFKA_CLUSTER_ID_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
