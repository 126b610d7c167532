"""A topic looked up while the broker's path is stalled is judged by the broker's answers,
not by the time the path was stalled (relay/topics.py).

Real PostgreSQL, the real broker (which creates a topic on its first use) and a relay
process reaching it through a fault proxy.
"""

from __future__ import annotations

import time

import asyncpg
import pytest

from tests.faults.lanes import unpublished
from tests.support.faultproxy import FaultProxy
from tests.support.order import Writer
from tests.support.processes import Relays
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

SEND_TIMEOUT_S = 3.0  # FAST_RELAY's send (and Kafka request) timeout


async def _nothing_left(db: asyncpg.Connection) -> bool:
    return await unpublished(db) == 0


async def _settled(db: asyncpg.Connection) -> bool:
    """Every row published or quarantined."""
    return not await db.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NULL")


ROUNDS = 8  # the chain below comes in about one round of five


# Broke before: the lookup's window (a send timeout) ran from its start. The producer's
# metadata request is sent to one connection (to the broker, or the one it bootstrapped
# from, in random order); held by the stall, it times out after the send timeout and the
# same round asks on the other. When that answer, the broker's first, came after the
# heal, the topic it then began to create was judged missing at once: "topic does not
# exist", the row failed as unknown_topic and, with one attempt, was quarantined (in 1 to
# 2 of every 8 rounds here). That is how
# test_order_under_faults.py::test_failure_inside_a_multi_partition_submit_keeps_key_order
# once failed on a slow machine.
async def test_a_topic_first_answered_after_a_stall_is_given_time_to_appear(
    db: asyncpg.Connection,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path = kafka_proxies[0]
    relay = relays.start("a", path.listen, OUTBOX_RELAY_MAX_ATTEMPTS="1")
    await writer.commit(("warmup", "w"))
    await wait_until(lambda: _nothing_left(db), timeout=30, what="the warm-up published")

    for n in range(ROUNDS):
        path.stall()
        await writer.commit((f"new{n}", f"key-{n}"))  # a topic the broker does not have yet
        await path.until(lambda c: c.held_up > 0, timeout=10)
        asked = time.monotonic()
        held = path.counters().held_up
        # The next request: the same round's on the other connection, or the next round's.
        await path.until(lambda c, held=held: c.held_up > held, timeout=15)
        assert time.monotonic() - asked >= SEND_TIMEOUT_S * 0.9
        path.heal()
        await wait_until(
            lambda: _settled(db), timeout=30, what=f"round {n}: published or quarantined"
        )

    quarantined = await db.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL")
    failures = {e.get("error_class") for e in relay.logged("publish failed")}
    missing = len(relay.logged("topic does not exist"))
    assert (quarantined, missing) == (0, 0), failures
    assert await unpublished(db) == 0
