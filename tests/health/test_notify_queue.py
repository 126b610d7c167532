"""The sidecar exports how full the cluster's NOTIFY queue is (health/notify_queue.py): a
session that listens and then stays in a transaction holds the queue, the notifications
sent meanwhile fill it, and the gauge shows it. Real PostgreSQL, each server.

The queue itself is not filled here: it is one per cluster (the test servers are shared)
and 8 GB."""

from __future__ import annotations

import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from contracts.policy import Policy
from tests.health.test_http import running
from tests.support.http import get
from tests.support.roles import create_login_role, drop_role
from tests.support.waiting import wait_until

GAUGE = "outbox_relay_notification_queue_usage_ratio"
CHANNEL = "outbox_relay"
_PAYLOAD_BYTES = 7_000  # under NOTIFY's 8,000-byte limit
_NOTIFICATIONS = 200  # about 1.4 MB: some 170 of the queue's 8 kB pages


def samples(metrics: str) -> list[float]:
    """The gauge's sample values in a /metrics text (none when it was not read)."""
    return [
        sample.value
        for family in text_string_to_metric_families(metrics)
        if family.name == GAUGE
        for sample in family.samples
    ]


async def test_the_queue_held_by_a_listener_in_a_transaction_shows_in_the_gauge(
    database_url: str, db: asyncpg.Connection
) -> None:
    # The listener is a role that can only connect: no part granted, nothing else needed.
    role = await create_login_role(db, database_url, "listener")
    listener = await asyncpg.connect(role.url)
    try:
        await listener.add_listener(CHANNEL, lambda *_: None)
        holding = listener.transaction()
        await holding.start()
        await listener.execute("SELECT 1")  # in a transaction: it reads no notification
        async with running(database_url) as sidecar:
            before = max(samples((await get(sidecar.address, "/metrics")).text))
            for _ in range(_NOTIFICATIONS):
                await db.execute("SELECT pg_notify($1, repeat('x', $2))", CHANNEL, _PAYLOAD_BYTES)
            held = float(await db.fetchval("SELECT pg_notification_queue_usage()"))
            assert held > before

            async def exported() -> float:
                (value,) = samples((await get(sidecar.address, "/metrics")).text)
                return value

            async def holds_what_was_queued() -> bool:
                return await exported() >= held

            async def emptied() -> bool:
                return await exported() < held

            # The next evaluations read it: at least what was queued behind the listener.
            await wait_until(holds_what_was_queued, timeout=10, what=f"{GAUGE} >= {held}")
            # Once the listener's transaction ends it reads them, and the queue empties.
            await holding.rollback()
            await wait_until(emptied, timeout=10, what=f"{GAUGE} < {held}")
    finally:
        await listener.close()
        await drop_role(db, role.name)


async def test_a_process_that_evaluates_no_family_does_not_read_it(database_url: str) -> None:
    # A relay-only process: the queue is the database's, reported by its sidecar.
    nothing = Policy(outbox=None, scoring_jobs=None, completion_outbox=None, relay=None)
    async with running(database_url, policy=nothing) as sidecar:
        metrics = (await get(sidecar.address, "/metrics")).text
    assert f"# TYPE {GAUGE} gauge" in metrics
    assert samples(metrics) == []
