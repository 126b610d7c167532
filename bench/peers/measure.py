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
import functools
import hashlib
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import UnknownTopicOrPartitionError, for_code

from scripts.services.host import command_line, pid_listening_on

PARTITIONS = 6
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


async def create_topic(
    bootstrap: str,
    topic: str,
    *,
    partitions: int = PARTITIONS,
    log_append_time: bool = True,
    ready_timeout: float = 30.0,
) -> None:
    """A topic (6 partitions), stamped with the broker's append time unless told otherwise,
    returned once the broker's metadata gives every partition a leader: a system started
    earlier would find the topic unknown and publish nothing. Every run names its topics
    afresh, so a topic already there is an error like any other the broker answers."""
    configs = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics(
            [NewTopic(topic, partitions, 1, topic_configs=configs)]
        )
        for name, code, *message in response.topic_errors:
            if code != 0:
                said = f": {message[0]}" if message and message[0] else ""
                raise RuntimeError(
                    f"the broker did not create {name} ({for_code(code).__name__},"
                    f" error {code}{said})"
                )
        await _wait_for_leaders(admin, topic, partitions, ready_timeout)
    finally:
        await admin.close()


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, topic: str, partitions: int, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        (described,) = await admin.describe_topics([topic])
        led = [p for p in described["partitions"] if p["error_code"] == 0 and p["leader"] >= 0]
        if described["error_code"] == 0 and len(led) == partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{topic}: {len(led)} of {partitions} partitions have a leader in the"
                f" broker's metadata {timeout:.0f} s after it was created"
            )
        await asyncio.sleep(0.05)


async def delete_topics(bootstrap: str, topics: list[str]) -> None:
    """Delete what a measurement wrote: a 200,000-event drain leaves 250 MB on the broker,
    and a development broker stopped uncleanly loads every partition it holds before it
    answers again. A topic already gone is not an error."""
    if not topics:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        response = await admin.delete_topics(topics)
    finally:
        await admin.close()
    failed = [
        f"{name} (error {code})"
        for name, code in response.topic_error_codes
        if code not in (0, UnknownTopicOrPartitionError.errno)
    ]
    if failed:
        raise RuntimeError(f"the broker did not delete {', '.join(failed)}")


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


async def records_on(bootstrap: str, topic: str) -> int:
    """The records on the topic now: its end offsets summed, exactly (wait_for_count
    polls for at least a count)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        return sum((await consumer.end_offsets(_partitions(topic))).values())
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
#
# PostgreSQL's share is split by process kind, from each process's title: the backends
# (the connections doing the statements), the WAL writer, the I/O workers (PostgreSQL 18's
# io_method=worker), autovacuum, the checkpointer and background writer, a walsender
# (Debezium's replication stream). A process that starts inside the window (an autovacuum
# worker, a new connection) counts from its start; one that ends inside it counts through
# its postmaster, which reaps it and gains its CPU as children's time ("ended").

PG_KINDS = (
    "backends",
    "walwriter",
    "io_workers",
    "autovacuum",
    "writers",
    "walsender",
    "ended",
    "other",
)
_PG_AUXILIARY = (
    ("walwriter", "walwriter"),
    ("io worker", "io_workers"),
    ("autovacuum", "autovacuum"),
    ("checkpointer", "writers"),
    ("background writer", "writers"),
    ("walsender", "walsender"),
    ("logical replication", "other"),
    ("archiver", "other"),
    ("startup", "other"),
    ("walreceiver", "other"),
    ("walsummarizer", "other"),
    ("slotsync", "other"),
)


@dataclass(frozen=True)
class ProcessCpu:
    """One process's CPU so far, its own and that of the children it has reaped."""

    parent: int
    own: float
    reaped: float


def process_cpu(pid: int) -> ProcessCpu | None:
    """A process's CPU seconds so far from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    return ProcessCpu(
        parent=int(fields[1]),
        own=(int(fields[11]) + int(fields[12])) / tick,
        reaped=(int(fields[13]) + int(fields[14])) / tick,
    )


def cpu_seconds(pids: Iterable[int]) -> float:
    """User plus system CPU the processes have used so far; a gone process counts 0."""
    return sum(cpu.own for pid in pids if (cpu := process_cpu(pid)) is not None)


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


def postgres_kind(title: str) -> str:
    """The kind of a PostgreSQL process from its title ("postgres: 15/main: walwriter",
    "postgres: io worker 1", "postgres: outbox outbox 127.0.0.1(5432) idle"); the postmaster
    (its command line, not a title) is "other"."""
    if not title.startswith("postgres: "):
        return "other"
    rest = title.removeprefix("postgres: ")
    head, _, tail = rest.partition(": ")
    if tail and "/" in head and " " not in head:  # Debian's "15/main: " cluster prefix
        rest = tail
    for prefix, kind in _PG_AUXILIARY:
        if rest.startswith(prefix):
            return kind
    return "backends"


def broker_pid(bootstrap: str) -> int | None:
    """The broker process listening on ``bootstrap`` (its first address): found by the
    address it was given, so another broker on the machine is never mistaken for it. None
    when it is not a process here (a container elsewhere)."""
    pid = pid_listening_on(bootstrap.split(",", 1)[0].strip())
    return pid if pid is not None and " kafka.Kafka " in f" {command_line(pid)} " else None


@dataclass(frozen=True)
class PostgresSnapshot:
    """Every PostgreSQL process on the machine at one moment: its kind and its CPU."""

    kinds: dict[int, str]
    cpu: dict[int, ProcessCpu]

    def postmasters(self) -> list[int]:
        """The processes whose parent is not PostgreSQL's: they reap the others."""
        return [pid for pid, cpu in self.cpu.items() if cpu.parent not in self.cpu]


def postgres_cpu_split(before: PostgresSnapshot, after: PostgresSnapshot) -> dict[str, float]:
    """PostgreSQL's CPU seconds between two snapshots, by process kind."""
    split = dict.fromkeys(PG_KINDS, 0.0)
    for pid, now in after.cpu.items():
        was = before.cpu.get(pid)
        # a pid first seen now started inside the window: all its CPU is the window's
        split[after.kinds[pid]] += now.own - (was.own if was else 0.0)
    ended = [pid for pid in before.cpu if pid not in after.cpu]
    reaped = sum(
        after.cpu[pid].reaped - before.cpu[pid].reaped
        for pid in before.postmasters()
        if pid in after.cpu
    )
    # a reaped child's whole life is in its postmaster's children's time; the part it had
    # used before the window is not the window's
    split["ended"] = max(reaped - sum(before.cpu[pid].own for pid in ended), 0.0)
    return split


def postgres_snapshot() -> PostgresSnapshot:
    """PostgreSQL's processes (every cluster on the machine) and their CPU, read now."""
    kinds: dict[int, str] = {}
    cpu: dict[int, ProcessCpu] = {}
    for pid, name, args in _processes():
        if name == "postgres" and (now := process_cpu(pid)) is not None:
            kinds[pid] = postgres_kind(args.strip())
            cpu[pid] = now
    return PostgresSnapshot(kinds, cpu)


@dataclass
class CpuMeter:
    """CPU used by a client process, PostgreSQL and the broker behind ``bootstrap`` from
    :meth:`start` on."""

    client_pid: int | None
    bootstrap: str | None = None
    _broker: list[int] | None = None
    _before: dict[str, float] | None = None
    _postgres: PostgresSnapshot | None = None

    def _now(self) -> dict[str, float]:
        assert self._broker is not None
        return {
            "client": cpu_seconds([self.client_pid] if self.client_pid else []),
            "broker": cpu_seconds(self._broker),
        }

    def start(self) -> None:
        """Take the broker's process and the CPU so far of it, the client and PostgreSQL's."""
        broker = broker_pid(self.bootstrap) if self.bootstrap else None
        self._broker = [broker] if broker else []
        self._before = self._now()
        self._postgres = postgres_snapshot()

    def per_event_us(self, events: int) -> dict[str, float]:
        """Microseconds of CPU per event since :meth:`start`, per process group, and
        PostgreSQL's by process kind (``pg_<kind>``; they add up to ``postgres``)."""
        assert self._before is not None and self._postgres is not None
        after = self._now()
        split = postgres_cpu_split(self._postgres, postgres_snapshot())
        seconds = {
            "client": after["client"] - self._before["client"],
            "postgres": sum(split.values()),
            "broker": after["broker"] - self._before["broker"],
            **{f"pg_{kind}": value for kind, value in split.items()},
        }
        return {
            f"{name}_cpu_us_per_event": value * 1e6 / max(events, 1)
            for name, value in seconds.items()
        }


# -- the broker's own timing of Produce requests ---------------------------------------------
# The broker times every request by stage (kafka.network:type=RequestMetrics): waiting in
# its request queue, the local append, waiting for other replicas (none here), waiting in
# the response queue, sending the response. bench/peers/jmx/RequestMetrics.java reads them
# over the broker JVM's local management agent (loopback only, started with jcmd). The
# histograms are cumulative, so a window's mean is taken from two readings' counts and
# means; their percentiles (biased to the last minutes) are not used. The broker rounds
# each value to whole milliseconds before it records it (Math.round, Yammer histograms
# take longs): a mean below a millisecond is the share of requests that took half of one
# or more, not a typical request's time.

PRODUCE_STAGES = (
    ("RequestQueueTimeMs", "request_queue_ms"),
    ("LocalTimeMs", "local_ms"),
    ("RemoteTimeMs", "remote_ms"),
    ("ResponseQueueTimeMs", "response_queue_ms"),
    ("ResponseSendTimeMs", "response_send_ms"),
    ("TotalTimeMs", "total_ms"),
    ("RequestBytes", "request_bytes"),
)
_JMX_SOURCE = Path(__file__).with_name("jmx") / "RequestMetrics.java"

# one reading: metric name -> (count, mean)
ProduceReading = dict[str, tuple[int, float]]


def produce_window(before: ProduceReading, after: ProduceReading) -> dict[str, float]:
    """The Produce requests between two readings: how many, and each stage's mean over them
    (``produce_<stage>``); empty when either reading is missing or no request came."""
    if not before or not after or "TotalTimeMs" not in after:
        return {}
    requests = after["TotalTimeMs"][0] - before.get("TotalTimeMs", (0, 0.0))[0]
    if requests <= 0:
        return {}
    window = {"produce_requests": float(requests)}
    for metric, key in PRODUCE_STAGES:
        if metric not in after:
            continue
        count_after, mean_after = after[metric]
        count_before, mean_before = before.get(metric, (0, 0.0))
        # Every value the broker records is a whole number (milliseconds, bytes), so each
        # reading's sum is one: rounding mean * count recovers it exactly, where the raw
        # product is off by a rounding error that can put a window's total below its local.
        total = round(mean_after * count_after) - round(mean_before * count_before)
        window[f"produce_{key}"] = total / max(count_after - count_before, 1)
    return window


def _tool_output(*args: str) -> str | None:
    """A JDK tool's standard output, or None when it is missing or fails."""
    try:
        return subprocess.run(args, check=True, capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _jmx_reader() -> Path | None:
    """The reader, compiled once per version of its source (None without a JDK)."""
    source = _JMX_SOURCE.read_bytes()
    classes = (
        Path(tempfile.gettempdir()) / f"outbox-relay-jmx-{hashlib.sha256(source).hexdigest()[:12]}"
    )
    if (classes / "RequestMetrics.class").is_file():
        return classes
    if _tool_output("javac", "-d", str(classes), str(_JMX_SOURCE)) is None:
        return None
    return classes


@functools.cache
def _broker_jmx_url(pid: int) -> str | None:
    """The broker JVM's local JMX address, starting its local agent if need be (once per
    broker process: the agent stays up, and every later reading reuses its address)."""
    if _tool_output("jcmd", str(pid), "ManagementAgent.start_local") is None:
        return None
    for line in (_tool_output("jcmd", str(pid), "PerfCounter.print") or "").splitlines():
        if line.startswith("sun.management.JMXConnectorServer.address="):
            return line.split("=", 1)[1].strip().strip('"')
    return None


def read_produce_metrics(bootstrap: str) -> ProduceReading:
    """The Produce request metrics of the broker behind ``bootstrap`` now; empty when it is
    not a process on this machine (a container elsewhere) or there is no JDK to read them."""
    pid = broker_pid(bootstrap)
    classes = _jmx_reader()
    url = _broker_jmx_url(pid) if pid and classes else None
    out = _tool_output("java", "-cp", str(classes), "RequestMetrics", url) if url else None
    reading: ProduceReading = {}
    for line in (out or "").splitlines():
        metric = json.loads(line)
        reading[metric["name"]] = (int(metric["count"]), float(metric["mean"]))
    return reading
