"""Stopping the relay's producer leaves no broker connection open.

aiokafka's client closes the connections it has when it closes; one that a task of the
producer (the sender, a metadata lookup) is opening at that moment lands in the client
afterwards and stays open, unowned, until the garbage collector finds it. A full test run
once failed on exactly that (``ResourceWarning: Unclosed AIOKafkaConnection``, from the
broker-restart test). Here the connection is opened on purpose while the producer stops.
"""

from __future__ import annotations

import asyncio
import gc

import anyio
from aiokafka.client import ConnectionGroup
from aiokafka.conn import AIOKafkaConnection

from relay.config import RelayConfig
from relay.producer import ProducerKeeper


def _open_connections_of(client: object) -> list[AIOKafkaConnection]:
    gc.collect()
    return [
        conn
        for conn in gc.get_objects()
        if isinstance(conn, AIOKafkaConnection)
        and getattr(conn._on_close_cb, "__self__", None) is client
        and conn.connected()
    ]


async def test_a_connection_opened_while_the_producer_stops_is_closed(
    kafka_bootstrap: str,
) -> None:
    keeper = ProducerKeeper(RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap))
    assert await keeper.start(anyio.Event())
    producer = keeper._producer
    assert producer is not None
    client = producer.client
    node_id = next(iter(client.cluster.brokers())).nodeId
    # A second connection group to the same broker: not open yet, so this call dials.
    opening = asyncio.create_task(client._get_conn(node_id, group=ConnectionGroup.COORDINATION))
    await asyncio.sleep(0)  # the dial has begun
    await keeper.stop()
    await opening
    await asyncio.sleep(0.1)  # whatever the stop scheduled has run
    leftover = _open_connections_of(client)
    for conn in leftover:  # do not leak into the rest of the run either way
        conn.close()
    assert leftover == []


async def test_the_connection_tracker_holds_each_connection_once(kafka_bootstrap: str) -> None:
    """Every request asks the client for its connection; the tracker must not grow with them."""
    keeper = ProducerKeeper(RelayConfig(database_url=None, kafka_bootstrap=kafka_bootstrap))
    assert await keeper.start(anyio.Event())
    producer = keeper._producer
    tracker = keeper._reset
    assert producer is not None and tracker is not None
    node_id = next(iter(producer.client.cluster.brokers())).nodeId
    try:
        for _ in range(50):
            assert await producer.client._get_conn(node_id) is not None
        assert len(tracker._conns) == len({id(c) for c in tracker._conns}) <= 2
    finally:
        await keeper.stop()
