"""The peer comparison: the same two measurements for every system, runs alternated.

(a) Catch-up: a backlog is written while the system is stopped; the system starts; the rate
    is the backlog over the span from the broker's first to its last append (start-up left
    out, it is reported apart as the wall time from start to the last record).
(b) Latency: the running system is fed single events at a steady rate; each event's broker
    append time minus the moment its COMMIT (or ``send()``) returned.
(c) Latency after a catch-up: (a)'s catch-up, then (b)'s steady phase at once on the same
    database, so the relay's steady phase follows its own deletes of the backlog (the
    relay and Debezium at ``poll.interval.ms=1``), with the writers' reached rate beside it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.peers import measure
from bench.peers.subjects import (
    DebeziumSubject,
    RawProducerSubject,
    RelaySubject,
    Subject,
    topic_of,
)
from bench.peers.workload import DRAIN_AGGREGATE, LATENCY_AGGREGATE, paced

logger = logging.getLogger(__name__)

WRITER_LANES = 4
WARMUP_EVENTS = 20
REST_PORTS = range(26301, 26400)  # Kafka Connect's REST listener, one port per worker start

# The systems in the order of run 1; each later run starts one further along, so no system
# always goes first (or last) on the busy machine.
SYSTEMS = ("relay", "debezium-poll1ms", "debezium-poll10ms", "raw-send", "raw-send_batch")
# The batch API is a throughput ceiling; for latency one record per batch says nothing new.
LATENCY_SYSTEMS = ("relay", "debezium-poll1ms", "debezium-poll10ms", "raw-send")
# The two systems of each phase's tightest target run back to back, each first in turn: a
# neighbour's load on a shared machine comes and goes within a minute, and a drain lasts a
# few seconds, so a ratio of two drains a minute apart measured the neighbour as much as
# the systems (docs/benchmarks.md#setup, the runs). The drain pair runs twice, A B B A,
# and each system's figure of the run is its mean: the machine also drifts within a run.
DRAIN_PAIR = ("relay", "raw-send")
LATENCY_PAIR = ("relay", "debezium-poll1ms")
# (c) compares the relay with the latency-tuned Debezium only, as the design's bounds do.
AFTER_CATCH_UP_SYSTEMS = LATENCY_PAIR
PHASES = ("drain", "latency", "after_catch_up")


@dataclass(frozen=True)
class Scale:
    """How big a comparison is, and of what (BENCH_EVENTS, _RUNS, _RATE, _SECONDS, _SYSTEMS,
    _PHASES)."""

    events: int = 200_000
    runs: int = 3
    rate: int = 1000
    seconds: int = 20
    warmup_seconds: int = 5
    systems: tuple[str, ...] = SYSTEMS
    phases: tuple[str, ...] = PHASES

    def latency_systems(self) -> tuple[str, ...]:
        """The selected systems whose latency is measured (none without the latency phase)."""
        if "latency" not in self.phases:
            return ()
        return tuple(s for s in self.systems if s in LATENCY_SYSTEMS)

    def drain_systems(self) -> tuple[str, ...]:
        """The selected systems whose catch-up is measured (none without the drain phase)."""
        return self.systems if "drain" in self.phases else ()

    def after_catch_up_systems(self) -> tuple[str, ...]:
        """The selected systems whose latency after a catch-up is measured."""
        if "after_catch_up" not in self.phases:
            return ()
        return tuple(s for s in self.systems if s in AFTER_CATCH_UP_SYSTEMS)

    def measurements(self) -> int:
        """How many rows of figures the catch-up and latency phases yield (the drain pair
        twice)."""
        drains = len(run_order(self.drain_systems(), 0, DRAIN_PAIR, sandwich=True))
        return self.runs * (drains + len(self.latency_systems()))

    def after_catch_up_measurements(self) -> int:
        """How many rows of figures the phase after a catch-up yields."""
        return self.runs * len(self.after_catch_up_systems())

    @classmethod
    def from_env(cls) -> Scale:
        """The scale the environment asks for (defaults: the targets' own scale)."""
        return cls(
            events=int(os.environ.get("BENCH_EVENTS", "200000")),
            runs=int(os.environ.get("BENCH_RUNS", "3")),
            rate=int(os.environ.get("BENCH_RATE", "1000")),
            seconds=int(os.environ.get("BENCH_SECONDS", "20")),
            warmup_seconds=int(os.environ.get("BENCH_WARMUP_SECONDS", "5")),
            systems=tuple(os.environ.get("BENCH_SYSTEMS", ",".join(SYSTEMS)).split(",")),
            phases=tuple(os.environ.get("BENCH_PHASES", ",".join(PHASES)).split(",")),
        )


def run_order(
    systems: tuple[str, ...], run: int, pair: tuple[str, ...] = (), *, sandwich: bool = False
) -> list[str]:
    """Run ``run`` (from 0) starts ``run`` places further along the list; ``pair``'s
    systems, where both are selected, go back to back, its first one first on even runs.
    With ``sandwich`` the pair runs A B B A (B A A B on odd runs): a machine that speeds up
    or slows down steadily across the four drains favours neither system's mean."""
    together = pair if all(name in systems for name in pair) else ()
    units: list[tuple[str, ...]] = []
    for name in systems:
        if name in together[1:]:
            continue  # goes with the pair's first
        if together and name == together[0]:
            lead = together if run % 2 == 0 else together[::-1]
            units.append(lead + lead[::-1] if sandwich else lead)
        else:
            units.append((name,))
    if not units:
        return []
    shift = run % len(units)
    return [name for unit in units[shift:] + units[:shift] for name in unit]


@dataclass
class Comparison:
    """Builds the subjects and collects every run's raw figures."""

    server_url: str
    bootstrap: str
    workdir: Path
    scale: Scale
    results: list[dict[str, Any]] = field(default_factory=list)
    _ports: list[int] = field(default_factory=lambda: list(REST_PORTS))

    def subject(self, name: str) -> Subject:
        """A fresh subject of that name."""
        if name == "relay":
            return RelaySubject(self.server_url, self.bootstrap, self.workdir)
        if name.startswith("debezium-poll"):
            poll_ms = int(name.removeprefix("debezium-poll").removesuffix("ms"))
            port = self._ports.pop(0)
            return DebeziumSubject(
                self.server_url, self.bootstrap, self.workdir, poll_ms=poll_ms, rest_port=port
            )
        return RawProducerSubject(self.bootstrap, batch_api=name == "raw-send_batch")

    async def run(self, progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
        """Every run: the catch-up of every system, then the latency of every system, then
        the latency after a catch-up of the relay and Debezium (poll 1 ms)."""
        for run in range(self.scale.runs):
            for name in run_order(self.scale.drain_systems(), run, DRAIN_PAIR, sandwich=True):
                figures = await drain(self.subject(name), self.bootstrap, self.scale)
                self._keep(run, name, "drain", figures, progress)
            for name in run_order(self.scale.latency_systems(), run, LATENCY_PAIR):
                figures = await latency(self.subject(name), self.bootstrap, self.scale)
                self._keep(run, name, "latency", figures, progress)
            for name in run_order(self.scale.after_catch_up_systems(), run, LATENCY_PAIR):
                figures = await after_catch_up(self.subject(name), self.bootstrap, self.scale)
                self._keep(run, name, "after_catch_up", figures, progress)
        return self.results

    def _keep(
        self,
        run: int,
        name: str,
        phase: str,
        figures: dict[str, Any],
        progress: Callable[[str], None],
    ) -> None:
        row = {"run": run + 1, "system": name, "phase": phase, **figures}
        self.results.append(row)
        shown = ", ".join(
            f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()
        )
        progress(f"run {run + 1} {phase:7} {name:18} {shown}")


async def drain(subject: Subject, bootstrap: str, scale: Scale) -> dict[str, Any]:
    """(a) the backlog written while stopped, then the time until all of it is on the broker."""
    topic = topic_of(subject, DRAIN_AGGREGATE)
    try:
        await subject.prepare()
        await measure.create_topic(bootstrap, topic)
        await subject.load_backlog(scale.events)
        # the broker's Produce timings over the whole drain (read outside the CPU window: the
        # reader is a JVM of its own)
        produce_before = await asyncio.to_thread(measure.read_produce_metrics, bootstrap)
        started = time.monotonic()
        await subject.start()
        # CPU from the first record on: start-up (a JVM, imports, claiming lanes) is left
        # out, as it is from the judged rate.
        await measure.wait_for_count(
            bootstrap, topic, 1, timeout=180 + scale.events / 200, alive=subject.alive
        )
        cpu = measure.CpuMeter(subject.client_pid(), bootstrap)
        cpu.start()
        done = await measure.wait_for_count(
            bootstrap, topic, scale.events, timeout=180 + scale.events / 200, alive=subject.alive
        )
        cpu_per_event = cpu.per_event_us(scale.events)
        rss = subject.peak_rss_mb()
        produce = measure.produce_window(
            produce_before, await asyncio.to_thread(measure.read_produce_metrics, bootstrap)
        )
        await subject.stop()
        first_ms, last_ms = await measure.append_span_ms(bootstrap, topic)
    finally:
        await subject.stop()
        await subject.cleanup()
        await measure.delete_topics(bootstrap, [topic])
    span_s = max(last_ms - first_ms, 1) / 1000
    wall_s = done - started
    return {
        "events": scale.events,
        "rate": scale.events / span_s,
        "span_s": span_s,
        "wall_s": wall_s,
        "wall_rate": scale.events / wall_s,
        "peak_rss_mb": rss,
        **cpu_per_event,
        **produce,
    }


async def latency(subject: Subject, bootstrap: str, scale: Scale) -> dict[str, Any]:
    """(b) the running system fed a steady rate; commit → broker append per event."""
    topic = topic_of(subject, LATENCY_AGGREGATE)
    try:
        await subject.prepare()
        await measure.create_topic(bootstrap, topic)
        await subject.start()
        # Warm up at the measured rate, not counted: connections made, metadata known, a
        # JVM's hot paths compiled. Every system gets the same.
        for n in range(WARMUP_EVENTS):
            await subject.emit(n % WRITER_LANES, n)
        await measure.wait_for_count(
            bootstrap, topic, WARMUP_EVENTS, timeout=180, alive=subject.alive
        )
        warmup = await paced(
            subject.emit, rate=scale.rate, seconds=scale.warmup_seconds, lanes=WRITER_LANES
        )
        produce_before = await asyncio.to_thread(measure.read_produce_metrics, bootstrap)
        began = time.perf_counter()
        sent = await paced(subject.emit, rate=scale.rate, seconds=scale.seconds, lanes=WRITER_LANES)
        writing_s = time.perf_counter() - began
        await measure.wait_for_count(
            bootstrap,
            topic,
            WARMUP_EVENTS + len(warmup) + len(sent),
            timeout=180,
            alive=subject.alive,
        )
        produce = measure.produce_window(
            produce_before, await asyncio.to_thread(measure.read_produce_metrics, bootstrap)
        )
        rss = subject.peak_rss_mb()
        appended = await measure.append_times_by_id(bootstrap, topic, timeout=120)
    finally:
        await subject.stop()
        await subject.cleanup()
        await measure.delete_topics(bootstrap, [topic])
    values = measure.latencies_ms(sent, appended)
    missing = len(sent) - len(values)
    if missing:
        raise AssertionError(f"{subject.name}: {missing} of {len(sent)} events not read back")
    summary = measure.summarize(values)
    return {
        **asdict(summary),
        "achieved_rate": len(sent) / scale.seconds,
        "writers_rate": len(sent) / writing_s,
        "target_rate": scale.rate,
        "peak_rss_mb": rss,
        **produce,
    }


async def after_catch_up(subject: Subject, bootstrap: str, scale: Scale) -> dict[str, Any]:
    """(c) (a)'s backlog written while stopped and caught up, then at once (b)'s steady
    phase on the same database: the warm-up's single events (connections made, the latency
    topic's metadata known) and the counted phase, without (b)'s paced warm-up, so it
    meets what the catch-up left (for the relay: the deleted backlog's dead rows and index
    entries). ``writers_rate`` is the rate the writers reached: the events over the time
    they took (``paced`` sends every scheduled event, late when it falls behind)."""
    backlog_topic = topic_of(subject, DRAIN_AGGREGATE)
    topic = topic_of(subject, LATENCY_AGGREGATE)
    try:
        await subject.prepare()
        await measure.create_topic(bootstrap, backlog_topic)
        await measure.create_topic(bootstrap, topic)
        await subject.load_backlog(scale.events)
        started = time.monotonic()
        await subject.start()
        caught_up = await measure.wait_for_count(
            bootstrap,
            backlog_topic,
            scale.events,
            timeout=180 + scale.events / 200,
            alive=subject.alive,
        )
        for n in range(WARMUP_EVENTS):
            await subject.emit(n % WRITER_LANES, n)
        await measure.wait_for_count(
            bootstrap, topic, WARMUP_EVENTS, timeout=180, alive=subject.alive
        )
        began = time.perf_counter()
        after_s = time.monotonic() - caught_up
        sent = await paced(subject.emit, rate=scale.rate, seconds=scale.seconds, lanes=WRITER_LANES)
        writing_s = time.perf_counter() - began
        await measure.wait_for_count(
            bootstrap, topic, WARMUP_EVENTS + len(sent), timeout=180, alive=subject.alive
        )
        rss = subject.peak_rss_mb()
        appended = await measure.append_times_by_id(bootstrap, topic, timeout=120)
    finally:
        await subject.stop()
        await subject.cleanup()
        await measure.delete_topics(bootstrap, [backlog_topic, topic])
    values = measure.latencies_ms(sent, appended)
    missing = len(sent) - len(values)
    if missing:
        raise AssertionError(f"{subject.name}: {missing} of {len(sent)} events not read back")
    return {
        **asdict(measure.summarize(values)),
        "events_before": scale.events,
        "catch_up_wall_s": caught_up - started,
        "steady_began_after_s": after_s,
        "writers_rate": len(sent) / writing_s,
        "target_rate": scale.rate,
        "peak_rss_mb": rss,
    }
