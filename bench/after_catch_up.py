"""Where the relay's steady-state time goes right after a catch-up: the steady phase of
make bench's latency measurement on a fresh database and right after a catch-up on the same
database, side by side, with what each candidate cost measured in the same steady window.

Conditions (each run measures every selected one, in turn, each run starting with the next):

- ``fresh``: a fresh database, the relay as deployed, 20 warm-up events, then the window;
- ``after``: the same after a backlog of ``--events`` (written while the relay is stopped,
  then caught up): the window starts as the backlog's last record reaches the broker;
- ``after-vacuum``: ``after``, with ``VACUUM`` on the outbox once the backlog is published
  (the dead rows and index entries of the catch-up gone): ``after`` minus this is the
  share of the dead tuples;
- ``after-no-sidecar``: ``after`` with the relay alone (``run --relay-only``, no sidecar):
  ``after`` minus this is the sidecar's probes' share.

In each window: commit → broker append p50/p99 (bench/peers' method: paced writers, the
broker's LogAppendTime), the writers' reached rate, the relay's CPU per event, PostgreSQL's
per event by whom it serves and its autovacuum workers (bench/database_stats.py), each
statement's execution time per event, calls and blocks per call (pg_stat_statements of
the window alone), autovacuum and analyze runs, the outbox's dead tuples before and after.
Right as the window starts, ``EXPLAIN (ANALYZE, BUFFERS)`` of the relay's cursor fetch of a
few rows written for it inside a rolled-back transaction: with the look-back of the
``earlier`` subquery (``$5`` the fetch's start) and without (``$5`` 0), and a full pass's
first fetch (from seq 0, through whatever the catch-up left dead in the indexes), each
planned as the relay's session plans it (its planner settings), custom and generic. Their
walk kills the dead index entries it meets before the window, which the relay's first
fetches would otherwise visit in the heap: ``after`` starts a little kinder than make
bench's phase, which has no EXPLAIN. ``--profile`` records the relay process with py-spy
over the window (py-spy must be on PATH) and splits its samples by step: wake-up, fetch,
send, bookkeeping, socket reads and TLS, the event loop's own frames, the rest.

    python -m bench.after_catch_up [--conditions fresh,after,after-vacuum,after-no-sidecar]
        [--runs 1] [--events 200000] [--rate 1000] [--seconds 20] [--profile] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

from bench import database_stats
from bench.deployment import fresh_database, start_relay_process
from bench.peers import measure
from bench.peers.comparison import WRITER_LANES
from bench.peers.workload import (
    DRAIN_AGGREGATE,
    LATENCY_AGGREGATE,
    OutboxWriters,
    fill_backlog,
    paced,
)
from bench.runs import main_runs, rotated
from relay.records import MAX_FETCHED_ROW_BYTES
from relay.sql import FETCH_READY
from relay.store import RELAY_SESSION_SETTINGS

CONDITIONS = ("fresh", "after", "after-vacuum", "after-no-sidecar")
WARMUP_EVENTS = 20
FETCH_MAX_BYTES = 8 * 2**20  # the relay's default --fetch-max-bytes
PLANNED_ROWS = 5

# The steps of one event in the relay, by the frames of a py-spy sample: a sample counts
# for the first step, in this order, with a frame anywhere in its stack. Reading a socket
# (asyncpg's and aiokafka's protocols, asyncio's TLS) runs from the event loop's callbacks,
# below no frame of the relay's, and is a step of its own. Every sample of the loop has the
# loop's frames at its root, so the loop's own step is a sample whose innermost frame is
# one of them; the rest of the relay's code is "other".
STEPS = (
    ("bookkeeping (record_outcome)", ("record_outcome", "prune_receipts")),
    ("fetch (fetch_ready)", ("fetch_ready",)),
    (
        "send (mapping, batches, producer)",
        ("_send ", "relay/records.py", "relay/publisher.py", "relay/producer.py", "aiokafka/"),
    ),
    ("wake-up (notifications)", ("relay/wakeups.py", "_process_notification")),
    (
        "socket reads and TLS (protocol callbacks)",
        ("sslproto.py", "_read_ready", "selector_events.py", "ssl.py"),
    ),
)
EVENT_LOOP = "event loop (select, scheduling)"
EVENT_LOOP_FRAMES = ("asyncio/base_events.py", "selectors.py", "asyncio/events.py")


def step_of(stack: str) -> str:
    """The step a sampled stack (py-spy's raw format: frames joined by ';') belongs to."""
    for step, patterns in STEPS:
        if any(pattern in stack for pattern in patterns):
            return step
    if any(frame in stack.rsplit(";", 1)[-1] for frame in EVENT_LOOP_FRAMES):
        return EVENT_LOOP
    return "other"


def profile_shares(folded: str) -> dict[str, float]:
    """Each step's share of the samples of a py-spy raw (folded) profile."""
    counts: Counter[str] = Counter()
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[step_of(stack)] += int(count)
    total = sum(counts.values()) or 1
    return {step: round(n / total, 3) for step, n in counts.most_common()}


EXPLAIN_SETTINGS = {k: v for k, v in RELAY_SESSION_SETTINGS.items() if k != "application_name"}


async def explain_fetch(url: str, namespace: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of a cursor fetch of PLANNED_ROWS rows written for it in a
    transaction that is rolled back, with and without the look-back, custom and generic."""
    conn = await asyncpg.connect(url, server_settings=EXPLAIN_SETTINGS)
    plans: dict[str, Any] = {}
    try:
        async with conn.transaction():
            cursor = await conn.fetchval("SELECT coalesce(max(seq), 0) FROM outbox")
            await conn.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
                "SELECT 'explain', 'key-' || g, 'bench.event', "
                "jsonb_build_object('n', g, 'fill', repeat('x', 1000)) "
                "FROM generate_series(1, $1::int) g",
                PLANNED_ROWS,
            )
            cursor = max(
                cursor,
                (await conn.fetchval("SELECT min(seq) FROM outbox WHERE aggregatetype = 'explain'"))
                - 1,
            )
            await conn.execute(
                "PREPARE relay_fetch(smallint[], bigint, int, text, bigint, int, int, "
                "text) AS " + FETCH_READY
            )
            template = await conn.fetchval(
                "SELECT quote_literal($1::text)", f"{namespace}.{{aggregatetype}}"
            )
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
                for look_back, after, start in (
                    ("look-back", cursor, cursor),
                    ("no look-back", cursor, 0),
                    ("full pass", 0, 0),  # a pass's first fetch, from the beginning
                ):
                    # EXECUTE takes no bound parameters: the values are written in, every
                    # one an integer but the template, quoted by the server
                    rows = await conn.fetch(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE relay_fetch("
                        f"NULL, {int(after)}, 1000, {template}, {int(start)}, "
                        f"{int(MAX_FETCHED_ROW_BYTES)}, {int(FETCH_MAX_BYTES)}, '{{}}')"
                    )
                    plan = json.loads(rows[0][0])[0]
                    plans[f"{mode.removeprefix('force_').removesuffix('_plan')}, {look_back}"] = (
                        _plan_summary(plan)
                    )
            await conn.execute("DEALLOCATE relay_fetch")
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await conn.close()
    return plans


class _Rollback(Exception):
    """Leaves the explained rows unwritten."""


def _plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """The execution time, the buffers, and each index scan with its rows and buffers."""
    scans: list[str] = []

    def walk(node: dict[str, Any], subplan: str | None) -> None:
        subplan = node.get("Subplan Name", subplan)
        if "Index Name" in node:
            scans.append(
                f"{node['Node Type']} {node['Index Name']}"
                f"{' (' + subplan + ')' if subplan else ''}: "
                f"loops {node.get('Actual Loops')}, rows {node.get('Actual Rows')}, "
                f"buffers {node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0)}"
            )
        for child in node.get("Plans", []):
            walk(child, subplan)

    walk(plan["Plan"], None)
    return {
        "execution_ms": round(plan["Execution Time"], 3),
        "buffers": plan["Plan"].get("Shared Hit Blocks", 0)
        + plan["Plan"].get("Shared Read Blocks", 0),
        "index_scans": scans,
    }


async def _reset_statements(conn: asyncpg.Connection) -> None:
    await conn.execute(
        "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database "
        "WHERE datname = current_database()), 0)"
    )


async def _dead(conn: asyncpg.Connection) -> dict[str, Any]:
    tables = await database_stats.table_stats(conn)
    outbox = tables.get("outbox", {})
    return {
        "outbox_dead": outbox.get("dead"),
        "outbox_mb": round(outbox.get("total_bytes", 0) / 2**20, 1),
        "autovacuums": outbox.get("autovacuums"),
        "autoanalyzes": outbox.get("autoanalyzes"),
    }


async def measure_condition(
    server_url: str, bootstrap: str, condition: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One condition's steady window."""
    namespace = f"a{uuid.uuid4().hex[:10]}"
    backlog_topic, topic = f"{namespace}.{DRAIN_AGGREGATE}", f"{namespace}.{LATENCY_AGGREGATE}"
    figures: dict[str, Any] = {"condition": condition}
    async with fresh_database(server_url) as url:
        monitor = await asyncpg.connect(url)
        try:
            await database_stats.ensure_extensions(monitor)
            for t in (backlog_topic, topic):
                await measure.create_topic(bootstrap, t)
            after = condition.startswith("after")
            if after:
                await fill_backlog(url, DRAIN_AGGREGATE, args.events)
            with tempfile.TemporaryDirectory(prefix="after-catch-up-") as workdir:
                relay = await start_relay_process(
                    url,
                    bootstrap,
                    namespace,
                    Path(workdir),
                    sidecar=condition != "after-no-sidecar",
                )
                try:
                    if after:
                        started = time.monotonic()
                        await measure.wait_for_count(
                            bootstrap,
                            backlog_topic,
                            args.events,
                            timeout=600,
                            alive=lambda: relay.returncode is None,
                        )
                        figures["catch_up_s"] = round(time.monotonic() - started, 1)
                    if condition == "after-vacuum":
                        began = time.monotonic()
                        await monitor.execute("VACUUM outbox")
                        figures["vacuum_s"] = round(time.monotonic() - began, 2)
                    figures["explain"] = await explain_fetch(url, namespace)
                    figures["index_tuples_before"] = await database_stats.index_tuples(monitor)
                    async with OutboxWriters(url, WRITER_LANES) as writers:
                        for n in range(WARMUP_EVENTS):
                            await writers.emit(n % WRITER_LANES, n)
                        await measure.wait_for_count(bootstrap, topic, WARMUP_EVENTS, timeout=120)
                        cpu = database_stats.DatabaseCpu(
                            own_pids={monitor.get_server_pid()},
                            clients={relay.pid: "relay"}
                            | ({relay.sidecar.pid: "sidecar"} if relay.sidecar else {}),
                        )
                        cpu.writer_pids = writers.server_pids()
                        processes = database_stats.CpuTotals()
                        pairs: list[tuple[int, str | None]] = [(relay.pid, "relay")]
                        await _reset_statements(monitor)
                        dead_before = await _dead(monitor)
                        processes.take(pairs)
                        await cpu.sample(monitor)
                        profiler = (
                            asyncio.create_task(_profile(relay.pid, args.seconds))
                            if args.profile
                            else None
                        )
                        done = asyncio.Event()
                        sampler = asyncio.create_task(_sample(cpu, processes, pairs, monitor, done))
                        waits = asyncio.create_task(
                            _writer_waits(server_url, cpu.writer_pids, done)
                        )
                        began = time.perf_counter()
                        sent = await paced(
                            writers.emit, rate=args.rate, seconds=args.seconds, lanes=WRITER_LANES
                        )
                        writing_s = time.perf_counter() - began
                        await measure.wait_for_count(
                            bootstrap, topic, WARMUP_EVENTS + len(sent), timeout=180
                        )
                        done.set()
                        await sampler
                        figures["writer_waits"] = await waits
                        processes.take(pairs)
                        await cpu.sample(monitor)
                        costs = database_stats.statement_costs(
                            {}, await database_stats.read_statements(monitor)
                        )
                        dead_after = await _dead(monitor)
                        if profiler is not None:
                            figures["profile"] = await profiler
                finally:
                    relay.terminate()
                    await relay.wait()
            appended = await measure.append_times_by_id(bootstrap, topic, timeout=120)
        finally:
            await monitor.close()
            await measure.delete_topics(bootstrap, [backlog_topic, topic])
    events = len(sent)
    summary = measure.summarize(measure.latencies_ms(sent, appended))

    def us(seconds: float) -> float:
        return round(seconds * 1e6 / max(events, 1), 1)

    figures |= {
        "p50": summary.p50,
        "p99": summary.p99,
        "max": summary.max,
        "writers_rate": round(events / writing_s),
        "relay_us": us(processes.snapshot().get("relay", 0.0)),
        "postgres_us": {group: us(v) for group, v in cpu.snapshot().items()},
        "statements": [
            {
                "name": c.name,
                "us_per_event": round(c.total_ms * 1000 / max(events, 1), 1),
                "calls_per_event": round(c.calls / max(events, 1), 3),
                "mean_ms": round(c.total_ms / max(c.calls, 1), 3),
                "blocks_per_call": round(c.blocks / max(c.calls, 1), 1),
            }
            for c in costs[:10]
        ],
        "dead_before": dead_before,
        "dead_after": dead_after,
        "load_average": round(os.getloadavg()[0], 2),
    }
    return figures


# What a writer's backend waits for: pg_stat_activity's wait event, or "running" (on a
# CPU or ready for one). A committing transaction that sent a NOTIFY holds a lock on
# database 0 (class pg_database, 1262) from queueing its notification through its WAL
# flush: every notifying commit of the cluster, of every database, takes turns there.
WAITS = """
SELECT coalesce(a.wait_event_type || ':' || a.wait_event, 'running') AS waiting,
       l.classid IS NOT NULL AND l.classid = 1262 AND l.objid = 0 AS notify_lock
FROM pg_catalog.pg_stat_activity a
LEFT JOIN pg_catalog.pg_locks l ON l.pid = a.pid AND NOT l.granted
WHERE a.pid = ANY($1::int[]) AND a.state = 'active'
"""


async def _writer_waits(url: str, pids: set[int], done: asyncio.Event) -> dict[str, float]:
    """What the writers' backends wait for while they work, sampled every 50 ms: each
    wait's share of the samples of a busy writer (``notify commit lock``: the lock every
    notifying commit of the cluster takes in turn)."""
    conn = await asyncpg.connect(url)
    counts: Counter[str] = Counter()
    try:
        while not done.is_set():
            for row in await conn.fetch(WAITS, list(pids)):
                counts["notify commit lock" if row["notify_lock"] else row["waiting"]] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=0.05)
    finally:
        await conn.close()
    total = sum(counts.values()) or 1
    return {what: round(n / total, 3) for what, n in counts.most_common(6)}


async def _sample(
    cpu: database_stats.DatabaseCpu,
    processes: database_stats.CpuTotals,
    pairs: list[tuple[int, str | None]],
    monitor: asyncpg.Connection,
    done: asyncio.Event,
) -> None:
    """Every second until ``done``: each process's CPU (an autovacuum worker's too)."""
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=1)
        processes.take(pairs)
        await cpu.sample(monitor)


async def _profile(pid: int, seconds: int) -> dict[str, Any]:
    """py-spy over the window: each step's share of the relay's samples."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {"error": "py-spy not on PATH"}
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as out:
        path = Path(out.name)
    process = await asyncio.create_subprocess_exec(
        spy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(seconds),
        "--rate",
        "200",
        "--format",
        "raw",
        "--nonblocking",
        "--output",
        str(path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await process.communicate()
    keep = Path(tempfile.gettempdir()) / f"after-catch-up-profile-{pid}.txt"
    folded = await asyncio.to_thread(_keep_profile, path, keep)
    if not folded:
        return {"error": err.decode()[-300:]}
    return {"samples_file": str(keep), "shares": profile_shares(folded), **_top_frames(folded)}


def _keep_profile(written: Path, keep: Path) -> str:
    """py-spy's output moved to ``keep``; its text (empty when it wrote none)."""
    folded = written.read_text() if written.is_file() else ""
    if folded:
        keep.write_text(folded)
    written.unlink(missing_ok=True)
    return folded


def _top_frames(folded: str, top: int = 12) -> dict[str, Any]:
    """The innermost frames that took most samples."""
    leaves: Counter[str] = Counter()
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaf = stack.split(";")[-1]
            leaves[re.sub(r":\d+\)", ")", leaf)] += int(count)
    total = sum(leaves.values()) or 1
    return {"top_leaves": [(leaf, round(n / total, 3)) for leaf, n in leaves.most_common(top)]}


def line(f: dict[str, Any]) -> str:
    """One condition's window, one line."""
    pg = f["postgres_us"]
    top = ", ".join(f"{s['name']} {s['us_per_event']:.0f}" for s in f["statements"][:4])
    return (
        f"{f['condition']:>16}: p50 {f['p50']:.1f} p99 {f['p99']:.1f} ms, writers "
        f"{f['writers_rate']}/s, relay {f['relay_us']:.0f} us/ev, PostgreSQL relay "
        f"{pg.get('relay', 0):.0f} sidecar {pg.get('sidecar', 0):.0f} writers "
        f"{pg.get('writers', 0):.0f} autovacuum {pg.get('autovacuum', 0):.0f} us/ev; "
        f"dead {f['dead_before']['outbox_dead']} -> {f['dead_after']['outbox_dead']}, "
        f"autovacuums {f['dead_after']['autovacuums'] - f['dead_before']['autovacuums']}; "
        f"statements us/ev: {top}; writers wait: {f.get('writer_waits')}; "
        f"load {f['load_average']}"
    )


def report(figures: dict[str, Any]) -> str:
    """One condition's window: its line, its plans and, with ``--profile``, its profile."""
    lines = [line(figures)]
    for mode, plan in figures["explain"].items():
        lines.append(
            f"    EXPLAIN {mode}: {plan['execution_ms']} ms, {plan['buffers']} buffers; "
            + "; ".join(plan["index_scans"])
        )
    if "profile" in figures:
        lines.append(f"    profile: {figures['profile'].get('shares') or figures['profile']}")
    return "\n".join(lines)


def medians(results: list[dict[str, Any]], conditions: list[str]) -> str:
    """Each condition's medians."""
    lines = ["medians:"]
    for condition in conditions:
        mine = [r for r in results if r["condition"] == condition]
        lines.append(
            f"  {condition:>16}: p50 {statistics.median(r['p50'] for r in mine):.1f}, p99 "
            f"{statistics.median(r['p99'] for r in mine):.1f} ms, relay "
            f"{statistics.median(r['relay_us'] for r in mine):.0f} us/ev, writers "
            f"{statistics.median(r['writers_rate'] for r in mine):.0f}/s ({len(mine)} runs)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print; 2 on a bad argument or missing services."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--conditions", default=",".join(CONDITIONS))
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path, help="append each window as a JSON line")
    args = parser.parse_args(argv)
    args.conditions = args.conditions.split(",")
    unknown = set(args.conditions) - set(CONDITIONS)
    if unknown:
        parser.error(f"unknown conditions: {', '.join(sorted(unknown))}")

    async def measure_cell(server_url: str, bootstrap: str, condition: str) -> dict[str, Any]:
        return await measure_condition(server_url, bootstrap, condition, args)

    return main_runs(
        "after_catch_up",
        runs=args.runs,
        conditions=lambda run: rotated(args.conditions, run),
        measure=measure_cell,
        show=report,
        medians=lambda results: medians(results, args.conditions),
        json_lines=args.json,
    )


if __name__ == "__main__":
    raise SystemExit(main())
