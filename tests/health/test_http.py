"""The sidecar's HTTP surface over real sockets, against a real PostgreSQL (or a closed port)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from contracts.errors import ConfigError
from contracts.policy import (
    CompletionOutboxPolicy,
    EvaluationSettings,
    OutboxPolicy,
    Policy,
    ScoringJobsPolicy,
)
from health.config import SidecarConfig
from health.errors import ListenError
from health.sidecar import HealthSidecar
from tests.support.health_rows import SECRET_MARK, db_now, insert_event, insert_job
from tests.support.http import Reply, exchange, get
from tests.support.policies import RECEIPT_RETENTION_MS, loose_policy
from tests.support.ports import free_port

ALL_PATHS = ("/livez", "/readyz", "/health", "/metrics", "/")


@asynccontextmanager
async def running(
    database_url: str | None, policy: Policy | None = None, **kwargs: Any
) -> AsyncIterator[HealthSidecar]:
    """A sidecar serving on an ephemeral port, with its first evaluation done."""
    relay = kwargs.pop("relay", None)
    config = SidecarConfig(
        database_url=database_url,
        policy=policy or loose_policy(),
        listen=("127.0.0.1", 0),
        receipt_retention_ms=RECEIPT_RETENTION_MS,
        **kwargs,
    )
    sidecar = HealthSidecar(config, registry=CollectorRegistry(), relay=relay)
    async with sidecar:
        task = asyncio.create_task(sidecar.run())
        try:
            await sidecar.next_report()
            yield sidecar
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def test_endpoints_when_healthy(database_url: str) -> None:
    async with running(database_url) as sidecar:
        address = sidecar.address
        livez = await get(address, "/livez")
        assert (livez.status, livez.text) == (200, "ok\n")
        assert (await get(address, "/readyz")).status == 200

        health = await get(address, "/health?verbose=1")
        assert health.status == 200
        assert health.headers["content-type"] == "application/health+json"
        assert health.headers["cache-control"] == "no-store"
        document = json.loads(health.body)
        assert document["status"] == "pass"
        assert document["serviceId"] == "outbox-relay"
        pending = document["checks"]["outbox:pending_count"][0]
        assert pending["observedValue"] == 0
        assert pending["observedUnit"] == "events"
        assert pending["status"] == "pass"
        assert pending["time"].endswith("Z")
        verdict = document["checks"]["scoring_jobs:classification"][0]
        assert verdict["classification"] == "within_bounds"
        assert verdict["reasons"] == []
        assert "relay:classification" not in document["checks"]  # disabled family

        metrics = await get(address, "/metrics")
        assert metrics.status == 200
        assert metrics.headers["content-type"].startswith("text/plain")
        assert (
            'outbox_relay_health_classification{classification="within_bounds",family="outbox"} 1.0'
            in metrics.text
        )
        assert (
            'outbox_relay_health_classification{classification="stalled",family="outbox"} 0.0'
            in metrics.text
        )
        assert "outbox_relay_outbox_pending_events 0.0" in metrics.text
        assert "outbox_relay_scoring_jobs_active 0.0" in metrics.text
        assert "outbox_relay_health_evaluations_total" in metrics.text
        assert "outbox_relay_health_ready 1.0" in metrics.text

        page = await get(address, "/")
        assert page.status == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "<h1>outbox-relay health</h1>" in page.text
        assert "within_bounds" in page.text

        head = await get(address, "/health", method="HEAD")
        assert head.status == 200
        assert head.body == b""
        assert int(head.headers["content-length"]) == len(health.body)


async def test_unknown_path_and_method_are_problems(database_url: str) -> None:
    async with running(database_url) as sidecar:
        missing = await get(sidecar.address, "/nope")
        assert missing.status == 404
        assert missing.headers["content-type"] == "application/problem+json"
        assert json.loads(missing.body)["status"] == 404
        for method in ("POST", "DELETE", "OPTIONS"):
            refused = await get(sidecar.address, "/health", method=method)
            assert refused.status == 405
            assert refused.headers["allow"] == "GET, HEAD"
            assert refused.headers["cache-control"] == "no-store"
            assert json.loads(refused.body)["title"] == "Method Not Allowed"


async def test_stalled_families_fail_readiness_and_recover(
    database_url: str, db: asyncpg.Connection
) -> None:
    # grace 0: the job is due for its event as soon as it is written. Written the way the
    # scoring service writes (updated_at = clock_timestamp()): the sidecar checks
    # incrementally and relies on that (docs/health.md, "How the completion check scales").
    completion = CompletionOutboxPolicy(
        grace_ms=0, lookback_ms=86_400_000, max_missing_count=0, gates_readiness=True
    )
    async with running(database_url, loose_policy(completion_outbox=completion)) as sidecar:
        job = await insert_job(db, "completed")
        await sidecar.next_report()  # one evaluation may have begun before the insert
        report = await sidecar.next_report()
        assert report.classification == "stalled"
        ready = await get(sidecar.address, "/readyz")
        assert ready.status == 503
        assert json.loads(ready.body)["detail"] == "not ready: completion_outbox stalled"
        health = await get(sidecar.address, "/health")
        assert health.status == 503
        document = json.loads(health.body)
        assert document["status"] == "fail"
        missing = document["checks"]["completion_outbox:missing_count"][0]
        assert (missing["observedValue"], missing["status"]) == (1, "fail")
        assert (await get(sidecar.address, "/livez")).status == 200
        metrics = (await get(sidecar.address, "/metrics")).text
        assert "outbox_relay_completion_outbox_missing_events 1.0" in metrics

        # The completion's event is written: the family recovers.
        await insert_event(db, aggregateid=job)
        await sidecar.next_report()
        await sidecar.next_report()  # one evaluation may have begun before the insert
        assert (await get(sidecar.address, "/readyz")).status == 200
        assert json.loads((await get(sidecar.address, "/health")).body)["status"] == "pass"


async def test_non_gating_stalled_family_is_warn_and_ready(
    database_url: str, db: asyncpg.Connection
) -> None:
    outbox = OutboxPolicy(
        max_pending_count=0,
        max_pending_age_ms=60_000,
        max_quarantined_count=0,
        gates_readiness=False,
    )
    await insert_event(db)
    async with running(database_url, loose_policy(outbox=outbox)) as sidecar:
        health = await get(sidecar.address, "/health")
        assert health.status == 200
        document = json.loads(health.body)
        assert document["status"] == "warn"
        assert document["checks"]["outbox:pending_count"][0]["status"] == "warn"
        assert (await get(sidecar.address, "/readyz")).status == 200


class FakeRelay:
    """Stands in for the in-process relay's flags (a pure-logic fake, no I/O)."""

    def __init__(self) -> None:
        self.is_live = True
        self.is_ready = True
        self.waiting: str | None = None

    def live(self) -> bool:
        return self.is_live

    def ready(self) -> bool:
        return self.is_ready

    def waiting_for(self) -> str | None:
        return self.waiting


async def test_relay_callbacks_gate_livez_and_readyz(database_url: str) -> None:
    relay = FakeRelay()
    async with running(database_url, relay=relay) as sidecar:
        assert (await get(sidecar.address, "/readyz")).status == 200
        relay.is_ready = False
        not_ready = await get(sidecar.address, "/readyz")
        assert not_ready.status == 503
        assert json.loads(not_ready.body)["detail"] == "not ready: relay not ready"
        relay.is_live = False
        assert (await get(sidecar.address, "/livez")).status == 503


NO_FAMILY = Policy(
    outbox=None,
    scoring_jobs=None,
    completion_outbox=None,
    relay=None,
    evaluation=EvaluationSettings(interval_ms=100, timeout_ms=2000, max_evidence_age_ms=5000),
)


def _outbox(max_pending_count: int, *, gates: bool) -> Policy:
    outbox = OutboxPolicy(
        max_pending_count=max_pending_count,
        max_pending_age_ms=3_600_000,
        max_quarantined_count=0,
        gates_readiness=gates,
    )
    return loose_policy(outbox=outbox)


@pytest.mark.parametrize(
    ("kind", "policy", "relay_ready"),
    [
        ("relay-only", NO_FAMILY, True),
        ("relay-only", NO_FAMILY, False),
        ("sidecar-only", _outbox(10, gates=True), None),
        ("sidecar-only", _outbox(0, gates=True), None),  # a gating family stalled
        ("sidecar-only", _outbox(0, gates=False), None),  # a non-gating one: warn, ready
        ("both", _outbox(10, gates=True), True),
        ("both", _outbox(10, gates=True), False),
        ("both", _outbox(0, gates=True), True),
        ("both", _outbox(0, gates=False), False),
    ],
)
async def test_health_fails_exactly_when_readyz_is_503_for_every_process_kind(
    db: asyncpg.Connection,
    database_url: str,
    kind: str,
    policy: Policy,
    relay_ready: bool | None,
) -> None:
    await insert_event(db)  # one pending event: over a max_pending_count of 0
    relay = None
    if relay_ready is not None:
        relay = FakeRelay()
        relay.is_ready = relay_ready
        relay.waiting = None if relay_ready else "the database lacks migration 0009"
    async with running(database_url, policy, relay=relay) as sidecar:
        readyz = await get(sidecar.address, "/readyz")
        health = await get(sidecar.address, "/health")
    document = json.loads(health.body)
    assert (readyz.status == 503) == (health.status == 503) == (document["status"] == "fail")
    assert readyz.status == (200 if sidecar.ready() else 503)
    (ready,) = document["checks"]["process:ready"]
    assert ready["observedValue"] is (readyz.status == 200)
    if relay is not None and not relay_ready:
        assert "relay not ready (the database lacks migration 0009)" in readyz.text
        assert "relay not ready (the database lacks migration 0009)" in ready["output"]
    expected_ready = relay_ready is not False and (
        policy.outbox is None
        or policy.outbox.max_pending_count > 0
        or not policy.outbox.gates_readiness
    )
    assert (readyz.status == 200) is expected_ready, kind


async def test_stale_evidence_is_served_as_unknown(database_url: str) -> None:
    policy = loose_policy(
        evaluation=EvaluationSettings(interval_ms=10, timeout_ms=2000, max_evidence_age_ms=50)
    )
    sidecar = HealthSidecar(
        SidecarConfig(
            database_url=database_url,
            policy=policy,
            listen=("127.0.0.1", 0),
            receipt_retention_ms=RECEIPT_RETENTION_MS,
        ),
        registry=CollectorRegistry(),
    )
    async with sidecar:
        # Evaluate once and never again, as if the loop had hung.
        await sidecar.evaluate_once()
        assert (await get(sidecar.address, "/readyz")).status == 200
        await asyncio.sleep(0.06)
        assert (await get(sidecar.address, "/readyz")).status == 503
        document = json.loads((await get(sidecar.address, "/health")).body)
        verdict = document["checks"]["outbox:classification"][0]
        assert verdict["classification"] == "unknown"
        assert verdict["reasons"][0].startswith("evidence is ")


async def test_database_down(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    port = free_port()
    url = f"postgresql://outbox:pw-{SECRET_MARK}@127.0.0.1:{port}/db_{SECRET_MARK}"
    async with running(url) as sidecar:
        address = sidecar.address
        livez = await get(address, "/livez")
        assert livez.status == 200
        ready = await get(address, "/readyz")
        assert ready.status == 503
        health = await get(address, "/health")
        assert health.status == 503
        document = json.loads(health.body)
        assert document["status"] == "fail"
        assert document["classification"] == "unknown"
        verdict = document["checks"]["scoring_jobs:classification"][0]
        assert verdict["classification"] == "unknown"
        assert verdict["reasons"] == ["database unavailable: connection refused"]
        replies = [livez, ready, health] + [await get(address, p) for p in ALL_PATHS]
    for text in [r.body.decode() + str(r.headers) for r in replies] + [caplog.text]:
        assert SECRET_MARK not in text
        assert str(port) not in text
        assert "postgresql://" not in text
        assert "Errno" not in text  # no driver or OS error text


async def test_bind_failure_is_a_typed_one_line_error(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sidecar = HealthSidecar(
            SidecarConfig(
                database_url=database_url, policy=loose_policy(), listen=("127.0.0.1", port)
            ),
            registry=CollectorRegistry(),
        )
        with pytest.raises(ListenError) as caught:
            await sidecar.__aenter__()
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value) == f"cannot listen on 127.0.0.1:{port}: address already in use"


# --- hostile clients -------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"GARBAGE\r\n\r\n", id="not-http"),
        pytest.param(b"GET /livez HTTP/1.1\r\n\r\n", id="no-host"),
        pytest.param(b"GET /livez HTTP/1.1\r\nHost test\r\n\r\n", id="bad-header"),
        pytest.param(
            b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n",
            id="oversized-header",
        ),
        pytest.param(
            b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", id="oversized-target"
        ),
    ],
)
async def test_malformed_and_oversized_requests_get_400(database_url: str, raw: bytes) -> None:
    async with running(database_url) as sidecar:
        reply = await exchange(sidecar.address, raw)
        assert reply.status == 400
        assert reply.headers["content-type"] == "application/problem+json"
        assert json.loads(reply.body)["status"] == 400
        assert (await get(sidecar.address, "/livez")).status == 200  # still serving


async def test_slow_clients_are_dropped_and_others_are_served(database_url: str) -> None:
    async with running(database_url, http_io_timeout_ms=300) as sidecar:
        loop = asyncio.get_running_loop()
        slow = []
        for _ in range(3):
            reader, writer = await asyncio.open_connection(*sidecar.address)
            writer.write(b"GET /livez HTTP/1.1\r\nHost: t\r\n")  # never finishes the head
            await writer.drain()
            slow.append((reader, writer))
        started = loop.time()
        # Others are served while the slow ones hang.
        assert (await get(sidecar.address, "/livez")).status == 200
        for reader, writer in slow:
            async with asyncio.timeout(2):
                try:
                    data = await reader.read()
                except ConnectionResetError:
                    data = b""
            assert data == b""  # dropped without an answer
            writer.close()
        assert loop.time() - started < 1.5
        assert (await get(sidecar.address, "/health")).status == 200


# --- secrets ---------------------------------------------------------------------------


async def test_no_identity_leaks_into_any_output(
    database_url: str, db: asyncpg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    from health.commands import check, status

    caplog.set_level(logging.DEBUG)
    now = await db_now(db)
    now_ms = round(now.timestamp() * 1000)
    for state in ("queued", "retry_scheduled", "completed", "quarantined", "cancelled"):
        await insert_job(db, state, updated_at=now - dt.timedelta(minutes=5))
    await insert_job(db, "leased", lease_expires_at_unix_ms=now_ms - 1)
    await insert_event(db, created_at=now - dt.timedelta(hours=3))
    await insert_event(db, quarantined=True, last_error_class=f"boom-{SECRET_MARK}")
    # Tight bounds so every family is stalled and every reason fires.
    tight = loose_policy(
        outbox=OutboxPolicy(
            max_pending_count=0, max_pending_age_ms=1, max_quarantined_count=0, gates_readiness=True
        ),
        scoring_jobs=ScoringJobsPolicy(
            max_active_job_count=0,
            max_active_job_age_ms=1,
            max_quarantined_job_count=0,
            max_expired_lease_count=0,
            gates_readiness=True,
        ),
    )
    assert SECRET_MARK in str(await db.fetch("SELECT * FROM scoring_job_state"))
    outputs: list[str] = []
    async with running(database_url, tight) as sidecar:
        for path in ALL_PATHS:
            reply: Reply = await get(sidecar.address, path)
            outputs.append(reply.body.decode() + str(reply.headers))
        health = await get(sidecar.address, "/health")
        assert json.loads(health.body)["status"] == "fail"
    for command in (check, status):
        text, code = await command(database_url, tight, receipt_retention_ms=RECEIPT_RETENTION_MS)
        assert code == 2
        outputs.append(text)
    outputs.append(caplog.text)
    assert "health scoring_jobs is stalled" in caplog.text
    for text in outputs:
        assert SECRET_MARK not in text


async def test_pool_reconnects_after_its_connections_are_killed(
    database_url: str, db: asyncpg.Connection
) -> None:
    async with running(database_url) as sidecar:
        killed = await db.fetchval(
            """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
               WHERE application_name = 'outbox-relay-health' AND datname = current_database()"""
        )
        assert killed >= 1
        # At most the evaluation that meets the dead connection is unknown; then it is back.
        reports = [await sidecar.next_report() for _ in range(3)]
        assert reports[-1].classification == "within_bounds"
        assert all(
            r.classification == "within_bounds"
            or r.families[0].reasons == ("database connection failed",)
            for r in reports
        )
        assert (await get(sidecar.address, "/readyz")).status == 200
