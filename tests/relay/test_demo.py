"""``outbox-relay demo`` end to end: every terminal scoring job's event reaches Kafka once."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import asyncpg

from tests.relay.harness import consume

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_demo_runs_the_whole_system_and_every_outcome_is_published(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{topic_namespace}.{{aggregatetype}}",
        "OUTBOX_RELAY_LOG_FORMAT": "json",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        "demo",
        "--policy",
        str(REPO / "docs" / "policy.example.toml"),
        "--listen",
        f"127.0.0.1:{_free_port()}",
        "--jobs",
        "150",
        "--exit-when-done",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=180)
    assert process.returncode == 0, stderr.decode()[-2000:]
    assert b"status page: http://127.0.0.1:" in stdout
    finished = [
        json.loads(line)
        for line in stderr.decode().splitlines()
        if line.startswith("{") and "demo finished" in line
    ]
    assert len(finished) == 1
    assert finished[0]["terminal_jobs_without_event"] == 0
    terminal = await db.fetch(
        "SELECT scoring_job_ref FROM scoring_job_state "
        "WHERE scoring_state IN ('completed', 'quarantined')"
    )
    assert len(terminal) == 150
    records = await consume(kafka_bootstrap, [f"{topic_namespace}.scoring_job"], count=150)
    by_job: dict[bytes, set[bytes]] = {}
    for record in records:
        by_job.setdefault(record.key, set()).add(dict(record.headers)["id"])
    assert set(by_job) == {r["scoring_job_ref"].encode() for r in terminal}
    assert all(len(ids) == 1 for ids in by_job.values())  # one event per job, ever
    # Logs speak of counts, never of job refs.
    assert b"job-" not in stderr
