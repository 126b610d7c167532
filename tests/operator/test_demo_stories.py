"""``outbox-relay demo --exit-when-done`` against the real services: each of the three
stories turns its family stalled on ``/health`` with its own reason and back to
within_bounds; the poison key's order holds on Kafka after the redrive; every terminal
scoring job's event reaches Kafka once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from aiokafka.structs import ConsumerRecord

from tests.support.http import get
from tests.support.kafka import read_topic
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DEMO_POLICY = REPO / "docs" / "policy.demo.toml"

# (family, a word of the stalled reason that story must give), in the order staged.
STORIES = (
    ("scoring_jobs", "expired_lease_count"),
    ("completion_outbox", "missing_count"),
    ("outbox", "quarantined_count"),
)


@dataclass(frozen=True)
class Seen:
    """One family's classification and reasons in one /health answer."""

    family: str
    classification: str
    reasons: tuple[str, ...]


async def _watch_health(address: tuple[str, int], seen: list[Seen], done: asyncio.Event) -> None:
    """Every /health answer's families, in order, until ``done``."""
    while not done.is_set():
        with contextlib.suppress(OSError, TimeoutError, ValueError, IndexError):
            reply = await get(address, "/health")
            checks = json.loads(reply.body)["checks"]
            for name, entries in checks.items():
                family, _, measurement = name.partition(":")
                if measurement != "classification":
                    continue
                entry = entries[0]
                reasons = entry.get("output", "")
                seen.append(Seen(family, entry["observedValue"], tuple(reasons.split("; "))))
        await asyncio.sleep(0.2)


def _first(seen: list[Seen], start: int, family: str, classification: str, word: str) -> int:
    """Index of the first observation at or after ``start`` matching, else -1."""
    for index in range(start, len(seen)):
        item = seen[index]
        matches = item.family == family and item.classification == classification
        if matches and (not word or any(word in reason for reason in item.reasons)):
            return index
    return -1


def _entries(records: list[ConsumerRecord[bytes, bytes]], key_suffix: str) -> list[int]:
    """Ledger entries of one key in Kafka order, a redelivered repeat collapsed."""
    entries: list[int] = []
    for record in records:
        if record.key.decode().endswith(f"-{key_suffix}"):
            entry = _entry_of(record.value)
            if not entries or entries[-1] != entry:
                entries.append(entry)
    return entries


def _entry_of(value: bytes) -> int:
    """The entry number of a ledger event (the record's value is the row's payload)."""
    return int(json.loads(value)["entry"])


async def test_each_story_stalls_its_family_with_its_reason_and_recovers(
    db: asyncpg.Connection, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    port = free_port()
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
        str(DEMO_POLICY),
        "--listen",
        f"127.0.0.1:{port}",
        "--jobs",
        "40",
        "--rate",
        "5",
        "--story-hold-ms",
        "4000",
        "--max-attempts",
        "2",
        "--retry-base-ms",
        "200",
        "--exit-when-done",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    seen: list[Seen] = []
    done = asyncio.Event()
    watcher = asyncio.create_task(_watch_health(("127.0.0.1", port), seen, done))
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=900)
    finally:
        done.set()
        await watcher
        if process.returncode is None:
            process.kill()
            await process.wait()
    out = stdout.decode()
    assert process.returncode == 0, stderr.decode()[-3000:]

    # Each story, in turn: its family stalled with its own reason, then within bounds.
    cursor = 0
    for family, word in STORIES:
        stalled = _first(seen, cursor, family, "stalled", word)
        assert stalled >= 0, (family, word, out[-3000:])
        recovered = _first(seen, stalled, family, "within_bounds", "")
        assert recovered > stalled, (family, out[-3000:])
        cursor = recovered
    # The relay is never called stalled for the poison key's held rows.
    poison_start = _first(seen, 0, "outbox", "stalled", "quarantined_count")
    assert not [
        s
        for s in seen[poison_start:cursor]
        if s.family == "relay" and s.classification == "stalled"
    ]

    # The poison key's entries, and every other key's, reached Kafka in write order.
    ledger = await read_topic(kafka_bootstrap, f"{topic_namespace}.ledger", count=12, settle=1.0)
    assert _entries(ledger, "a") == [1, 2, 3, 4]
    assert _entries(ledger, "b") == [1, 2, 3, 4]
    assert _entries(ledger, "c") == [1, 2, 3, 4]
    assert "in write order." in out

    # Every terminal job's event reached Kafka exactly once (the legacy one reconciled).
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
    assert len(terminal) == finished[0]["jobs"]
    records = await read_topic(
        kafka_bootstrap, f"{topic_namespace}.scoring_job", count=len(terminal)
    )
    by_job: dict[bytes, set[bytes]] = {}
    for record in records:
        by_job.setdefault(record.key, set()).add(dict(record.headers)["id"])
    assert set(by_job) == {r["scoring_job_ref"].encode() for r in terminal}
    assert all(len(ids) == 1 for ids in by_job.values())  # one event per job, ever

    # The stop says what is still running and how to stop it; logs carry no job refs.
    assert "make services-down" in out
    assert b"job-" not in stderr
