"""A producer reset leaves no failed future that nobody reads.

A reset (a lease ending, a drain deadline, a stalled path) fails every batch the producer
holds. asyncio reports each failed future that is collected unread as an error ("Future
exception was never retrieved"), so an unread one reads in the relay's log as an error on
every reset, though nothing went wrong. The soak found one per relay that reset while its
path was busy. Here the path is stalled with batches in flight and queued behind them, the
producer is reset and replaced, and the loop's error handler must hear nothing.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import anyio
import pytest

from relay.config import RelayConfig
from relay.inflight import InFlightWindow
from relay.producer import ProducerKeeper
from relay.publisher import Submission
from relay.records import KafkaRecord
from tests.support.faultproxy import FaultProxy
from tests.support.rows import make_row

pytestmark = pytest.mark.timeout(60)


def _record(topic: str, n: int) -> KafkaRecord:
    return KafkaRecord(topic=topic, key=b"k%d" % (n % 4), value=b'{"n":%d}' % n, headers=[])


class _Rows:
    """Numbered rows on four keys, submitted through the keeper's current producer."""

    def __init__(self, keeper: ProducerKeeper, topic: str) -> None:
        self.keeper, self.topic, self.n = keeper, topic, 0

    async def submit(self, count: int) -> Submission:
        rows = [
            make_row(seq=self.n + i, aggregateid=f"k{(self.n + i) % 4}")
            for i in range(1, count + 1)
        ]
        self.n += count
        records = {row.seq: _record(self.topic, row.seq) for row in rows}
        holds = InFlightWindow(8, hold_of=lambda row: (self.topic, row.aggregateid))
        return await self.keeper.submit(rows, lambda row: records[row.seq], holds)


async def _landed(submission: Submission) -> bool:
    answers = await submission.acknowledgements(20)
    return bool(answers) and all(not isinstance(a.result, BaseException) for a in answers)


async def _reset_while_held(keeper: ProducerKeeper, path: FaultProxy, topic: str) -> None:
    """Batches in flight and queued on a stalled path; the relay stops waiting for them
    (its lease is ending), resets the producer and goes on with a new one."""
    rows = _Rows(keeper, topic)
    assert await _landed(await rows.submit(8))  # the topic exists, its leaders are known
    path.stall()
    held = [await rows.submit(8) for _ in range(4)]  # several batches per partition
    await path.until(lambda c: c.held_up > 0, timeout=10)
    # Cut: the sender puts the batches it had sent back in its queue, to send again on a
    # new connection, which stalls in turn.
    assert path.cut() > 0
    await asyncio.sleep(1.0)
    for submission in held:
        answers = await submission.acknowledgements(0.2)
        assert answers and all(isinstance(a.result, TimeoutError) for a in answers)
    keeper.reset("test: lease ending")
    await asyncio.sleep(0.5)  # the reset's failures reach every batch's future
    path.heal()
    await keeper.replace(anyio.Event())
    assert await _landed(await rows.submit(8))


async def test_a_reset_with_batches_held_leaves_no_unread_failure(
    kafka_proxies: list[FaultProxy], topic_namespace: str
) -> None:
    path = kafka_proxies[0]
    keeper = ProducerKeeper(
        RelayConfig(
            database_url=None,
            kafka_bootstrap=path.listen,
            send_timeout_ms=20_000,
            lease_ttl_ms=30_000,
        )
    )
    assert await keeper.start(anyio.Event())
    loop = asyncio.get_running_loop()
    heard: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: heard.append(context))
    try:
        try:
            await _reset_while_held(keeper, path, f"{topic_namespace}.reset")
        finally:
            await keeper.stop()
        del keeper  # with it the old producers: whatever nobody read is reported now
        for _ in range(3):
            gc.collect()
            await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
    assert [(c.get("message"), repr(c.get("exception"))) for c in heard] == []
