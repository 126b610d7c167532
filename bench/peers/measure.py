"""What the broker saw, read the same way for every system under comparison.

Every topic is created with ``message.timestamp.type=LogAppendTime``: the broker stamps each
batch with the moment it appended it, which (acks=all, one broker) is the moment it
acknowledged it. The catch-up rate is the number of events over the time between the first
and the last append; the latency is an event's append time minus the moment its writer's
COMMIT returned (or, for the raw producer, the moment ``send()`` was called), matched by the
``id`` header that the relay, Debezium's EventRouter and the raw producer all write.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

PARTITIONS = 6
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


async def create_topic(bootstrap: str, topic: str) -> None:
    """A 6-partition topic stamped with the broker's append time."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    topic,
                    PARTITIONS,
                    1,
                    topic_configs={"message.timestamp.type": "LogAppendTime"},
                )
            ]
        )
    finally:
        await admin.close()


def _partitions(topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p) for p in range(PARTITIONS)]


async def wait_for_count(
    bootstrap: str, topic: str, count: int, *, timeout: float, alive: object = None
) -> float:
    """Poll the end offsets until ``count`` records are on the topic; the monotonic time then."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            ends = await consumer.end_offsets(_partitions(topic))
            now = time.monotonic()
            if sum(ends.values()) >= count:
                return now
            if now > deadline:
                raise TimeoutError(f"{sum(ends.values())} of {count} records after {timeout:.0f} s")
            if callable(alive) and not alive():
                raise RuntimeError("the system under test exited before it had published all")
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def _timestamp_at(consumer: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> int:
    consumer.assign([tp])
    consumer.seek(tp, offset)
    record = await asyncio.wait_for(consumer.getone(tp), timeout=30)
    return int(record.timestamp)


async def append_span_ms(bootstrap: str, topic: str) -> tuple[int, int]:
    """The broker's first and last append times (unix ms) over the whole topic."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_partition_fetch_bytes=65536
    )
    await consumer.start()
    try:
        tps = _partitions(topic)
        starts = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        firsts, lasts = [], []
        for tp in tps:
            if ends[tp] > starts[tp]:
                firsts.append(await _timestamp_at(consumer, tp, starts[tp]))
                lasts.append(await _timestamp_at(consumer, tp, ends[tp] - 1))
        return min(firsts), max(lasts)
    finally:
        await consumer.stop()


async def append_times_by_id(bootstrap: str, topic: str, *, timeout: float) -> dict[str, int]:
    """Every record's ``id`` header mapped to its append time (unix ms), whole topic."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = _partitions(topic)
        ends = await consumer.end_offsets(tps)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen: dict[str, int] = {}
        remaining = {tp: end for tp, end in ends.items() if end > 0}
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for tp, records in batch.items():
                for record in records:
                    headers = dict(record.headers)
                    if "id" in headers:
                        seen[headers["id"].decode()] = int(record.timestamp)
                    if record.offset + 1 >= remaining.get(tp, 0):
                        remaining.pop(tp, None)
        return seen
    finally:
        await consumer.stop()


@dataclass(frozen=True)
class LatencySummary:
    """Percentiles of commit → broker append, in milliseconds."""

    count: int
    p50: float
    p90: float
    p99: float
    p999: float
    max: float
    mean: float


def percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    rank = max(1, math.ceil(len(sorted_values) * pct / 100))
    return sorted_values[rank - 1]


def summarize(latencies_ms: list[float]) -> LatencySummary:
    """The percentiles the report compares."""
    ordered = sorted(latencies_ms)
    return LatencySummary(
        count=len(ordered),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p99=percentile(ordered, 99),
        p999=percentile(ordered, 99.9),
        max=ordered[-1],
        mean=statistics.fmean(ordered),
    )


def latencies_ms(sent_at: dict[str, float], appended_ms: dict[str, int]) -> list[float]:
    """Append time minus send/commit time, for each event both sides know."""
    return [appended_ms[i] - sent * 1000 for i, sent in sent_at.items() if i in appended_ms]


# -- where the CPU goes -----------------------------------------------------------------------
# Every system shares the machine's cores with PostgreSQL and the broker. CPU seconds per
# process (user + system, from /proc) over the catch-up tell what each event costs each of
# them: the relay and Debezium pay PostgreSQL for reading and recording every row, the raw
# producer does not.


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU the processes have used so far; a gone process counts 0."""
    ticks = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _processes() -> Iterable[tuple[int, str, str]]:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm", encoding="utf-8", errors="replace") as comm:
                name = comm.read().strip()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(entry), name, args


def service_pids() -> dict[str, list[int]]:
    """The PostgreSQL server processes (every backend, by process name) and the broker's JVM
    (the java process running ``kafka.Kafka``; a Connect worker runs another class)."""
    postgres: list[int] = []
    broker: list[int] = []
    for pid, name, args in _processes():
        if name == "postgres":
            postgres.append(pid)
        elif name == "java" and " kafka.Kafka " in f" {args} ":
            broker.append(pid)
    return {"postgres": postgres, "broker": broker}


@dataclass
class CpuMeter:
    """CPU used by a client process, PostgreSQL and the broker from :meth:`start` on."""

    client_pid: int | None
    _pids: dict[str, list[int]] | None = None
    _before: dict[str, float] | None = None

    def _now(self) -> dict[str, float]:
        assert self._pids is not None
        return {name: cpu_seconds(pids) for name, pids in self._pids.items()}

    def start(self) -> None:
        """Take the processes running now (PostgreSQL's included) and their CPU so far."""
        self._pids = {
            "client": [self.client_pid] if self.client_pid else [],
            **service_pids(),
        }
        self._before = self._now()

    def per_event_us(self, events: int) -> dict[str, float]:
        """Microseconds of CPU per event since :meth:`start`, per process group."""
        assert self._before is not None
        after = self._now()
        return {
            f"{name}_cpu_us_per_event": (after[name] - self._before[name]) * 1e6 / max(events, 1)
            for name in after
        }
