"""Relay memory on a 1,000,000-event backlog (target in docs/benchmarks.md: ≤ 150 MB RSS).

``outbox-relay run`` drains the backlog in its own process while its resident set size is
sampled from /proc; the peak is printed and, once every event is checked delivered (on the
broker, with its receipt), kept in memory.json beside the comparison's figures
(bench.report.memory_figures: BENCH_RESULTS's directory, or docs/bench/), where ``make
bench``'s report judges it on the target's 1,000,000 events. Memory is bounded by design:
one fetch of ``--batch-size`` rows and at most ``--max-in-flight-batches`` batches are held
at a time.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from bench.conftest import Topics, assert_delivered, start_relay_process
from bench.report import memory_figures, write_results
from bench.test_drain import FILL_BACKLOG, KEYS, PAYLOAD_FILL

pytestmark = pytest.mark.bench

BACKLOG = int(os.environ.get("BENCH_BACKLOG", "1000000"))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def test_relay_memory_on_a_large_backlog(
    bench_database: str, kafka_bootstrap: str, bench_topics: Topics, tmp_path: Path
) -> None:
    namespace = f"m{uuid.uuid4().hex[:8]}"
    topic = await bench_topics.create(f"{namespace}.bench")
    conn = await asyncpg.connect(bench_database)
    started = time.perf_counter()
    for offset in range(0, BACKLOG, 100_000):
        await conn.execute(
            FILL_BACKLOG, "bench", min(100_000, BACKLOG - offset), KEYS, PAYLOAD_FILL
        )
    await conn.execute("VACUUM ANALYZE outbox")
    fill_s = time.perf_counter() - started
    relay = await start_relay_process(bench_database, kafka_bootstrap, namespace, tmp_path)
    peak = 0.0
    drain_started = time.perf_counter()
    try:
        while await conn.fetchval("SELECT EXISTS (SELECT 1 FROM outbox)"):
            peak = max(peak, _rss_mb(relay.pid))
            await asyncio.sleep(0.25)
        drain_s = time.perf_counter() - drain_started
        peak = max(peak, _rss_mb(relay.pid))
        # Correctness, not speed: an empty outbox is not delivery.
        await assert_delivered(conn, kafka_bootstrap, topic, BACKLOG)
    finally:
        relay.terminate()
        await relay.wait()
        await conn.close()
    # make bench's report (bench/report.py) judges the memory target from these figures.
    path = memory_figures()
    write_results(
        path,
        {
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "backlog": BACKLOG,
            "peak_rss_mb": round(peak, 1),
            "drain_s": round(drain_s, 1),
            "rate": round(BACKLOG / drain_s),
        },
    )
    print(
        f"\nMEMORY {BACKLOG} events of 1 KiB (backlog filled in {fill_s:.0f} s)\n"
        f"  drained in {drain_s:.0f} s ({BACKLOG / drain_s:.0f} events/s), every event on the"
        " broker with its receipt\n"
        f"  peak relay RSS: {peak:.0f} MB (target <= 150 MB on 1,000,000 events, judged by"
        f" bench.report)\n"
        f"  figures: {path}"
    )
