"""Per-key order through hand-overs, stalled broker paths and broker rejections.

Real PostgreSQL, the real broker and relays as processes. Each relay reaches Kafka through
its own fault proxy (a broker listener advertises the proxy's address, so every request
of that relay passes it), which lets a test stall one relay's path while its database
connection stays healthy. Every scenario first proves its fault happened, then drains
everything, reads the topic as a default consumer does and checks each key: first
occurrences (by ``id``) in commit order, and the last record is the latest committed event.

Each scenario failed on the relay before per-key order was held under faults (the comment
above it says how: the order the topic read); relay/producer_reset.py and the publisher's per-partition hand-over
are what make them pass (docs/relay.md, "Guarantees and their limits").
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.faults.lanes import (
    key_in_lanes,
    lane_of,
    lane_owner,
    lanes_held,
    published_versions,
    unpublished,
)
from tests.support.faultproxy import FaultProxy
from tests.support.kafka import create_topics, kafka_admin, read_topic
from tests.support.order import Writer, assert_per_key_order
from tests.support.processes import RelayProcess, Relays, redrive_all
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


class DrainOverrun(AssertionError):
    """A stopping relay outlived its drain timeout."""


SEND_TIMEOUT_S = 3.0  # FAST_RELAY's send (and Kafka request) timeout
LOWER_LANES = range(32)  # an instance keeps these when a second one joins
UPPER_LANES = range(32, 64)  # and hands these over


async def _started(db: asyncpg.Connection, relay: RelayProcess, lanes: int = 64) -> None:
    await wait_until(
        lambda: lanes_held(db, relay.name),
        timeout=30,
        what=f"relay {relay.name} holds lanes",
    )
    if lanes:
        await wait_until(
            lambda: _holds(db, relay.name, lanes),
            timeout=30,
            what=f"relay {relay.name} holds {lanes} lanes",
        )


async def _holds(db: asyncpg.Connection, owner: str, lanes: int) -> bool:
    return await lanes_held(db, owner) == lanes


async def _drained(db: asyncpg.Connection, *, timeout: float = 30) -> None:
    await wait_until(
        lambda: _nothing_left(db), timeout=timeout, what="every event published", interval=0.1
    )


async def _nothing_left(db: asyncpg.Connection) -> bool:
    return await unpublished(db) == 0


async def _published(db: asyncpg.Connection, key: str, count: int) -> bool:
    return await published_versions(db, key) >= count


async def _warm_up(db: asyncpg.Connection, writer: Writer, *events: tuple[str, str]) -> None:
    """Publish through the healthy path first: producers connected, topics known."""
    await writer.commit(*events)
    await _drained(db)


async def _set_max_message_bytes(bootstrap: str, topic: str, value: int) -> None:
    async with kafka_admin(bootstrap) as admin:
        resource = ConfigResource(
            ConfigResourceType.TOPIC, topic, configs={"max.message.bytes": str(value)}
        )
        await admin.alter_configs([resource])

        async def applied() -> bool:
            [response] = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)]
            )
            entries = response.resources[0][4]
            return any(e[0] == "max.message.bytes" and e[1] == str(value) for e in entries)

        await wait_until(applied, timeout=15, what=f"max.message.bytes={value} on {topic}")


def _report(label: str, relay: RelayProcess) -> None:
    """What the relay said about the fault; shown with ``-s`` or on failure."""
    for entry in relay.logs():
        if entry.get("level") in ("warning", "error"):
            print(f"[{label}] {entry.get('msg')} {_extras(entry)}")


def _extras(entry: dict[str, object]) -> str:
    skip = {"ts", "level", "logger", "msg"}
    return " ".join(f"{k}={v}" for k, v in entry.items() if k not in skip)


async def _check_key_order(
    db: asyncpg.Connection, bootstrap: str, writer: Writer, key: str, *relays: RelayProcess
) -> None:
    """Drain, show what the relays said, then check every key of ``key``'s topic."""
    await _drained(db)
    for relay in relays:
        _report(relay.name, relay)
    topic = writer.topics[key]
    observed = assert_per_key_order(await read_topic(bootstrap, topic), writer.committed_on(topic))
    print(f"observed {observed}")


async def _too_large_in_quarantine(db: asyncpg.Connection, key: str) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM outbox WHERE aggregateid = $1 "
            "AND quarantined_at IS NOT NULL AND last_error_class = 'record_too_large'",
            key,
        )
    )


async def _raise_limit_and_redrive(bootstrap: str, topic: str, database_url: str) -> str:
    """The operator's fix: a topic limit that fits, then ``outbox-relay redrive --all``."""
    await _set_max_message_bytes(bootstrap, topic, 1_048_576)
    return redrive_all(database_url)


# -- 1 ----------------------------------------------------------------------------------------------
# Broke before order was held under faults: a lane is handed over while the old owner is still inside the
# producer's submit (metadata wait), so its stale copies of r1, r2 land after the new owner's
# r1, r2, r3
# (the topic read 1, 2, 3, 1, 2.)
async def test_hand_over_during_a_slow_send_keeps_key_order(
    db: asyncpg.Connection,
    kafka_bootstrap: str,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path_a, path_b = kafka_proxies[0], kafka_proxies[1]
    # A metadata wait lasts up to the send timeout; make it long enough for a hand-over.
    slow = {"OUTBOX_RELAY_SEND_TIMEOUT_MS": "15000", "OUTBOX_RELAY_LEASE_TTL_MS": "17000"}
    a = relays.start("a", path_a.listen, **slow)
    await _started(db, a)
    await _warm_up(db, writer, ("warmup", "w"))
    key = await key_in_lanes(db, "order-", UPPER_LANES)
    lane = await lane_of(db, key)
    _, fence_a = await lane_owner(db, lane)

    path_a.stall()
    await writer.commit(("orders", key), ("orders", key))  # r1, r2
    # The fault, first half: A fetched r1, r2 and asks the broker about their new topic on
    # its stalled path; it is inside the submit, nothing of the key is published yet.
    await path_a.until(lambda c: c.held_up > 0, timeout=10)
    assert await unpublished(db, key) == 2
    assert (await lane_owner(db, lane))[0] == "a"
    b = relays.start("b", path_b.listen, **slow)
    await wait_until(
        lambda: _published(db, key, 2), timeout=60, what="r1 and r2 published by another path"
    )
    await writer.commit(("orders", key))  # r3
    await wait_until(lambda: _published(db, key, 3), timeout=30, what="r3 published")

    # The second half: the lane changed owner while A's path was still stalled and A still
    # ran. (Whether A still held the key's records then is what a fix decides; today it
    # did, and the held bytes show it.)
    owner, fence = await lane_owner(db, lane)
    assert (owner, fence > fence_a) == ("b", True)
    assert a.process.poll() is None
    print(f"A's path at the hand-over: {path_a.counters()}")

    path_a.heal()
    await asyncio.sleep(3)  # whatever A still had now reaches the broker
    await _check_key_order(db, kafka_bootstrap, writer, key, a, b)


# -- 2 ----------------------------------------------------------------------------------------------
# Broke before order was held under faults: on SIGTERM a relay with a stalled broker path hands its lanes
# back while its producer still holds a batch it gave up on; that stale copy lands after the
# next owner's newer events once the path heals
# (the topic read 1, 2, 3, 2.)
async def test_stalled_path_then_sigterm_keeps_key_order(
    db: asyncpg.Connection,
    kafka_bootstrap: str,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path_a, path_b = kafka_proxies[0], kafka_proxies[1]
    a = relays.start("a", path_a.listen)
    await _started(db, a)
    b = relays.start("b", path_b.listen)
    await _started(db, b, lanes=32)
    await _started(db, a, lanes=32)
    key = await key_in_lanes(db, "order-", LOWER_LANES)  # A's
    other = await key_in_lanes(db, "order-", UPPER_LANES)  # B's
    lane = await lane_of(db, key)
    assert (await lane_owner(db, lane))[0] == "a"
    await _warm_up(db, writer, ("orders", key), ("orders", other))  # r1 through A

    path_a.stall()
    await writer.commit(("orders", key))  # r2
    # The fault, first half: A sent r2 into its stalled path and gives up on it (the
    # failure is recorded) while its database connection stays healthy.
    await path_a.until(lambda c: c.held_up > 0, timeout=10)
    await wait_until(
        lambda: db.fetchval(
            "SELECT last_error_class IS NOT NULL FROM outbox WHERE aggregateid = $1", key
        ),
        timeout=20,
        what="A recorded the stalled batch as failed",
    )
    a.terminate()
    await wait_until(lambda: _owned_by(db, lane, "b"), timeout=20, what="B took over A's lane")
    await wait_until(lambda: _published(db, key, 2), timeout=30, what="r2 published by B")
    await writer.commit(("orders", key))  # r3
    await wait_until(lambda: _published(db, key, 3), timeout=30, what="r3 published by B")
    # The fault, second half: the lane changed owner before A's path healed. (Whether
    # anything A sent is still on that path now is what a fix decides; today it is.)
    assert (await lane_owner(db, lane))[0] == "b"
    print(f"A's path after the hand-over: {path_a.counters()}")
    exited_stalled = await a.exited_within(0)

    path_a.heal()
    exited = await a.exited_within(40)
    print(f"A exited {exited_stalled or exited} s after SIGTERM (drain timeout 3 s)")
    await asyncio.sleep(2)  # what the healed path carried reaches the log
    await _check_key_order(db, kafka_bootstrap, writer, key, a)


async def _owned_by(db: asyncpg.Connection, lane: int, owner: str) -> bool:
    return (await lane_owner(db, lane))[0] == owner


# -- 3 ----------------------------------------------------------------------------------------------
# Broke before order was held under faults: the broker rejects r1 (larger than the topic's
# max.message.bytes) on the producer's first write while r2, r3 of the key are already
# pipelined; they are published and r1 follows after the fix and redrive
# (the topic read 2, 3, 1.)
async def test_broker_rejection_with_later_records_pipelined_keeps_key_order(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    relays: Relays,
    writer: Writer,
) -> None:
    topic = f"{topic_namespace}.orders"
    await create_topics(kafka_bootstrap, [topic], configs={"max.message.bytes": "4096"})
    key = "order-1"
    await writer.commit(("orders", key, 8000))  # r1: over the topic's limit, under the relay's
    await writer.commit(("orders", key))  # r2
    await writer.commit(("orders", key))  # r3
    # One row per batch, three batches in flight, and a linger so all three are in the
    # producer before the first request leaves: r2 and r3 are pipelined behind r1.
    relay = relays.start(
        "a",
        kafka_bootstrap,
        OUTBOX_RELAY_BATCH_SIZE="1",
        OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES="3",
        OUTBOX_RELAY_LINGER_MS="300",
        OUTBOX_RELAY_MAX_ATTEMPTS="1",
    )
    # The fault: the broker rejected r1 as too large and it went to quarantine.
    await wait_until(
        lambda: _too_large_in_quarantine(db, key),
        timeout=30,
        what="r1 rejected by the broker and quarantined",
    )
    assert await _too_large_in_quarantine(db, key) == 1
    # The quarantine commits before the relay logs it: wait for the line, do not race it.
    await wait_until(
        lambda: relay.logged("events quarantined"), timeout=10, what="the quarantine logged"
    )
    await asyncio.sleep(1)  # whatever else the relay would do with the key, it does now

    redriven = await _raise_limit_and_redrive(kafka_bootstrap, topic, database_url)
    assert "returned 1 quarantined event" in redriven
    await _check_key_order(db, kafka_bootstrap, writer, key, relay)


# -- 4 ----------------------------------------------------------------------------------------------
# Broke before order was held under faults: inside one multi-topic submit r1's metadata lookup fails, but
# r2 of the same key (a later lookup) still goes out; r1 follows on retry
# (the topic read 2, 1.)
async def test_failure_inside_a_multi_partition_submit_keeps_key_order(
    db: asyncpg.Connection,
    kafka_bootstrap: str,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path_a = kafka_proxies[0]
    a = relays.start("a", path_a.listen)
    await _started(db, a)
    await _warm_up(db, writer, ("warmup", "w"))

    path_a.stall()
    # One transaction, one fetch, one submit over two new topics: r1, x1, r2.
    await writer.commit(("orders", "order-1"), ("audit", "audit-1"), ("orders", "order-1"))
    # A asks the broker about r1's topic; the request is held.
    await path_a.until(lambda c: c.held_up > 0, timeout=10)
    first_asked = time.monotonic()
    await asyncio.sleep(0.2)
    first_request = path_a.counters().held_up
    # The fault: that lookup times out (the send timeout) and fails r1; the next record's
    # topic is looked up with a second request. The path heals before that one times out.
    await path_a.until(lambda c: c.held_up > first_request, timeout=15)
    assert time.monotonic() - first_asked >= SEND_TIMEOUT_S * 0.9
    path_a.heal()
    await _drained(db)
    assert a.logged("publish failed"), "A recorded no failed publish"
    await _check_key_order(db, kafka_bootstrap, writer, "order-1", a)


# Broke before order was held under faults: one submit puts a key's rows into two batches of one
# partition; the broker rejects the first (larger than the topic's max.message.bytes) and
# accepts the second, so the later events come first
# (the topic read 13, 14, 1, ..., 12.)
# The relay now sizes batches to each topic's limit, so the broker refuses a batch only when
# the limit drops below what the relay read: the test lowers it while the relay runs.
async def test_rejected_partition_batch_inside_one_submit_keeps_key_order(
    db: asyncpg.Connection,
    kafka_bootstrap: str,
    topic_namespace: str,
    relays: Relays,
    writer: Writer,
) -> None:
    topic = f"{topic_namespace}.orders"
    await create_topics(kafka_bootstrap, [topic], configs={"max.message.bytes": "1000000"})
    relay = relays.start("a", kafka_bootstrap, OUTBOX_RELAY_MAX_ATTEMPTS="1")
    await writer.commit(("orders", "warm-up"))
    await _drained(db)  # the relay has read the topic's limit: batches up to 256 KiB
    await _set_max_message_bytes(kafka_bootstrap, topic, 150_000)
    key = "order-1"
    # One commit, so the 14 rows come in one fetch: about 280 KB, a full partition batch
    # (built at the old limit) and a second one.
    await writer.commit(*[("orders", key, 20_000)] * 14)
    await _check_key_order(db, kafka_bootstrap, writer, key, relay)
    # The fault: the broker refused a partition batch of the key as too large (every record
    # fits the topic; the batch built at the old limit did not).
    refused = [
        e for e in relay.logged("publish failed") if e.get("error_class") == "batch_too_large"
    ]
    assert refused, "the broker refused no batch as too large"
    assert await _too_large_in_quarantine(db, key) == 0


# -- 5 ----------------------------------------------------------------------------------------------
DRAIN_TIMEOUT_S = 3.0
EXIT_MARGIN_S = 2.0


# Broke before order was held under faults: with a stalled broker path the producer's flush on stop has no
# bound, so SIGTERM outlives --drain-timeout-ms
# (the relay was still running 12 s after SIGTERM with a 3 s drain timeout.)
async def test_sigterm_under_a_stalled_path_exits_within_the_drain_timeout(
    db: asyncpg.Connection,
    kafka_proxies: list[FaultProxy],
    relays: Relays,
    writer: Writer,
) -> None:
    path_a = kafka_proxies[0]
    a = relays.start(
        "a", path_a.listen, OUTBOX_RELAY_DRAIN_TIMEOUT_MS=str(int(DRAIN_TIMEOUT_S * 1000))
    )
    await _started(db, a)
    await _warm_up(db, writer, ("orders", "order-1"))
    path_a.stall()
    await writer.commit(("orders", "order-1"))
    await path_a.until(lambda c: c.held_up > 0, timeout=10)  # the fault: a send is stuck
    a.terminate()
    exited = await a.exited_within(DRAIN_TIMEOUT_S + EXIT_MARGIN_S)
    if exited is not None:
        assert a.process.returncode == 0
        return
    # Where it hangs shows in the lanes: still held (the drain) or handed back (the close).
    lanes_kept = await lanes_held(db, "a")
    stalled_for = 12.0
    later = await a.exited_within(stalled_for)
    path_a.heal()
    healed = later or await a.exited_within(stalled_for + 20)
    raise DrainOverrun(
        f"still running {DRAIN_TIMEOUT_S + EXIT_MARGIN_S} s after SIGTERM "
        f"(drain timeout {DRAIN_TIMEOUT_S} s) holding {lanes_kept} lanes; "
        + (
            f"exited after {later:.1f} s"
            if later is not None
            else f"still running after {stalled_for} s of stall; exited {healed} s after "
            f"SIGTERM once the path healed"
        )
    )


async def test_sigterm_with_nothing_in_flight_exits_without_waiting_for_the_drain_time(
    db: asyncpg.Connection, kafka_bootstrap: str, relays: Relays, writer: Writer
) -> None:
    # The drain time bounds a drain; a relay with nothing to drain must not sit it out.
    a = relays.start("a", kafka_bootstrap, OUTBOX_RELAY_DRAIN_TIMEOUT_MS="20000")
    await _started(db, a)
    await writer.commit(("orders", "order-1"))
    await _drained(db)
    a.terminate()
    exited = await a.exited_within(20.0)
    assert exited is not None, "still running 20 s after SIGTERM"
    assert exited < 5.0, f"an idle relay took {exited:.1f} s to stop (drain timeout 20 s)"
    assert a.process.returncode == 0
