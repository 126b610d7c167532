"""A relay running inside the test's event loop, with settings that keep tests quick."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import anyio
import asyncpg
from prometheus_client import CollectorRegistry

from relay import sql
from relay.config import RelayConfig
from relay.engine import Relay
from relay.metrics import RelayMetrics
from relay.signals import RelaySignals
from relay.store import RelayStore, StoreFactory
from tests.support.waiting import wait_for_signal

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, $4::jsonb)
"""


def fast_config(database_url: str, bootstrap: str, namespace: str, **overrides: Any) -> RelayConfig:
    """Short leases and polls so tests move quickly; the namespace isolates topics."""
    values: dict[str, Any] = {
        "database_url": database_url,
        "kafka_bootstrap": bootstrap,
        "topic_template": f"{namespace}.{{aggregatetype}}",
        "lease_ttl_ms": 3_000,
        "lease_renew_ms": 500,
        "send_timeout_ms": 1_500,
        "poll_interval_ms": 200,
        "retry_base_ms": 100,
        "retry_cap_ms": 1_000,
        "linger_ms": 1,
    }
    values.update(overrides)
    return RelayConfig(**values)


@dataclasses.dataclass
class RunningRelay:
    """A relay started by :func:`running_relay`. Its :attr:`signals` are off until the test
    enables one; enabled before the test's first ``await``, none of its moments is missed."""

    relay: Relay
    stop: anyio.Event
    task: asyncio.Task[None]
    registry: CollectorRegistry

    @property
    def signals(self) -> RelaySignals:
        return self.relay.signals

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value

    async def holds_every_lane(self, timeout: float = 30.0) -> None:
        """Wait for the lane round after which this relay owns every lane (what a lone
        instance claims)."""
        self.signals.lanes_owned.enable()  # said every round: none is missed by enabling late
        await wait_for_signal(
            self.signals.lanes_owned,
            where=lambda owned: owned == sql.LANE_COUNT,
            what=f"relay {self.relay.config.instance_id} holds all {sql.LANE_COUNT} lanes",
            timeout=timeout,
        )


@contextlib.asynccontextmanager
async def running_relay(
    config: RelayConfig, *, store_factory: StoreFactory = RelayStore, tracer_provider: Any = None
) -> AsyncIterator[RunningRelay]:
    """A relay running in this event loop; ``store_factory`` lets a test hand it a store
    that pauses or fails at a named step (a subclass of RelayStore)."""
    registry = CollectorRegistry()
    relay = Relay(
        config,
        RelayMetrics.register(registry),
        store_factory=store_factory,
        tracer_provider=tracer_provider,
    )
    stop = anyio.Event()
    task = asyncio.create_task(relay.run(stop), name=f"relay {config.instance_id}")
    running = RunningRelay(relay, stop, task, registry)
    try:
        yield running
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def outbox_count(conn: asyncpg.Connection) -> int:
    """Rows still waiting in the outbox (quarantined ones left out)."""
    return int(await conn.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NULL"))
