"""Commit → broker acknowledgement at a steady 1,000 events/s with NOTIFY.

The relay runs as ``outbox-relay run`` in its own process. Writers commit single-event
transactions at a paced rate and note the time COMMIT returned; the topic stamps
records with the broker's LogAppendTime, which is when the broker appended (and, with
acks=all on one broker, acknowledged) them. Same machine, same clock.

Several relays are measured one after the other in the same run, each on a topic of its
own: the relay at its defaults, the same with the previous default ``--linger-ms 5``,
and, when ``BENCH_BASELINE_SRC`` names another checkout of the project, that checkout at
its defaults (before/after a change, measured in one run). Ratios are to the first.

A second test splits one event's latency into its stages with the relay in the test's
own process (docs/benchmarks.md#one-events-latency).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from bench.conftest import Topics
from bench.deployment import start_relay_process
from bench.peers.measure import cpu_seconds
from relay.config import RelayConfig
from relay.engine import Batch, Relay
from relay.passes import Accepted, Fetched, FetchKind, Passes
from relay.records import OutboxRow
from relay.store import Recorded, RelayStore
from relay.wakeups import WakeUp
from tests.support.kafka import read_topic
from tests.support.relay import running_relay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.bench

RATE = int(os.environ.get("BENCH_RATE", "1000"))
SECONDS = int(os.environ.get("BENCH_SECONDS", "20"))
WRITERS = 4


async def _writer(
    url: str, index: int, per_second: float, deadline: float, sent: dict[str, float]
) -> None:
    conn = await asyncpg.connect(url)
    interval = 1 / per_second
    next_at = time.perf_counter()
    n = 0
    try:
        while time.perf_counter() < deadline:
            event_id = str(uuid.uuid4())
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) "
                    "VALUES ($1, 'latency', $2, 'bench.latency', '{\"x\": 1}')",
                    event_id,
                    f"w{index}-{n % 50}",
                )
            # The commit point: the row is visible from here on (the COMMIT round trip
            # itself, typically well under a millisecond here, is not counted).
            sent[event_id] = time.time()
            n += 1
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
    finally:
        await conn.close()


async def _write_steadily(url: str) -> dict[str, float]:
    """Commit RATE events/s for SECONDS; each event's id → the time its COMMIT returned."""
    sent: dict[str, float] = {}
    deadline = time.perf_counter() + SECONDS
    await asyncio.gather(*(_writer(url, i, RATE / WRITERS, deadline, sent) for i in range(WRITERS)))
    return sent


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[max(0, int(len(ordered) * fraction) - 1)]


@dataclass
class Variant:
    label: str
    env: dict[str, str] = field(default_factory=dict)
    source: Path | None = None  # another checkout to run the relay from
    families_off: bool = False  # one `run` evaluating nothing, instead of the deployed shape


async def _measure(
    database_url: str, topics: Topics, workdir: Path, variant: Variant
) -> tuple[float, float, float, int, float]:
    """p50, p99, max (ms), events, and the relay's CPU ms per 1,000 events of one relay
    variant at the steady rate."""
    namespace = f"l{uuid.uuid4().hex[:8]}"
    topic = f"{namespace}.latency"
    await topics.create(topic, log_append_time=True)
    bootstrap = topics.bootstrap
    relay = await start_relay_process(
        database_url,
        bootstrap,
        namespace,
        workdir,
        source=variant.source,
        families_off=variant.families_off,
        **variant.env,
    )
    try:
        await asyncio.sleep(3)  # lanes claimed, producer connected
        cpu_before = cpu_seconds([relay.pid])
        sent = await _write_steadily(database_url)
        records = await read_topic(bootstrap, topic, count=len(sent), timeout=60)
        cpu = cpu_seconds([relay.pid]) - cpu_before
    finally:
        relay.terminate()
        await relay.wait()
    latencies = sorted(
        record.timestamp - sent[event_id] * 1000
        for record in records
        if (event_id := dict(record.headers)["id"].decode()) in sent
    )
    assert len(latencies) == len(sent)  # completeness, not speed
    return (
        statistics.median(latencies),
        _percentile(latencies, 0.99),
        latencies[-1],
        len(latencies),
        cpu * 1000 / (len(latencies) / 1000),
    )


async def test_commit_to_ack_latency_at_steady_rate(
    bench_database: str, bench_topics: Topics, tmp_path: Path
) -> None:
    variants = [
        Variant("relay at its defaults (run --relay-only beside one sidecar)"),
        Variant("relay alone, every health family off (reported)", families_off=True),
        Variant("relay, --linger-ms 5 (the previous default)", {"OUTBOX_RELAY_LINGER_MS": "5"}),
    ]
    baseline = os.environ.get("BENCH_BASELINE_SRC")
    if baseline:
        variants.append(
            Variant(f"baseline checkout {baseline}, its defaults", source=Path(baseline))
        )
    results = [
        (variant, await _measure(bench_database, bench_topics, tmp_path, variant))
        for variant in variants
    ]
    first_p50, first_p99 = results[0][1][0], results[0][1][1]
    lines = [
        f"\nLATENCY commit -> broker append, {RATE} events/s for {SECONDS} s with NOTIFY "
        "(one after the other, same run)"
    ]
    first_cpu = results[0][1][4]
    for variant, (p50, p99, worst, events, cpu) in results:
        lines.append(
            f"  {variant.label}: {events} events, p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
            f"max {worst:6.1f} ms  relay CPU {cpu:5.0f} ms per 1,000 events  "
            f"(this / defaults: p50 {p50 / first_p50:.2f}, p99 {p99 / first_p99:.2f}, "
            f"CPU {cpu / first_cpu:.2f})"
        )
    print("\n".join(lines))


# -- where one event's latency goes ----------------------------------------------------------


@dataclass
class _Stages:
    """Wall-clock instants (time.time()) the instrumented relay saw, per event id or seq."""

    wakes: list[float] = field(default_factory=list)
    fetched: dict[int, tuple[float, float]] = field(default_factory=dict)  # seq → fetch
    sent: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # id → send, seq
    acked: dict[int, tuple[float, float]] = field(default_factory=dict)  # seq → append, ack
    recorded: dict[int, float] = field(default_factory=dict)  # seq → bookkeeping done
    fetch_starts: list[int] = field(default_factory=list)  # the seq each fetch read after
    refetched: int = 0  # cursor fetches dropped: a late commit below them was announced
    unheard: int = 0  # rows a cursor fetch left for the next one: not notified yet


def _instrument(monkeypatch: pytest.MonkeyPatch, stages: _Stages) -> type[RelayStore]:
    """Wrap the relay's stage boundaries with timestamps (bench only); the store to run
    the relay with."""
    wake_set = WakeUp.set

    def noted_wake(self: WakeUp) -> None:
        stages.wakes.append(time.time())
        wake_set(self)

    class NotedStore(RelayStore):
        async def fetch_ready(
            self, lanes: Any, cursor: int, limit: int, **kwargs: Any
        ) -> list[OutboxRow]:
            stages.fetch_starts.append(cursor)
            started = time.time()
            rows = await super().fetch_ready(lanes, cursor, limit, **kwargs)
            ended = time.time()
            for row in rows:  # the first fetch that read the row (a later pass re-reads it)
                stages.fetched.setdefault(row.seq, (started, ended))
            return rows

        async def record_outcome(
            self, fences: Any, published: Any, *args: Any, **kwargs: Any
        ) -> Recorded:
            recorded = await super().record_outcome(fences, published, *args, **kwargs)
            ended = time.time()
            for group in published:
                for row in group.rows:
                    stages.recorded[row.seq] = ended
            return recorded

    send = Relay._send

    async def noted_send(self: Relay, rows: Any, slot: Any) -> Batch:
        started = time.time()
        batch = await send(self, rows, slot)
        ended = time.time()
        for row in rows:
            stages.sent[row.id] = (started, ended, row.seq)
        for submitted in batch.submission.batches:
            seqs = [row.seq for row in submitted.rows]
            submitted.future.add_done_callback(_on_ack(stages, seqs))
        return batch

    accept = Passes.accept

    def noted_accept(self: Passes, fetched: Fetched, **kwargs: Any) -> Accepted | None:
        accepted = accept(self, fetched, **kwargs)
        if accepted is None:
            stages.refetched += 1
        elif fetched.plan.kind is FetchKind.CURSOR:
            stages.unheard += len(fetched.rows) - len(accepted.rows)
        return accepted

    monkeypatch.setattr(Passes, "accept", noted_accept)
    monkeypatch.setattr(WakeUp, "set", noted_wake)
    monkeypatch.setattr(Relay, "_send", noted_send)
    return NotedStore


# What FETCH_READY cost the server in this database: calls, mean execution time (ms) and
# buffers touched per call. The bench database is fresh, so these are this run's alone.
_FETCH_COST = """
SELECT sum(s.calls)::bigint,
       sum(s.total_exec_time) / sum(s.calls),
       sum(s.shared_blks_hit + s.shared_blks_read)::float8 / sum(s.calls)
FROM pg_stat_statements s
JOIN pg_database d ON d.oid = s.dbid
WHERE d.datname = current_database() AND s.query LIKE '%FROM outbox o%AND o.seq > $2%'
"""


async def _fetch_cost(database_url: str) -> str:
    """FETCH_READY's server-side cost in this run, or why it is not known."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        calls, mean_ms, buffers = await conn.fetchrow(_FETCH_COST)
    except asyncpg.PostgresError as exc:  # not preloaded on this server, or no privilege
        return f"FETCH_READY server cost unknown ({type(exc).__name__})"
    finally:
        await conn.close()
    if not calls:
        return "FETCH_READY server cost unknown (no calls recorded)"
    return (
        f"FETCH_READY on the server (pg_stat_statements): {calls} calls, "
        f"{mean_ms:.3f} ms and {buffers:.1f} buffers per call"
    )


def _on_ack(stages: _Stages, seqs: list[int]) -> Callable[[asyncio.Future[Any]], None]:
    def done(future: asyncio.Future[Any]) -> None:
        acked = time.time()
        if future.cancelled() or future.exception() is not None:
            return
        appended = future.result().timestamp / 1000  # the topic's LogAppendTime
        for seq in seqs:
            stages.acked[seq] = (appended, acked)

    return done


async def test_where_one_events_latency_goes(
    bench_database: str,
    kafka_bootstrap: str,
    bench_topics: Topics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = f"l{uuid.uuid4().hex[:8]}"
    await bench_topics.create(f"{namespace}.latency", log_append_time=True)
    stages = _Stages()
    store = _instrument(monkeypatch, stages)
    config = RelayConfig(
        database_url=bench_database,
        kafka_bootstrap=kafka_bootstrap,
        topic_template=f"{namespace}.{{aggregatetype}}",
    )
    async with running_relay(config, store_factory=store) as running:
        await wait_until(running.relay.ready, timeout=60)
        await asyncio.sleep(1)
        stages.fetch_starts.clear()
        sent = await _write_steadily(bench_database)
        await wait_until(lambda: len(stages.recorded) >= len(sent), timeout=60)
    wakes = sorted(stages.wakes)
    parts: dict[str, list[float]] = {
        name: []
        for name in (
            "NOTIFY delivery (commit -> wake-up)",
            "batching: wake-up -> fetch starts (the broker answers the batch before)",
            "fetch (statement + rows to the relay)",
            "to the send step (fetch ends -> mapping starts)",
            "encode (map rows, build partition batches, hand over)",
            "producer + network + broker append (hand-over -> LogAppendTime)",
            "broker acknowledgement back to the relay (LogAppendTime -> ack)",
            "total commit -> acknowledgement in the relay",
            "bookkeeping (ack -> receipts written)",
        )
    }
    names = list(parts)
    for event_id, committed in sent.items():
        if event_id not in stages.sent:
            continue
        send_started, send_ended, seq = stages.sent[event_id]
        if seq not in stages.acked or seq not in stages.recorded:
            continue
        fetch_started, fetch_ended = stages.fetched[seq]
        appended, acked = stages.acked[seq]
        woken_at = bisect.bisect_left(wakes, committed)
        wake = wakes[woken_at] if woken_at < len(wakes) else fetch_started
        wake = min(wake, fetch_started)  # a fetch already under way found the row
        values = (
            wake - committed,
            fetch_started - wake,
            fetch_ended - fetch_started,
            send_started - fetch_ended,
            send_ended - send_started,
            appended - send_ended,
            acked - appended,
            acked - committed,
            stages.recorded[seq] - acked,
        )
        for name, value in zip(names, values, strict=True):
            parts[name].append(value * 1000)
    lines = [
        f"\nLATENCY BREAKDOWN, relay in the test's process at its defaults, {RATE} events/s "
        f"for {SECONDS} s ({len(parts[names[0]])} events; ms; broker times are its "
        "LogAppendTime, ms resolution)",
        f"  {'stage':70s} {'p50':>7s} {'p99':>7s} {'mean':>7s}",
    ]
    for name, values in parts.items():
        ordered = sorted(values)
        lines.append(
            f"  {name:70s} {statistics.median(ordered):7.2f} {_percentile(ordered, 0.99):7.2f}"
            f" {statistics.fmean(ordered):7.2f}"
        )
    from_zero = stages.fetch_starts.count(0)
    lines.append(
        f"  fetches: {len(stages.fetch_starts)}, {from_zero} of them from seq 0 "
        f"(the others from a cursor); cursor fetches read again for a late commit: "
        f"{stages.refetched}; rows left for a later fetch, not yet notified: {stages.unheard}"
    )
    lines.append("  " + await _fetch_cost(bench_database))
    print("\n".join(lines))
    assert parts[names[0]], "no event went through every stage"
