"""Peer comparison (the targets in docs/benchmarks.md): the relay vs Debezium vs the raw aiokafka producer.

Runs every system through the same catch-up and latency measurements (bench/peers/),
alternating them over BENCH_RUNS runs, and keeps every run's raw figures in
docs/bench/results.json (BENCH_RESULTS overrides the path). ``python -m bench.report``
turns them into PASS/FAIL per target, folds them into docs/bench/history.jsonl and draws
the plot; ``make bench`` runs both.

PostgreSQL is DATABASE_URL's server: Debezium needs ``wal_level=logical``, which the
project's PostgreSQL 15 has, so every system reads from that same server.
"""

from __future__ import annotations

import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import pytest

from bench.peers import debezium
from bench.peers.comparison import Comparison, Scale
from bench.report.files import RESULTS, current_commit, write_results

pytestmark = pytest.mark.bench

SCALE = Scale.from_env()
# Generous: Debezium's catch-up on a busy 2-core machine runs at a few thousand events/s.
TIMEOUT = SCALE.runs * (1200 + SCALE.events // 60 + 8 * SCALE.seconds)


@pytest.mark.timeout(TIMEOUT)
async def test_peer_comparison(kafka_bootstrap: str, tmp_path: Path) -> None:
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        pytest.fail("the peer comparison needs DATABASE_URL (PostgreSQL with wal_level=logical)")
    admin = await asyncpg.connect(server_url)
    try:
        wal_level = await admin.fetchval("SHOW wal_level")
        leftovers = await debezium.drop_leftover_slots(admin)
        server_version = await admin.fetchval("SHOW server_version")
        # Every system connects as this URL says; TLS costs the relay's side of the
        # connection several microseconds per event (docs/benchmarks.md, "TLS to PostgreSQL").
        tls = await admin.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await admin.close()
    if wal_level != "logical":
        pytest.fail(f"DATABASE_URL's server has wal_level={wal_level}; Debezium needs logical")
    if leftovers:
        print(f"\ndropped {len(leftovers)} replication slot(s) an interrupted run left")
    debezium.ensure_classpath()

    comparison = Comparison(server_url, kafka_bootstrap, tmp_path, SCALE)
    print(
        f"\nPEERS {SCALE.events} events x {SCALE.runs} runs, latency at {SCALE.rate}/s "
        f"for {SCALE.seconds} s; PostgreSQL {server_version} {'with' if tls else 'without'} TLS"
    )
    rows = await comparison.run()

    path = Path(os.environ.get("BENCH_RESULTS", RESULTS))
    document = {
        "commit": current_commit(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scale": {
            "events": SCALE.events,
            "runs": SCALE.runs,
            "rate": SCALE.rate,
            "seconds": SCALE.seconds,
            "warmup_seconds": SCALE.warmup_seconds,
            "systems": list(SCALE.systems),
            "phases": list(SCALE.phases),
        },
        "machine": {
            "cores": os.cpu_count(),
            "load_average_at_end": os.getloadavg(),
            "python": platform.python_version(),
            "postgresql": server_version,
            "postgresql_tls": tls,
        },
        "runs": rows,
    }
    write_results(path, document)
    print(f"raw figures: {path}")
    # Completeness, not speed: every system delivered every event of every run.
    assert len(rows) == SCALE.measurements() + SCALE.after_catch_up_measurements()
