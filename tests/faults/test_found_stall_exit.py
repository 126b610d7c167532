"""What the soak found on a stalled Kafka path: the relay behind it ended by itself, exit
code 0, while nobody asked it to stop (soak seed 11, the ``kafka_path`` fault, twice).

Its log, in order: ``giving up on what the kafka producer holds`` (reason ``lease
ending``), ``kafka producer reset``, aiokafka callback errors (``KeyError`` in
``MessageAccumulator._pop_batch``), ``publish failed`` (``producer_reset``), ``replacing the
Kafka producer``, then ``stopped`` 0.2 s later. A relay must not end for what retrying can
fix (docs/cli.md, exit codes): it must still run when the path comes back.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from tests.faults.lanes import lanes_held
from tests.support.faultproxy import FaultProxy
from tests.support.order import Writer
from tests.support.processes import Relays
from tests.support.waiting import wait_until


async def test_a_relay_keeps_running_through_a_stalled_kafka_path(
    db: asyncpg.Connection,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path = kafka_proxies[0]
    relay = relays.start("a", path.listen)
    await wait_until(lambda: lanes_held(db, "a"), timeout=60, what="relay a holds lanes")
    await writer.commit(*(("orders", f"warm-{i}") for i in range(20)))
    await wait_until(
        lambda: _pending_is(db, 0), timeout=60, what="the warm-up published before the stall"
    )

    path.stall()
    # Work keeps arriving while the path is stalled, as in production: the relay's batches
    # wait on the stalled path past the lease's guard and it gives up on them.
    until = time.monotonic() + 15
    n = 0
    while time.monotonic() < until and relay.process.poll() is None:
        await writer.commit(("orders", f"key-{n % 10}"))
        n += 1
        await asyncio.sleep(0.1)
    code = relay.process.poll()
    path.cut()
    path.heal()
    assert code is None, (
        f"relay a ended by itself (exit code {code}) during a stalled Kafka path; "
        f"its last log lines: {[e.get('msg') for e in relay.logs()[-8:]]}"
    )
    await wait_until(lambda: _pending_is(db, 0), timeout=90, what="the backlog published")


async def _pending_is(db: asyncpg.Connection, count: int) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM outbox")) == count
