"""What one round trip costs a client process on this machine, the floor under the relay's
CPU per event at a steady rate.

At 1,000 events/s the relay's batches hold two or three events: each event pays a share of
a fetch, a produce request and a recording statement, and a notification of its own. This
measures each of those round trips bare, in a process of its own on the relay's event loop
(uvloop where installed) and connecting as the relay does (the same URL, so the same TLS):

- ``postgres_round_trip_us``: a prepared one-row ``SELECT`` and its answer;
- ``produce_us``: one 1 KiB record sent and acknowledged by the benchmarks' baseline
  producer (bench/peers/subjects.py ``raw_producer``: the relay's producer settings);
- ``notification_us``: one ``NOTIFY`` received by a listening connection (the CPU of
  notifying and receiving, less that of notifying alone).

Each is measured twice: back to back, and paced (``--pace-ms``: one call per interval, the
relay's interval between fetches in the window; the CPU of the pacing sleep alone taken
off). A process woken a few hundred times a second pays more per round trip than one kept
busy (its caches go cold between calls, each answer wakes it from idle), and that is the
cadence the relay runs at. ``cpu_per_event`` prints the relay's CPU per event over both
floors times its statement counts, measured in the same run: the share of the relay's cost
that is its own work rather than the round trips' that no client avoids.

    python -m bench.round_trip_floor --topic T [--calls 2000] [--pace-ms 2.5]
        # prints one JSON object
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from bench.database_stats import FETCH_STATEMENT, RECORD_STATEMENT
from bench.peers.subjects import raw_producer
from outbox_relay.runtime import event_loop_factory

WARMUP_CALLS = 200
PAYLOAD = b"x" * 1024


PACED_SECONDS = 5.0  # a paced measurement's length: fewer calls when the pace is slow


async def _cpu_per_call(
    call: Callable[[int], Awaitable[object]], calls: int, pace_s: float = 0.0
) -> float:
    """The process's CPU seconds per call of ``call``, awaited one at a time; with
    ``pace_s``, one call per ``pace_s``, less the CPU of sleeping at that pace alone."""
    for i in range(WARMUP_CALLS):
        await call(i)
    calls = paced_calls(calls, pace_s)
    began = time.process_time()
    for i in range(calls):
        await call(i)
        if pace_s:
            await asyncio.sleep(pace_s)
    used = (time.process_time() - began) / calls
    return max(used - await _sleeping_cpu(calls, pace_s), 0.0) if pace_s else used


def paced_calls(calls: int, pace_s: float) -> int:
    """How many calls a measurement makes: ``calls`` back to back (``pace_s`` 0) or at a
    fast pace, fewer to stay near :data:`PACED_SECONDS` at a slow one (never below 100)."""
    if not pace_s:
        return calls
    return max(min(calls, int(PACED_SECONDS / pace_s)), 100)


async def _sleeping_cpu(calls: int, pace_s: float) -> float:
    """The CPU seconds of one ``asyncio.sleep(pace_s)`` and the wake-up after it."""
    began = time.process_time()
    for _ in range(calls):
        await asyncio.sleep(pace_s)
    return (time.process_time() - began) / calls


async def postgres_round_trip(url: str, calls: int, pace_s: float = 0.0) -> float:
    conn = await asyncpg.connect(url)
    try:
        statement = await conn.prepare("SELECT $1::bigint")
        return await _cpu_per_call(statement.fetchval, calls, pace_s)
    finally:
        await conn.close()


async def produce(bootstrap: str, topic: str, calls: int, pace_s: float = 0.0) -> float:
    producer = raw_producer(bootstrap)
    await producer.start()
    try:

        async def send(i: int) -> object:
            return await producer.send_and_wait(
                topic, PAYLOAD, key=f"key-{i % 1000}".encode(), headers=[("id", b"0" * 36)]
            )

        return await _cpu_per_call(send, calls, pace_s)
    finally:
        await producer.stop()


async def notification(url: str, calls: int, pace_s: float = 0.0) -> float:
    """CPU of notifying and receiving, less that of notifying with nobody listening."""
    channel = f"floor_{uuid.uuid4().hex[:8]}"
    notifier = await asyncpg.connect(url)
    listener = await asyncpg.connect(url)
    try:
        notify = await notifier.prepare("SELECT pg_notify($1, $2)")
        alone = await _cpu_per_call(lambda i: notify.fetchval(channel, str(i)), calls, pace_s)
        received = 0
        arrived = asyncio.Event()

        def on_notify(*_: object) -> None:
            nonlocal received
            received += 1
            arrived.set()

        await listener.add_listener(channel, on_notify)

        async def notified(i: int) -> None:
            arrived.clear()
            await notify.fetchval(channel, str(i))
            await arrived.wait()

        both = await _cpu_per_call(notified, calls, pace_s)
        sent = paced_calls(calls, pace_s) + WARMUP_CALLS
        if received != sent:
            raise RuntimeError(f"{received} notifications received of {sent}")
        return max(both - alone, 0.0)
    finally:
        await listener.close()
        await notifier.close()


async def measure(
    url: str, bootstrap: str, topic: str, calls: int, pace_s: float = 0.0
) -> dict[str, Any]:
    """Each round trip's CPU in µs, back to back; with ``pace_s``, also paced (``paced``)."""
    figures = await _round_trips(url, bootstrap, topic, calls, 0.0)
    if pace_s:
        figures["paced"] = {
            **await _round_trips(url, bootstrap, topic, calls, pace_s),
            "pace_ms": round(pace_s * 1000, 2),
        }
    return figures


async def _round_trips(
    url: str, bootstrap: str, topic: str, calls: int, pace_s: float
) -> dict[str, Any]:
    us = 1e6
    return {
        "postgres_round_trip_us": round(await postgres_round_trip(url, calls, pace_s) * us, 1),
        "produce_us": round(await produce(bootstrap, topic, calls, pace_s) * us, 1),
        "notification_us": round(await notification(url, calls, pace_s) * us, 1),
        "calls": paced_calls(calls, pace_s),
    }


def floor_per_event(floor: dict[str, Any], calls_per_event: dict[str, float]) -> float:
    """The round trips' CPU per event at a relay's statement counts per event: a fetch and a
    produce request per fetch that found rows, a recording statement, a notification each."""
    fetches = calls_per_event.get(FETCH_STATEMENT, 0.0)
    records = calls_per_event.get(RECORD_STATEMENT, 0.0)
    return round(
        (fetches + records) * floor["postgres_round_trip_us"]
        + min(fetches, 1.0) * floor["produce_us"]
        + floor["notification_us"],
        1,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--topic", required=True, help="an existing topic to produce to")
    parser.add_argument(
        "--pace-ms", type=float, default=0.0, help="also measure one call per this interval"
    )
    args = parser.parse_args(argv)
    url, bootstrap = os.environ.get("DATABASE_URL"), os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not url or not bootstrap:
        print(
            "bench.round_trip_floor: DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are needed",
            file=sys.stderr,
        )
        return 2
    if args.calls < 1:
        parser.error("--calls must be positive")
    if args.pace_ms < 0:
        parser.error("--pace-ms must not be negative")
    runner = asyncio.Runner(loop_factory=event_loop_factory())
    with runner:
        print(
            json.dumps(
                runner.run(measure(url, bootstrap, args.topic, args.calls, args.pace_ms / 1000))
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
