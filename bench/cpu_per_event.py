"""The relay's CPU per event at a steady rate, for one or more source trees, runs alternated.

For each run, rate and source: a fresh database migrated by that source's own ``migrate``,
a fresh topic, the relay from that source as deployed (``run --relay-only`` beside one
``run --no-relay`` sidecar; ``--no-sidecar``: the relay alone), four writer connections
committing single 1 KiB events on 1,000 keys at the rate (bench/endurance.py's writers), a
warm-up not counted, then a steady window: CPU seconds over the events published in it
(no backlog, no catch-up). Printed per event, in µs: the relay's process, the sidecar's,
and PostgreSQL's processes of that database by whom they serve (bench/database_stats.py:
the relay's backends, the sidecar's, the writers', autovacuum; the cluster's shared
processes apart), and the statements' execution time from pg_stat_statements. After each
window bench/round_trip_floor.py measures the bare round trips in a process of its own, back
to back and paced at the relay's interval between fetches in the window, and the line gives
the relay's CPU over both floors at the window's statement counts.

    python -m bench.cpu_per_event [--source PATH ...] [--rate 1000 ...] [--seconds 60]
        [--warmup-seconds 10] [--runs 1] [--no-sidecar] [--json FILE]

Several ``--source`` (another checkout or a ``git worktree`` of an earlier commit) are
measured in turn, each run starting with the next one, so a machine that drifts favours
none. Exit 0, or 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench import database_stats, round_trip_floor
from bench.deployment import REPO, start_relay_process
from bench.endurance import AGGREGATE, LANES, Ledger, write
from bench.peers import measure
from bench.runs import main_runs, rotated
from tests.support.services import with_database

SAMPLE_S = 1.0


async def _migrated_database(server_url: str, source: Path) -> tuple[str, str]:
    """A fresh database migrated by ``source``'s own ``migrate``; its name and URL."""
    name = f"outbox_relay_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(server_url, name)
    migrate = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        "migrate",
        env={**os.environ, "DATABASE_URL": url},
        cwd=source,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await migrate.communicate()
    if migrate.returncode != 0:
        raise RuntimeError(
            f"migrate from {source} exited {migrate.returncode}: {err.decode()[-300:]}"
        )
    return name, url


async def _published(consumer: AIOKafkaConsumer, topic: str) -> int:
    tps = [TopicPartition(topic, p) for p in range(measure.PARTITIONS)]
    return sum((await consumer.end_offsets(tps)).values())


async def measure_once(
    server_url: str,
    bootstrap: str,
    source: Path,
    *,
    rate: int,
    seconds: int,
    warmup_s: int,
    sidecar: bool,
) -> dict[str, Any]:
    """One steady window of one source at one rate: CPU µs per event published."""
    name, url = await _migrated_database(server_url, source)
    namespace = f"c{uuid.uuid4().hex[:10]}"
    topic = f"{namespace}.{AGGREGATE}"
    await measure.create_topic(bootstrap, topic)
    conns: list[asyncpg.Connection] = []
    monitor = None
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        monitor = await asyncpg.connect(url)
        await database_stats.ensure_extensions(monitor)
        conns = [await asyncpg.connect(url) for _ in range(LANES)]
        with tempfile.TemporaryDirectory(prefix="cpu-per-event-") as workdir:
            relay = await start_relay_process(
                url, bootstrap, namespace, Path(workdir), source=source, sidecar=sidecar
            )
            try:
                await asyncio.sleep(3)  # lanes claimed, producer connected
                cpu = database_stats.DatabaseCpu(
                    writer_pids={c.get_server_pid() for c in conns},
                    own_pids={monitor.get_server_pid()},
                    clients={relay.pid: "relay"}
                    | ({relay.sidecar.pid: "sidecar"} if relay.sidecar else {}),
                )
                processes = database_stats.CpuTotals()
                pairs: list[tuple[int, str | None]] = [(relay.pid, "relay_process")]
                if relay.sidecar is not None:
                    pairs.append((relay.sidecar.pid, "sidecar_process"))
                ledger = Ledger(time.time())
                began = time.perf_counter()
                until = began + warmup_s + seconds
                writers = [
                    asyncio.create_task(write(c, ledger, i, rate=rate, lanes=LANES, until=until))
                    for i, c in enumerate(conns)
                ]
                await asyncio.sleep(warmup_s)
                processes.take(pairs)
                await cpu.sample(monitor)
                statements = await database_stats.read_statements(monitor)
                published = await _published(consumer, topic)
                committed = ledger.total
                window_began = time.perf_counter()
                while time.perf_counter() < until - SAMPLE_S / 2:
                    await asyncio.sleep(SAMPLE_S)
                    processes.take(pairs)
                    await cpu.sample(monitor)
                    if relay.returncode is not None:
                        raise RuntimeError(f"the relay from {source} exited {relay.returncode}")
                processes.take(pairs)
                await cpu.sample(monitor)
                window_s = time.perf_counter() - window_began
                events = await _published(consumer, topic) - published
                committed = ledger.total - committed
                costs = database_stats.statement_costs(
                    statements, await database_stats.read_statements(monitor)
                )
                await asyncio.gather(*writers)
            finally:
                relay.terminate()
                await relay.wait()
        fetches = sum(c.calls for c in costs if c.name == database_stats.FETCH_STATEMENT)
        floor = await _round_trip_floor(url, bootstrap, topic, pace_s=window_s / max(fetches, 1))
    finally:
        await consumer.stop()
        for conn in (*conns, *([monitor] if monitor else [])):
            await conn.close()
        await measure.delete_topics(bootstrap, [topic])
        admin = await asyncpg.connect(server_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()

    def us(seconds_used: float) -> float:
        return round(seconds_used * 1e6 / max(events, 1), 1)

    groups = cpu.snapshot()
    own = processes.snapshot()
    calls_per_event = {c.name: round(c.calls / max(events, 1), 3) for c in costs[:8]}
    floor_us = round_trip_floor.floor_per_event(floor, calls_per_event)
    paced_floor_us = round_trip_floor.floor_per_event(floor["paced"], calls_per_event)
    return {
        "source": str(source),
        "rate": rate,
        "window_s": round(window_s, 1),
        "committed_rate": round(committed / window_s),
        "published": events,
        "relay_us": us(own.get("relay_process", 0.0)),
        "sidecar_us": us(own.get("sidecar_process", 0.0)),
        "postgres_us": us(sum(v for g, v in groups.items() if g != "cluster")),
        "postgres_by_group_us": {g: us(v) for g, v in groups.items()},
        "statements_us": {c.name: round(c.total_ms * 1000 / max(events, 1), 1) for c in costs[:8]},
        "statement_calls_per_event": calls_per_event,
        "round_trip_floor": floor,
        "floor_us": floor_us,
        "paced_floor_us": paced_floor_us,
        "load_average": round(os.getloadavg()[0], 2),
    }


async def _round_trip_floor(
    url: str, bootstrap: str, topic: str, *, pace_s: float
) -> dict[str, Any]:
    """bench/round_trip_floor.py in a process of its own, once the relay has stopped, paced
    also at ``pace_s`` (the relay's interval between fetches in the window)."""
    floor = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.round_trip_floor",
        "--topic",
        topic,
        "--pace-ms",
        f"{pace_s * 1000:.3f}",
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": url, "KAFKA_BOOTSTRAP_SERVERS": bootstrap},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await floor.communicate()
    if floor.returncode != 0:
        raise RuntimeError(f"bench.round_trip_floor exited {floor.returncode}")
    result: dict[str, Any] = json.loads(out)
    return result


def line(figures: dict[str, Any]) -> str:
    """One measurement, one line."""
    groups = figures["postgres_by_group_us"]
    rt = figures["round_trip_floor"]
    paced = rt["paced"]

    def trips(floor: dict[str, Any]) -> str:
        return (
            f"PostgreSQL round trip {floor['postgres_round_trip_us']:.0f}, produce "
            f"{floor['produce_us']:.0f}, notification {floor['notification_us']:.0f}"
        )

    split = ", ".join(f"{g} {v:.0f}" for g, v in sorted(groups.items()) if v)
    return (
        f"{Path(figures['source']).name or figures['source']:>14} {figures['rate']:>5}/s "
        f"(writers {figures['committed_rate']}/s, {figures['published']} events in "
        f"{figures['window_s']:.0f} s): relay {figures['relay_us']:.0f} us/event, sidecar "
        f"{figures['sidecar_us']:.0f}, PostgreSQL {figures['postgres_us']:.0f} ({split}); "
        f"load {figures['load_average']}\n"
        f"    round trips' floor {figures['floor_us']:.0f} us/event back to back "
        f"({trips(rt)}): relay / floor {figures['relay_us'] / max(figures['floor_us'], 1):.2f}\n"
        f"    paced one per {paced['pace_ms']:.2f} ms like the relay's fetches "
        f"{figures['paced_floor_us']:.0f} us/event ({trips(paced)}): relay / paced floor "
        f"{figures['relay_us'] / max(figures['paced_floor_us'], 1):.2f}"
    )


def medians(results: list[dict[str, Any]], rates: list[int], sources: list[Path]) -> str:
    """Each source's medians at each rate."""
    lines = ["medians (relay / PostgreSQL us per event):"]
    for rate in rates:
        for source in sources:
            mine = [r for r in results if r["rate"] == rate and r["source"] == str(source)]
            relay = statistics.median(r["relay_us"] for r in mine)
            postgres = statistics.median(r["postgres_us"] for r in mine)
            floor = statistics.median(r["relay_us"] / max(r["floor_us"], 1) for r in mine)
            paced = statistics.median(r["relay_us"] / max(r["paced_floor_us"], 1) for r in mine)
            lines.append(
                f"  {source} at {rate}/s: relay {relay:.0f}, PostgreSQL {postgres:.0f}, "
                f"relay / its round trips' floor {floor:.2f} back to back, {paced:.2f} "
                f"paced ({len(mine)} runs)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse, measure, print; 2 on a bad argument or missing services."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--source", type=Path, action="append", help="a checkout (default: this one)"
    )
    parser.add_argument("--rate", type=int, action="append", help="events/s (default 100 and 1000)")
    parser.add_argument("--seconds", type=int, default=60, help="the counted window")
    parser.add_argument("--warmup-seconds", type=int, default=10)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--no-sidecar", dest="sidecar", action="store_false")
    parser.add_argument("--json", type=Path, help="append each measurement as a JSON line")
    args = parser.parse_args(argv)
    args.rate = args.rate or [100, 1000]
    for source in args.source or []:
        if not (source / "outbox_relay" / "__main__.py").is_file():
            parser.error(f"--source {source}: not a checkout of this project")
    if min(args.rate) < 1 or args.seconds < 5 or args.runs < 1:
        parser.error("--rate must be positive, --seconds at least 5, --runs at least 1")
    sources: list[Path] = args.source or [REPO]

    def conditions(run: int) -> list[tuple[int, Path]]:
        """Each rate, each source in turn (the first one moving on by one a run)."""
        return [(rate, source) for rate in args.rate for source in rotated(sources, run)]

    async def measure_cell(
        server_url: str, bootstrap: str, cell: tuple[int, Path]
    ) -> dict[str, Any]:
        rate, source = cell
        return await measure_once(
            server_url,
            bootstrap,
            source,
            rate=rate,
            seconds=args.seconds,
            warmup_s=args.warmup_seconds,
            sidecar=args.sidecar,
        )

    return main_runs(
        "cpu_per_event",
        runs=args.runs,
        conditions=conditions,
        measure=measure_cell,
        show=line,
        medians=lambda results: medians(results, args.rate, sources),
        json_lines=args.json,
    )


if __name__ == "__main__":
    raise SystemExit(main())
