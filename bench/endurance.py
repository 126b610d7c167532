"""The endurance benchmark (``make bench-endurance``): the relay as deployed under a steady load
for half an hour or more, with a backlog burst every ten minutes, measured minute by minute.

Four writer connections commit one 1 KiB event per transaction on 1,000 keys at a steady
rate (each key written by one connection, so each key's commits are in the order its
writer made them; the payload's ``n`` counts each key's events). The relay runs as
deployed (``run --relay-only`` beside one ``run --no-relay`` sidecar) with a short
``--receipt-retention-ms``, so receipts are pruned throughout. Every ten minutes the relay
process is stopped (SIGTERM) for a minute while the writers keep writing, then started
again and catches up; the sidecar keeps running.

Per minute: commit → broker append p50/p99/max of the events committed in it (the broker's
LogAppendTime minus the moment the writer's COMMIT returned, as bench/peers measures),
events committed and published, the relay's, the sidecar's and PostgreSQL's CPU per event
published (PostgreSQL's: this database's backends by whom they serve, its autovacuum
workers, and the cluster's shared processes apart: bench/database_stats.py), the outbox's
and the receipts' sizes, dead tuples and autovacuum runs, the writers' insert latency, the
top statements of pg_stat_statements by execution time, and the machine's load average.

At the end every event written is checked on the topic: each key's events present once
(first occurrences by id) and in commit order (tests/support/order.py's rule), nothing left
in the outbox. The figures go to a JSON-lines file (one line for the run, one per minute);
``python -m bench.endurance_report`` writes docs/bench/endurance.md and its plot from it.

    python -m bench.endurance [--minutes 30] [--rate 1000|auto] [--burst-every-minutes 10]
        [--burst-seconds 60] [--receipt-retention-ms 120000] [--out docs/bench/endurance.jsonl]

``--rate auto`` first measures the writers' highest sustained rate (unpaced for 20 s, beside
the running relay) and runs at 0.8 of it, at most 1,000 events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import tempfile
import time
import uuid
from array import array
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import database_stats
from bench.deployment import RelayDeployment, fresh_database, start_relay_process
from bench.peers import measure
from bench.peers.workload import EVENT_TYPE, FILL, KEYS
from bench.report.files import current_commit
from tests.support.order import Seen, order_violations

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "bench" / "endurance.jsonl"
AGGREGATE = "endurance"
LANES = 4
TOP_STATEMENTS = 6
CEILING_SECONDS = 20
CAUGHT_UP_S = 0.1  # caught up: within this many seconds' events of the writers
MAX_BEHIND_S = 1.0  # a writer further behind its schedule drops the debt

# One event per transaction (autocommit); the id is the column's default, time-ordered as
# a writer that leaves it to the table gets it.
INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, jsonb_build_object('n', $4::bigint, 'fill', $5::text))
"""


@dataclass(frozen=True)
class Plan:
    """What one endurance run does."""

    minutes: int = 30
    rate: int = 1000
    rate_basis: str = "fixed"
    burst_every_minutes: int = 10
    burst_seconds: int = 60
    retention_ms: int = 120_000
    warmup_seconds: int = 30
    lanes: int = LANES

    def burst_starts(self) -> list[int]:
        """When the relay is stopped, in seconds from the run's start: every
        ``burst_every_minutes``, each burst's restart at least two minutes before the end
        (its catch-up and a steady minute inside the run)."""
        if self.burst_every_minutes <= 0:
            return []
        period, end = 60 * self.burst_every_minutes, 60 * self.minutes
        return [t for t in range(period, end, period) if t + self.burst_seconds + 120 <= end]


def minute_of(offset_s: float) -> int:
    """The minute of the run an instant falls in (negative before the run's start)."""
    return int(offset_s // 60) if offset_s >= 0 else -1


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max (nearest rank), None for an empty list."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    return {
        "p50": round(measure.percentile(ordered, 50), 3),
        "p99": round(measure.percentile(ordered, 99), 3),
        "max": round(ordered[-1], 3),
    }


class Ledger:
    """What the writers committed: each key's events' commit times (unix s), the n-th
    event of key k at ``commit_times[k][n - 1]``, and per minute of the run the commits and
    the writers' insert latencies (ms)."""

    def __init__(self, start: float) -> None:
        self.start = start  # unix time of minute 0
        self.commit_times = [array("d") for _ in range(KEYS)]
        self.total = 0
        self.commits: Counter[int] = Counter()
        self.insert_ms: dict[int, list[float]] = {}

    def next_version(self, key: int) -> int:
        """The count the key's next event carries."""
        return len(self.commit_times[key]) + 1

    def committed(self, key: int, at: float, insert_ms: float) -> None:
        """One event of ``key`` committed at ``at`` (unix s)."""
        self.commit_times[key].append(at)
        self.total += 1
        minute = minute_of(at - self.start)
        self.commits[minute] += 1
        self.insert_ms.setdefault(minute, []).append(insert_ms)


async def write(
    conn: asyncpg.Connection, ledger: Ledger, lane: int, *, rate: float, lanes: int, until: float
) -> None:
    """One writer lane at ``rate / lanes`` events per second until ``until`` (perf_counter):
    keys lane, lane + lanes, … in turn. A lane behind its schedule writes back to back, but
    a debt of more than ``MAX_BEHIND_S`` is dropped, so the rate stays steady and the
    commits count what it reached. ``rate`` 0: as fast as it can."""
    interval = lanes / rate if rate else 0.0
    due = time.perf_counter() + interval * lane / lanes
    n = 0
    while (now := time.perf_counter()) < until:
        if due > now:
            await asyncio.sleep(due - now)
        elif due < now - MAX_BEHIND_S:
            due = now
        key = (n * lanes + lane) % KEYS
        began = time.perf_counter()
        await conn.execute(
            INSERT, AGGREGATE, f"key-{key}", EVENT_TYPE, ledger.next_version(key), FILL
        )
        took = time.perf_counter() - began
        ledger.committed(key, time.time(), took * 1000)
        n += 1
        due += interval


@dataclass
class Burst:
    """One backlog burst, in seconds from the run's start."""

    stopped_s: float
    restarted_s: float | None = None
    caught_up_s: float | None = None
    backlog: int | None = None  # events not yet published when the relay started again

    def as_dict(self) -> dict[str, Any]:
        """As the figures file keeps it, with the catch-up's rate."""
        figures = asdict(self)
        if self.restarted_s is not None and self.caught_up_s is not None and self.backlog:
            figures["catch_up_s"] = round(self.caught_up_s - self.restarted_s, 1)
            figures["catch_up_rate"] = round(
                self.backlog / max(self.caught_up_s - self.restarted_s, 1e-3)
            )
        return figures


@dataclass
class RelayProcesses:
    """The relay process that runs now (started again after each burst) and the sidecar
    that runs throughout."""

    first: RelayDeployment
    relay: asyncio.subprocess.Process
    pids: list[int] = field(default_factory=list)
    stopped: bool = False  # on purpose, for a burst

    def groups(self) -> list[tuple[int, str | None]]:
        """(pid, group) for the CPU meter."""
        pairs: list[tuple[int, str | None]] = [(self.relay.pid, "relay_process")]
        if self.first.sidecar is not None:
            pairs.append((self.first.sidecar.pid, "sidecar_process"))
        return pairs


class Run:
    """One endurance run against a database and a topic that exist for it."""

    def __init__(self, plan: Plan, database_url: str, bootstrap: str, workdir: Path) -> None:
        self.plan = plan
        self.url = database_url
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.namespace = f"e{uuid.uuid4().hex[:10]}"
        self.topic = f"{self.namespace}.{AGGREGATE}"
        self.bursts: list[Burst] = []
        self.minutes: list[dict[str, Any]] = []
        self.processes: RelayProcesses | None = None
        self.process_cpu = database_stats.CpuTotals()
        self.database_cpu = database_stats.DatabaseCpu()
        self.published = 0
        self.ceiling: float | None = None
        self.ledger = Ledger(0.0)
        self.run_start_perf = 0.0

    # -- the relay -----------------------------------------------------------------------

    def _relay_env(self) -> dict[str, str]:
        return {"OUTBOX_RELAY_RECEIPT_RETENTION_MS": str(self.plan.retention_ms)}

    async def start_relay(self) -> None:
        """The deployed shape: the relay and one sidecar."""
        first = await start_relay_process(
            self.url, self.bootstrap, self.namespace, self.workdir, **self._relay_env()
        )
        self.processes = RelayProcesses(first, first.relay, [first.relay.pid])
        self.database_cpu.clients[first.relay.pid] = "relay"
        if first.sidecar is not None:
            self.database_cpu.clients[first.sidecar.pid] = "sidecar"

    async def stop_relay(self) -> None:
        """SIGTERM to the relay process alone, as an orchestrator stops it; the sidecar runs on."""
        assert self.processes is not None
        self.process_cpu.take(self.processes.groups())  # its CPU up to the stop
        self.processes.stopped = True
        self.processes.relay.terminate()
        await self.processes.relay.wait()

    async def restart_relay(self) -> None:
        """A relay process again, without a second sidecar."""
        assert self.processes is not None
        again = await start_relay_process(
            self.url,
            self.bootstrap,
            self.namespace,
            self.workdir,
            sidecar=False,
            **self._relay_env(),
        )
        self.processes.relay = again.relay
        self.processes.pids.append(again.relay.pid)
        self.database_cpu.clients[again.relay.pid] = "relay"
        self.processes.stopped = False

    def relay_alive(self) -> bool:
        """The relay process runs (or was stopped on purpose), and so does the sidecar."""
        assert self.processes is not None
        sidecar = self.processes.first.sidecar
        relay_runs = self.processes.stopped or self.processes.relay.returncode is None
        return relay_runs and (sidecar is None or sidecar.returncode is None)

    async def stop_all(self) -> None:
        """SIGTERM to the relay and the sidecar, and wait for both."""
        if self.processes is None:
            return
        for process in (self.processes.relay, self.processes.first.sidecar):
            if process is not None and process.returncode is None:
                process.terminate()
                await process.wait()

    # -- the run -------------------------------------------------------------------------

    async def measure_ceiling(self, conns: list[asyncpg.Connection]) -> float:
        """The writers' highest sustained rate: every lane unpaced for CEILING_SECONDS beside
        the running relay."""
        before = self.ledger.total
        began = time.perf_counter()
        until = began + CEILING_SECONDS
        await asyncio.gather(
            *(
                write(c, self.ledger, i, rate=0, lanes=len(conns), until=until)
                for i, c in enumerate(conns)
            )
        )
        return (self.ledger.total - before) / (time.perf_counter() - began)

    async def run(self, *, auto_rate: bool) -> None:
        """Writers, bursts and the per-minute figures, then the wait until every event is
        on the topic."""
        conns = [await asyncpg.connect(self.url) for _ in range(self.plan.lanes)]
        monitor = await asyncpg.connect(self.url)
        offsets = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        await offsets.start()
        try:
            self.database_cpu.writer_pids = {c.get_server_pid() for c in conns}
            self.database_cpu.own_pids = {monitor.get_server_pid()}
            await self.start_relay()
            await asyncio.sleep(3)  # lanes claimed, producer connected
            self.ledger = Ledger(time.time() + 10**9)  # no minute yet: the warm-up is -1
            if auto_rate:
                self.ceiling = await self.measure_ceiling(conns)
                rate = min(1000, int(0.8 * self.ceiling))
                self.plan = Plan(
                    **{
                        **asdict(self.plan),
                        "rate": rate,
                        "rate_basis": f"0.8 x the writers' {self.ceiling:.0f}/s, at most 1,000",
                    }
                )
                print(f"writers' highest sustained rate {self.ceiling:.0f}/s: running at {rate}/s")
            await self._steady(conns, monitor, offsets)
        finally:
            await offsets.stop()
            for conn in (*conns, monitor):
                await conn.close()

    async def _steady(
        self, conns: list[asyncpg.Connection], monitor: asyncpg.Connection, offsets: Any
    ) -> None:
        plan = self.plan
        warm_until = time.perf_counter() + plan.warmup_seconds
        self.run_start_perf = warm_until
        self.ledger.start = time.time() + plan.warmup_seconds
        until = warm_until + 60 * plan.minutes
        writers = [
            asyncio.create_task(
                write(c, self.ledger, i, rate=plan.rate, lanes=len(conns), until=until)
            )
            for i, c in enumerate(conns)
        ]
        await asyncio.sleep(max(warm_until - time.perf_counter(), 0))
        bursts = asyncio.create_task(self._bursts())
        try:
            await self._sample(monitor, offsets, until, writers)
            await asyncio.gather(*writers)
            await bursts
        finally:
            for task in (*writers, bursts):
                task.cancel()
            await asyncio.gather(*writers, bursts, return_exceptions=True)
        # every committed event on the topic, then the relay's last figures
        deadline = time.monotonic() + 600
        while await self._published(offsets) < self.ledger.total:
            if time.monotonic() > deadline or not self.relay_alive():
                raise RuntimeError(
                    f"{self.ledger.total - self.published} events not published 600 s after "
                    "the writers stopped"
                )
            await asyncio.sleep(0.5)

    def offset_s(self) -> float:
        """Seconds since the run's start."""
        return time.perf_counter() - self.run_start_perf

    async def _bursts(self) -> None:
        for start in self.plan.burst_starts():
            await asyncio.sleep(max(start - self.offset_s(), 0))
            burst = Burst(stopped_s=round(self.offset_s(), 2))
            self.bursts.append(burst)
            await self.stop_relay()
            await asyncio.sleep(max(start + self.plan.burst_seconds - self.offset_s(), 0))
            await self.restart_relay()
            burst.restarted_s = round(self.offset_s(), 2)
            burst.backlog = self.ledger.total - self.published
            print(
                f"  burst: relay stopped at {start} s, started again with {burst.backlog} waiting"
            )

    async def _published(self, offsets: Any) -> int:
        tps = [TopicPartition(self.topic, p) for p in range(measure.PARTITIONS)]
        self.published = sum((await offsets.end_offsets(tps)).values())
        return self.published

    async def _sample(
        self,
        monitor: asyncpg.Connection,
        offsets: Any,
        until: float,
        writers: Sequence[asyncio.Task[None]],
    ) -> None:
        """Every second: published events, CPU, whether a burst's catch-up ended; at each
        minute's end, the minute's figures."""
        previous = await self._minute_state(monitor, offsets)
        second = 0
        while self.run_start_perf + 60 * len(self.minutes) < until:
            second += 1
            await asyncio.sleep(max(self.run_start_perf + second - time.perf_counter(), 0))
            for task in writers:
                if task.done() and task.exception() is not None:
                    raise RuntimeError("a writer failed") from task.exception()
            if not self.relay_alive():
                raise RuntimeError("the relay or the sidecar exited on its own")
            published = await self._published(offsets)
            self.process_cpu.take(self.processes.groups() if self.processes else [])
            await self.database_cpu.sample(monitor)
            for burst in self.bursts:
                if burst.restarted_s is not None and burst.caught_up_s is None:
                    lag = self.ledger.total - published
                    if lag <= max(self.plan.rate * CAUGHT_UP_S, 10):
                        burst.caught_up_s = round(self.offset_s(), 2)
                        print(
                            f"  caught up {burst.caught_up_s - burst.restarted_s:.1f} s after the restart"
                        )
            if second % 60 == 0:
                now = await self._minute_state(monitor, offsets)
                self.minutes.append(self._minute(len(self.minutes), previous, now))
                previous = now
                print(self._progress(self.minutes[-1]))

    async def _minute_state(self, monitor: asyncpg.Connection, offsets: Any) -> dict[str, Any]:
        return {
            "published": await self._published(offsets),
            "process_cpu": self.process_cpu.snapshot(),
            "database_cpu": self.database_cpu.snapshot(),
            "tables": await database_stats.table_stats(monitor),
            "statements": await database_stats.read_statements(monitor),
        }

    def _minute(self, index: int, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        published = after["published"] - before["published"]

        def per_event(key: str, group: str) -> float | None:
            used = after[key].get(group, 0.0) - before[key].get(group, 0.0)
            return round(used * 1e6 / published, 1) if published else None

        database = {group: per_event("database_cpu", group) for group in database_stats.GROUPS}
        tables = {}
        for name, now in after["tables"].items():
            was = before["tables"].get(name, {})
            tables[name] = {
                **{k: v for k, v in now.items() if k != "indexes"},
                "indexes": now["indexes"],
                "autovacuums_in_minute": now["autovacuums"] - was.get("autovacuums", 0),
                "autoanalyzes_in_minute": now["autoanalyzes"] - was.get("autoanalyzes", 0),
            }
        statements = database_stats.statement_costs(before["statements"], after["statements"])
        inserts = self.ledger.insert_ms.pop(index, [])
        return {
            "kind": "minute",
            "minute": index,
            "committed": self.ledger.commits.get(index, 0),
            "published": published,
            "insert_ms": quantiles(inserts),
            "cpu_us_per_event": {
                "relay": per_event("process_cpu", "relay_process"),
                "sidecar": per_event("process_cpu", "sidecar_process"),
                "postgres": round(
                    sum(v for g, v in database.items() if v is not None and g != "cluster"), 1
                )
                if published
                else None,
                "postgres_by_group": database,
            },
            "tables": tables,
            "top_statements": [cost.as_dict() for cost in statements[:TOP_STATEMENTS]],
            "load_average": round(os.getloadavg()[0], 2),
        }

    @staticmethod
    def _progress(row: dict[str, Any]) -> str:
        cpu = row["cpu_us_per_event"]
        outbox = row["tables"].get("outbox", {})
        receipts = row["tables"].get("outbox_receipt", {})
        return (
            f"minute {row['minute']:3}: committed {row['committed']:6} published "
            f"{row['published']:6}  insert p99 {row['insert_ms']['p99']} ms  relay "
            f"{cpu['relay']} us/ev  postgres {cpu['postgres']} us/ev  outbox "
            f"{outbox.get('total_bytes', 0) / 2**20:.1f} MB ({outbox.get('dead', 0)} dead)  "
            f"receipts {receipts.get('total_bytes', 0) / 2**20:.1f} MB  load "
            f"{row['load_average']}"
        )

    # -- the audit -----------------------------------------------------------------------

    async def read_back(self) -> dict[str, Any]:
        """Read the whole topic: each minute's latencies into its row, and the audit of
        every key's events (present, once by id, in commit order)."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            fetch_max_bytes=64 * 2**20,
            max_partition_fetch_bytes=16 * 2**20,
        )
        await consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(measure.PARTITIONS)]
        histories: dict[str, list[Seen]] = {}
        latencies: dict[int, list[float]] = {}
        last_n: dict[str, int] = {}
        records = 0
        try:
            ends = await consumer.end_offsets(tps)
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            remaining = {tp: end for tp, end in ends.items() if end > 0}
            while remaining:
                batch = await consumer.getmany(timeout_ms=1000, max_records=20_000)
                for tp, got in batch.items():
                    for record in got:
                        records += 1
                        key = record.key.decode()
                        n = json.loads(record.value)["n"]
                        histories.setdefault(key, []).append(Seen(n, dict(record.headers)["id"]))
                        if n > last_n.get(key, 0):  # a first occurrence, in order
                            last_n[key] = n
                            committed = self.ledger.commit_times[int(key[4:])][n - 1]
                            minute = minute_of(committed - self.ledger.start)
                            latency = record.timestamp - committed * 1000
                            latencies.setdefault(minute, []).append(latency)
                        if record.offset + 1 >= remaining.get(tp, 0):
                            remaining.pop(tp, None)
        finally:
            await consumer.stop()
        for row in self.minutes:
            row["latency_ms"] = {
                "events": len(latencies.get(row["minute"], [])),
                **quantiles(latencies.get(row["minute"], [])),
            }
        committed = {f"key-{k}": len(t) for k, t in enumerate(self.ledger.commit_times) if t}
        problems = order_violations(histories, committed)
        distinct = sum(len({s.id for s in seen}) for seen in histories.values())
        return {
            "committed": self.ledger.total,
            "records": records,
            "distinct_ids": distinct,
            "duplicates": records - distinct,
            "order_or_loss_problems": len(problems),
            "first_problems": problems[:10],
            "passed": not problems and distinct == self.ledger.total,
        }


async def leftovers(url: str) -> dict[str, Any]:
    """What the outbox holds after the run (nothing, when every event was published) and the
    outbox's indexes as pgstattuple reads them."""
    conn = await asyncpg.connect(url)
    try:
        left, quarantined = await conn.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE quarantined_at IS NOT NULL) FROM outbox"
        )
        return {
            "outbox_rows": left,
            "quarantined": quarantined,
            "index_tuples": await database_stats.index_tuples(conn),
        }
    finally:
        await conn.close()


async def server_facts(url: str) -> dict[str, Any]:
    """The server's version, whether this connection is over TLS, autovacuum's settings."""
    conn = await asyncpg.connect(url)
    try:
        settings = {
            row["name"]: row["setting"]
            for row in await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])",
                [
                    "autovacuum_naptime",
                    "autovacuum_vacuum_cost_limit",
                    "autovacuum_vacuum_cost_delay",
                    "shared_buffers",
                    "max_wal_size",
                ],
            )
        }
        return {
            "postgresql": await conn.fetchval("SHOW server_version"),
            "postgresql_tls": await conn.fetchval(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ),
            "settings": settings,
        }
    finally:
        await conn.close()


async def endurance(
    plan: Plan, *, server_url: str, bootstrap: str, out: Path, auto_rate: bool
) -> int:
    """One run, its figures written to ``out``; 0 when every event arrived once in order."""
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    commit = current_commit()  # the code measured is what this process started with
    load_before = os.getloadavg()
    async with fresh_database(server_url) as url:
        conn = await asyncpg.connect(url)
        try:
            missing = await database_stats.ensure_extensions(conn)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="endurance-") as workdir:
            run = Run(plan, url, bootstrap, Path(workdir))
            await measure.create_topic(bootstrap, run.topic)
            try:
                try:
                    await run.run(auto_rate=auto_rate)
                finally:
                    await run.stop_all()
                left = await leftovers(url)
                print("reading the topic back …")
                audit = await run.read_back()
            finally:
                await measure.delete_topics(bootstrap, [run.topic])
    header = {
        "kind": "run",
        "commit": commit,
        "measured_at": started_at,
        "plan": asdict(run.plan),
        "burst_starts_s": run.plan.burst_starts(),
        "writers_ceiling": None if run.ceiling is None else round(run.ceiling),
        "bursts": [burst.as_dict() for burst in run.bursts],
        "machine": {
            "cores": os.cpu_count(),
            "shared": True,
            "load_average_at_start": load_before,
            "load_average_at_end": os.getloadavg(),
            "python": platform.python_version(),
            **await server_facts(server_url),
        },
        "missing_extensions": missing,
        "after": left,
        "audit": audit,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as figures:
        for line in (header, *run.minutes):
            figures.write(json.dumps(line, separators=(",", ":"), default=str) + "\n")
    print(f"figures: {out}")
    print(
        f"audit: {audit['committed']} committed, {audit['records']} records, "
        f"{audit['duplicates']} duplicates, {audit['order_or_loss_problems']} keys lost or "
        f"out of order; outbox left {left['outbox_rows']} rows"
    )
    return 0 if audit["passed"] and left["outbox_rows"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    """Parse, run, write the figures; exit 0 when nothing was lost or reordered, 1 when
    something was, 2 on a bad argument, 3 when the run did not complete (no figures
    written)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30)
    parser.add_argument("--rate", default="1000", help="events/s, or auto")
    parser.add_argument("--burst-every-minutes", type=int, default=10)
    parser.add_argument("--burst-seconds", type=int, default=60)
    parser.add_argument("--receipt-retention-ms", type=int, default=120_000)
    parser.add_argument("--warmup-seconds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=FIGURES)
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress, as it comes
    auto = args.rate == "auto"
    if not auto and not args.rate.isdigit():
        parser.error("--rate is a number of events per second, or auto")
    if args.minutes < 1 or args.burst_seconds < 1 or args.receipt_retention_ms < 1:
        parser.error("--minutes, --burst-seconds and --receipt-retention-ms must be positive")
    server_url = os.environ.get("DATABASE_URL")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not server_url or not bootstrap:
        print(
            "bench.endurance: DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are needed (.services/env)",
            file=sys.stderr,
        )
        return 2
    plan = Plan(
        minutes=args.minutes,
        rate=1000 if auto else int(args.rate),
        burst_every_minutes=args.burst_every_minutes,
        burst_seconds=args.burst_seconds,
        retention_ms=args.receipt_retention_ms,
        warmup_seconds=args.warmup_seconds,
    )
    try:
        return asyncio.run(
            until_signalled(
                endurance(
                    plan, server_url=server_url, bootstrap=bootstrap, out=args.out, auto_rate=auto
                )
            )
        )
    except (RuntimeError, OSError, asyncpg.PostgresError, TimeoutError) as exc:
        print(f"bench.endurance: the run did not complete: {exc}", file=sys.stderr)
        return 3
    except asyncio.CancelledError:
        print("bench.endurance: stopped by a signal; no figures written", file=sys.stderr)
        return 3


async def until_signalled(work: Coroutine[Any, Any, int]) -> int:
    """``work`` as a task that SIGTERM and SIGINT cancel, so that its clean-up (the relay
    stopped, the topic and the database dropped) runs."""
    task = asyncio.ensure_future(work)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, task.cancel)
    return await task


if __name__ == "__main__":
    raise SystemExit(main())
