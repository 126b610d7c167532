"""The Rust worker of examples/rust-worker, built with ``cargo build --locked`` and run
against the real services: every operation through the SQL functions, its events published
by a real relay and read from Kafka. And one test, two languages: the same jobs and
outcomes through the Python writer and through the Rust worker, in two fresh databases,
write the same rows and get the same dispositions."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest

from contracts.envelope import data_digest, decode_outcome_event
from scoring.errors import ScoringWriteError
from scoring.outcomes import (
    CompletionOutcome,
    FailureOutcome,
    LeaseExpiry,
    RetryScheduled,
)
from scoring.worker import claim_next_due, enqueue_job, expire_leases, fail_retryable
from scoring.writer import EventDetails, complete_job, fail_job_permanently
from tests.support.kafka import read_topic
from tests.support.relay import fast_config, running_relay
from tests.support.services import (
    PostgresServer,
    drop_database,
    missing,
    scratch_database,
    with_database,
)
from tests.support.waiting import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rust-worker"
BINARY = EXAMPLE / "target" / "debug" / "outbox-relay-rust-worker"
# A cold build (registry and target directory empty) on a busy two-core machine.
BUILD_TIMEOUT_S = 900

# The walkthrough's compared fields: what happened, never when.
COMPARED = ("step", "job_ref", "outcome", "enqueue", "event_id", "refusal", "refusal_field")
DETAILS = EventDetails(
    source="urn:scoring-worker",
    tenant_ref="tenant-a",
    correlation_ref="corr-1",
    schema_version="1",
    traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    tracestate="vendor=opaque",
)
# Refusal codes (docs/writer.md, "From any language") by the Python error that stands for each.
_CODES = {
    "InvalidArgument": "invalid_argument",
    "InvalidEnvelope": "invalid_envelope",
    "EventIdMismatch": "event_id_mismatch",
    "EventTooLarge": "event_too_large",
    "UnknownJob": "unknown_job",
    "NotLeased": "not_leased",
    "StaleLease": "stale_lease",
    "LeaseExpired": "lease_expired",
    "ConflictingCompletion": "conflicting_completion",
    "ConflictingFailure": "conflicting_failure",
}


@pytest.fixture(scope="session")
def rust_worker() -> Path:
    """The example, built as its README says (crates.io only, the committed lock file)."""
    cargo = shutil.which("cargo")
    if cargo is None:
        missing("cargo is not installed", "install Rust with rustup")
        raise AssertionError("unreachable")  # missing() skips or fails
    started = time.monotonic()
    built = subprocess.run(
        [cargo, "build", "--locked", "--quiet"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, f"cargo build --locked failed:\n{built.stderr[-4000:]}"
    print(f"rust-worker built in {time.monotonic() - started:.1f} s")  # shown with -s
    return BINARY


def run_rust_worker(binary: Path, database_url: str) -> list[dict[str, Any]]:
    """Run the walkthrough against the database; one parsed JSON line per step."""
    done = subprocess.run(
        [str(binary), database_url], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    print(done.stdout)  # the walkthrough's own report, shown with -s
    return [json.loads(line) for line in done.stdout.splitlines()]


# -- the same walkthrough in Python ---------------------------------------------------------------


def _disposition(step: str, result: object) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COMPARED)
    row["step"] = step
    match result:
        case CompletionOutcome() | FailureOutcome():
            outcome = result.completion if isinstance(result, CompletionOutcome) else result.failure
            row |= {
                "job_ref": result.job_ref,
                "outcome": outcome.value,
                "enqueue": result.enqueue.value,
                "event_id": str(result.event_id),
            }
        case RetryScheduled():
            row |= {
                "job_ref": result.job_ref,
                "outcome": "retry_duplicate" if result.duplicate else "retry_scheduled",
            }
        case ScoringWriteError():
            row |= {
                "job_ref": result.job_ref,
                "outcome": "refused",
                "refusal": _CODES[type(result).__name__],
                "refusal_field": getattr(result, "field", None),
            }
        case _:
            raise AssertionError(result)
    return row


async def _step(step: str, call: Awaitable[object]) -> dict[str, Any]:
    try:
        return _disposition(step, await call)
    except ScoringWriteError as refused:
        return _disposition(step, refused)


async def python_walkthrough(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """examples/rust-worker/src/main.rs's walkthrough, step for step, through scoring.*."""

    async def claimed(job_ref: str, max_attempts: int, lease_ms: int) -> int:
        await enqueue_job(
            conn, job_ref=job_ref, request_ref=f"req-{job_ref}", max_attempts=max_attempts
        )
        claim = await claim_next_due(conn, worker_ref="worker-python", lease_ms=lease_ms)
        assert claim is not None and claim.job_ref == job_ref
        return claim.fencing_token

    steps = []
    fence = await claimed("job-rust-1", 3, 60_000)
    payload = {"score": 0.73, "labels": ["a", "b"], "model": "m-3"}
    for step in ("complete", "replay"):
        completion = complete_job(
            conn,
            job_ref="job-rust-1",
            fencing_token=fence,
            result_ref="r-1",
            payload=payload,
            event=DETAILS,
        )
        steps.append(await _step(step, completion))

    fence = await claimed("job-rust-2", 3, 60_000)
    async with conn.transaction():
        stale = complete_job(
            conn, job_ref="job-rust-2", fencing_token=fence + 1, result_ref="r-2", event=DETAILS
        )
        steps.append(await _step("stale_fence", stale))
        retry = fail_retryable(
            conn,
            job_ref="job-rust-2",
            fencing_token=fence,
            cause_code="timeout",
            retry_delay_ms=60_000,
            event=DETAILS,
        )
        steps.append(await _step("fail_retryable", retry))

    fence = await claimed("job-rust-3", 3, 60_000)
    failure = fail_job_permanently(
        conn,
        job_ref="job-rust-3",
        fencing_token=fence,
        cause_code="bad_input",
        detail={"reason": "unreadable input", "line": 7},
        event=DETAILS,
    )
    steps.append(await _step("fail_permanently", failure))

    await claimed("job-rust-4", 1, 1)
    await claimed("job-rust-5", 2, 1)
    await asyncio.sleep(0.02)
    swept = await expire_leases(conn, limit=10, event=DETAILS)
    steps.extend(_expiry(swept))
    return steps


def _expiry(swept: LeaseExpiry) -> list[dict[str, Any]]:
    rows = [_disposition("expire_leases", q) for q in swept.quarantined]
    rows += [
        {
            **dict.fromkeys(COMPARED),
            "step": "expire_leases",
            "job_ref": ref,
            "outcome": "rescheduled",
        }
        for ref in swept.rescheduled
    ]
    assert swept.conflicts == ()
    return rows


def _compared(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        ({k: s[k] for k in COMPARED} for s in steps),
        key=lambda s: (s["step"] != "expire_leases", s["step"], s["job_ref"] or ""),
    )


# -- what the databases hold ----------------------------------------------------------------------

_OCCURRED = re.compile(r'"occurred_at_unix_ms": [0-9]+')


async def outbox_rows(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Every outbox column but seq and created_at; the payload's text with its time blanked."""
    rows = []
    for record in await conn.fetch("SELECT *, payload::text AS text FROM outbox ORDER BY id"):
        row = dict(record)
        del row["seq"], row["created_at"]
        row["payload"] = _OCCURRED.sub('"occurred_at_unix_ms": 0', row.pop("text"))
        rows.append(row)
    return rows


async def job_rows(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """What each job ended as (leases, workers and times left out)."""
    return [
        dict(r)
        for r in await conn.fetch(
            "SELECT scoring_job_ref, scoring_request_ref, scoring_state, attempt_count,"
            " max_attempts, last_failure_code, result_ref, completed_fencing_token,"
            " active_fencing_token FROM scoring_job_state ORDER BY scoring_job_ref"
        )
    ]


# -- the tests --------------------------------------------------------------------------------------


@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
async def test_the_rust_worker_does_every_operation_and_its_events_reach_kafka(
    rust_worker: Path,
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
) -> None:
    steps = run_rust_worker(rust_worker, database_url)
    by_step = {(s["step"], s["job_ref"]): s for s in steps}
    assert len(by_step) == len(steps) == 7
    complete = by_step["complete", "job-rust-1"]
    assert (complete["outcome"], complete["enqueue"]) == ("completed", "inserted")
    replay = by_step["replay", "job-rust-1"]
    assert (replay["outcome"], replay["enqueue"], replay["event_id"]) == (
        "duplicate",
        "duplicate",
        complete["event_id"],
    )
    assert replay["occurred_at_unix_ms"] == complete["occurred_at_unix_ms"]
    stale = by_step["stale_fence", "job-rust-2"]
    assert (stale["outcome"], stale["refusal"]) == ("refused", "stale_lease")
    # …and the worker's transaction went on: the retry it then recorded in it committed
    assert by_step["fail_retryable", "job-rust-2"]["outcome"] == "retry_scheduled"
    failed = by_step["fail_permanently", "job-rust-3"]
    assert (failed["outcome"], failed["enqueue"]) == ("quarantined", "inserted")
    assert by_step["expire_leases", "job-rust-4"]["outcome"] == "quarantined"
    assert by_step["expire_leases", "job-rust-5"]["outcome"] == "rescheduled"

    states = {r["scoring_job_ref"]: r["scoring_state"] for r in await job_rows(db)}
    assert states == {
        "job-rust-1": "completed",
        "job-rust-2": "retry_scheduled",
        "job-rust-3": "quarantined",
        "job-rust-4": "quarantined",
        "job-rust-5": "retry_scheduled",
    }
    written = {row["id"]: row for row in await outbox_rows(db)}
    with_events = (
        ("complete", "job-rust-1"),
        ("fail_permanently", "job-rust-3"),
        ("expire_leases", "job-rust-4"),
    )
    event_ids = [by_step[step]["event_id"] for step in with_events]
    assert sorted(str(i) for i in written) == sorted(event_ids)

    # A real relay publishes them; a plain consumer reads each as the envelope says.
    async with running_relay(fast_config(database_url, kafka_bootstrap, topic_namespace)):
        records = await read_topic(kafka_bootstrap, f"{topic_namespace}.scoring_job", count=3)
        await wait_until(
            lambda: db.fetchval("SELECT count(*) = 0 FROM outbox"), what="the outbox drained"
        )
    assert len(records) == 3
    for record in records:
        headers = {key: value.decode() for key, value in record.headers}
        row = written[uuid.UUID(headers["id"])]
        assert record.key == row["aggregateid"].encode()
        assert headers["ce_type"] == row["type"]
        assert headers["traceparent"] == row["traceparent"]
        assert headers["tenant_ref"] == "tenant-a"
        assert record.value is not None
        event = decode_outcome_event(record.value)
        assert event.envelope.event_ref == headers["id"]
        assert data_digest(record.value) == event.envelope.payload_digest
    assert await db.fetchval("SELECT count(*) FROM outbox_receipt") == 3


async def differences(
    rust_steps: list[dict[str, Any]],
    python_steps: list[dict[str, Any]],
    rust: asyncpg.Connection,
    python: asyncpg.Connection,
) -> list[str]:
    """What the two walkthroughs did differently: their dispositions, the outbox rows they
    wrote, the jobs' end states; empty when they did the same."""
    found = []
    if _compared(rust_steps) != _compared(python_steps):
        found.append("dispositions")
    if await outbox_rows(rust) != await outbox_rows(python):
        found.append("outbox rows")
    if await job_rows(rust) != await job_rows(python):
        found.append("job rows")
    return found


@asynccontextmanager
async def two_walkthroughs(
    rust_worker: Path, pg_server: PostgresServer, template_database: str
) -> AsyncIterator[tuple[list[dict[str, Any]], list[dict[str, Any]], Any, Any]]:
    """The Rust worker's and the Python writer's walkthroughs, each in a fresh database: their
    steps and a connection to each database."""
    names = [await scratch_database(pg_server.url, template_database) for _ in range(2)]
    try:
        rust_url, python_url = (with_database(pg_server.url, name) for name in names)
        rust_steps = run_rust_worker(rust_worker, rust_url)
        rust = await asyncpg.connect(rust_url)
        python = await asyncpg.connect(python_url)
        try:
            python_steps = await python_walkthrough(python)
            yield rust_steps, python_steps, rust, python
        finally:
            await rust.close()
            await python.close()
    finally:
        for name in names:
            await drop_database(pg_server.url, name)


@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
async def test_one_walkthrough_in_two_languages_writes_the_same_rows(
    rust_worker: Path, pg_server: PostgresServer, template_database: str
) -> None:
    async with two_walkthroughs(rust_worker, pg_server, template_database) as walked:
        rust_steps, python_steps, rust, python = walked
        assert await differences(rust_steps, python_steps, rust, python) == []
        rust_rows = await outbox_rows(rust)
        assert len(rust_rows) == 3
        # the same value, whatever the worker spelt: 0.730 and a key order of its own
        [completed] = [r for r in rust_rows if r["type"] == "scoring.result.completed"]
        assert json.loads(completed["payload"])["data"]["result"] == {
            "labels": ["a", "b"],
            "model": "m-3",
            "score": 0.73,
        }


# What one language's writer could get wrong that the other does not, planted in the Python
# walkthrough's database (or its dispositions) once it ran: each must be a difference.
PLANTS = {
    "a number spelt as the caller spelt it": (
        "UPDATE outbox SET payload = replace(payload::text, '0.73', '0.730')::jsonb"
        " WHERE type = 'scoring.result.completed'",
        "outbox rows",
    ),
    "a header left out": ("UPDATE outbox SET tenant_ref = NULL", "outbox rows"),
    "the trace context not carried": ("UPDATE outbox SET traceparent = NULL", "outbox rows"),
    "an event not written": (
        "DELETE FROM outbox WHERE aggregateid = 'job-rust-4'",
        "outbox rows",
    ),
    "an attempt counted twice": (
        "UPDATE scoring_job_state SET attempt_count = attempt_count + 1"
        " WHERE scoring_job_ref = 'job-rust-2'",
        "job rows",
    ),
    "a refusal named otherwise": (None, "dispositions"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
@pytest.mark.timeout(BUILD_TIMEOUT_S + 120)
async def test_the_comparison_catches_what_one_language_does_differently(
    plant: str, rust_worker: Path, pg_server: PostgresServer, template_database: str
) -> None:
    statement, caught_as = PLANTS[plant]
    async with two_walkthroughs(rust_worker, pg_server, template_database) as walked:
        rust_steps, python_steps, rust, python = walked
        if statement is None:
            [stale] = [s for s in python_steps if s["step"] == "stale_fence"]
            stale["refusal"] = "lease_expired"
        else:
            assert (await python.execute(statement)).split()[-1] != "0", statement
        assert await differences(rust_steps, python_steps, rust, python) == [caught_as]


def test_the_walkthroughs_payloads_are_the_same_json_value() -> None:
    # What makes the comparison meaningful: the Rust worker spells its payload otherwise.
    source = (EXAMPLE / "src" / "main.rs").read_text()
    rust_payload = re.search(r'let payload = r#"(.*?)"#;', source)
    assert rust_payload is not None
    assert rust_payload.group(1) != json.dumps(
        {"score": 0.73, "labels": ["a", "b"], "model": "m-3"}
    )
    assert msgspec.json.decode(rust_payload.group(1)) == {
        "score": 0.73,
        "labels": ["a", "b"],
        "model": "m-3",
    }
