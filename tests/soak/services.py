"""The soak's own PostgreSQL 18 and Kafka broker: the orchestrator's declarations
(scripts/services) with the soak's settings, in a temporary directory, on the soak's port
block. Nothing here touches the development services: the soak restarts its services, so
it must own them."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from scripts.services.host import remove_tree
from scripts.services.kafka import KafkaBroker, KafkaProfile
from scripts.services.orchestrator import Orchestrator
from scripts.services.plan import Layout, PortPlan
from scripts.services.postgres import PostgresCluster, WheelBinaries

REPO = Path(__file__).resolve().parents[2]

POSTGRES_SETTINGS = (
    "max_connections = 200",
    "password_encryption = 'scram-sha-256'",
    # The soak restarts the server only cleanly (fast shutdown), which writes everything
    # out; skipping fsync spares a busy machine's disk.
    "fsync = off",
    "full_page_writes = off",
    "log_min_messages = warning",
)
# One fault-proxy listener (for the relay whose path the schedule breaks), no TLS.
KAFKA_PROFILE = KafkaProfile(
    heap_min="128m",
    heap_max="512m",
    network_threads=2,
    io_threads=2,
    internal_topic_partitions=3,
    proxies=1,
    secured=False,
)


@dataclass(frozen=True)
class Ports:
    """The soak's port block: the orchestrator's plan from ``base``, plus the processes'
    health listeners at ``base + 300 + n``."""

    base: int

    @property
    def plan(self) -> PortPlan:
        return PortPlan(self.base)

    @property
    def postgres(self) -> int:
        return self.plan.pg18

    def http(self, n: int) -> int:
        """Health listen port of process ``n`` (0: the sidecar, 1..: relays)."""
        return self.base + 300 + n


class SoakServices:
    """Both services in one temporary directory; ``close`` stops them and removes it."""

    def __init__(self, ports: Ports) -> None:
        self.ports = ports
        self.root = Path(tempfile.mkdtemp(prefix="outbox-relay-soak-"))
        self.root.chmod(0o755)  # the postgres user must reach its directory inside
        layout = Layout(state=self.root / "state", postgres_side=self.root / "pg")
        self.postgres = PostgresCluster(
            name="pg18",
            binaries=WheelBinaries(layout.postgres_side / "binaries"),
            port=ports.postgres,
            home=layout.postgres_side / "pg18",
            settings=POSTGRES_SETTINGS,
        )
        self.kafka = KafkaBroker(
            ports=ports.plan,
            home=self.root / "kafka",
            lib=Layout.for_checkout(REPO).state / "kafka-lib",  # the checkout's jars
            profile=KAFKA_PROFILE,
        )
        self.orchestrator = Orchestrator(layout, [self.postgres, self.kafka])

    async def start(self) -> None:
        """Both, until they answer (the environment's servers are not the soak's)."""
        await asyncio.to_thread(self.orchestrator.up, (), {})

    async def start_again(self, service: PostgresCluster | KafkaBroker) -> None:
        """One that a fault stopped, until it answers."""
        await asyncio.to_thread(self.orchestrator.start, service)

    def close(self, keep: bool = False) -> None:
        with contextlib.suppress(Exception):
            self.kafka.stop()
        with contextlib.suppress(Exception):
            self.postgres.stop("immediate")
        if not keep:
            with contextlib.suppress(Exception):
                remove_tree(self.root)
