"""An idle relay is alive: waiting for work on purpose must not look like a stuck loop."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.waiting import wait_until


async def test_an_idle_relay_stays_live_past_every_loop_allowance(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    config = fast_config(
        database_url,
        kafka_bootstrap,
        topic_namespace,
        max_in_flight_batches=1,
        send_timeout_ms=500,
        lease_ttl_ms=1_500,
        lease_renew_ms=200,
        poll_interval_ms=200,
    )
    async with running_relay(config) as running:
        relay = running.relay
        await wait_until(relay.ready, timeout=20, what="the relay ready")
        await db.execute(INSERT, "agg", "k", "t", "{}")
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox empty"
        )
        # The longest allowance here is (3 x 1 s + 1 x 2 x 0.5 s + 1.5 s) = 5.5 s; idle
        # for longer, then every loop must still count as alive.
        for _ in range(14):
            await asyncio.sleep(0.5)
            assert relay.live(), relay.liveness.stale()
        assert set(relay.liveness.deadlines) >= {"ack", "fetch", "lanes", "listen", "prune"}
