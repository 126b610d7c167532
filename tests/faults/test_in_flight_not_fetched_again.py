"""Rows in flight are not transferred again while their batches wait on a slow broker.

Every poll interval a full pass starts from the beginning (and after a failure is recorded,
every fetch does, until its retry is due), and while batches are in flight its fetch meets
their rows again. The relay leaves them out of what it sends, but the statement brought
each of them whole, payload and all: behind a broker that took seconds to answer, every
pass moved every row in flight across the wire once more (48 MB fetched for 12 MB of rows
in one run of tests/relay/test_neighbours.py, whose first send waited for its topic to be
created). A row in flight must come as a stand-in: its seq and key, nothing of its content."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter
from typing import Any

import asyncpg
import pytest

from relay.records import OutboxRow
from relay.store import RelayStore
from tests.support.faultproxy import FaultProxy
from tests.support.relay import fast_config, running_relay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'changed', $2::jsonb)
"""
INSERT_MANY = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', k, 'changed', p::jsonb FROM unnest($1::text[], $2::text[]) AS t(k, p)
"""
PAYLOAD_BYTES = 1_000  # a batch of them fits one producer batch: no send waits for another
ROWS = 12
POLL_MS = 200
STALL_S = 3.0


async def _pending_is_zero(db: asyncpg.Connection) -> bool:
    return int(await db.fetchval("SELECT count(*) FROM outbox")) == 0


def _counting_whole(whole: Counter[str]) -> type[RelayStore]:
    """The relay's store, counting in ``whole`` each time a row came with its content."""

    class CountsWhole(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            rows = await super().fetch_ready(lanes, cursor, limit, **kwargs)
            whole.update(row.aggregateid for row in rows if row.payload is not None)
            return rows

    return CountsWhole


async def test_rows_in_flight_cross_the_wire_once_while_the_broker_is_slow(
    db: asyncpg.Connection,
    database_url: str,
    kafka_proxies: list[FaultProxy],
    topic_namespace: str,
) -> None:
    path = kafka_proxies[0]
    config = fast_config(
        database_url,
        path.listen,
        topic_namespace,
        poll_interval_ms=POLL_MS,
        # long enough that nothing gives up on the batches while the path is stalled
        lease_ttl_ms=30_000,
        lease_renew_ms=1_000,
        send_timeout_ms=20_000,
        batch_size=4,
        max_in_flight_batches=ROWS // 4 + 1,  # a slot stays free: passes go on
    )
    whole: Counter[str] = Counter()
    async with running_relay(config, store_factory=_counting_whole(whole)) as running:
        await db.execute(INSERT, "warm-up", json.dumps({"n": 0}))
        await wait_until(lambda: _pending_is_zero(db), timeout=60, what="the warm-up published")

        path.stall()
        keys = [f"key-{n}" for n in range(ROWS)]
        payloads = [json.dumps({"pad": secrets.token_hex(PAYLOAD_BYTES // 2)}) for _ in keys]
        # one statement: the rows are fetched together, in ROWS // 4 batches
        await db.execute(INSERT_MANY, keys, payloads)
        await wait_until(lambda: all(whole[key] for key in keys), timeout=10, what="all fetched")
        # A prefetch may have read rows above its pass's bound, which the next pass sends:
        # a poll interval later every row is in flight on the stalled path.
        await asyncio.sleep(2 * POLL_MS / 1000)
        passes_before = running.metric("outbox_relay_full_passes_total")
        came_whole = {key: whole[key] for key in keys}
        await asyncio.sleep(STALL_S)  # every poll interval a full pass meets them again
        passes = running.metric("outbox_relay_full_passes_total") - passes_before
        came_whole_again = {key: whole[key] - came_whole[key] for key in keys}
        path.heal()
        await wait_until(lambda: _pending_is_zero(db), timeout=60, what="the rows published")
    assert passes >= STALL_S * 1000 / POLL_MS / 2, passes  # the passes did run meanwhile
    # The passes that met the rows while their batches waited brought none of them with
    # its content.
    assert came_whole_again == dict.fromkeys(keys, 0), came_whole_again
