"""The sidecar starts and serves while PostgreSQL is unreachable, refuses the password or is
not migrated: /livez 200, /readyz 503, /health unknown with a clear reason; it retries with
capped back-off (a schema that is not migrated yet: at every evaluation) and logs each change
of the database's state once. Against the real
PostgreSQL, through a TCP relay the test can switch between resetting and forwarding."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from contracts.policy import EvaluationSettings
from migrations.runner import apply, load_migrations
from pgconnect.schema import SCHEMA_BEHIND
from tests.health.test_http import running
from tests.support.health_rows import SECRET_MARK
from tests.support.http import get
from tests.support.policies import loose_policy
from tests.support.ports import free_port

RETRY_MAX_MS = 800
FAST = loose_policy(
    evaluation=EvaluationSettings(interval_ms=100, timeout_ms=2000, max_evidence_age_ms=5000)
)


class PostgresRelay:
    """A TCP relay to a real PostgreSQL that counts connections; while ``down`` it accepts
    and resets each one at once (a server that is not there yet, as seen by the client);
    while ``silent`` it accepts and never answers (a firewall that drops packets)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.down = True
        self.silent = False
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> PostgresRelay:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.down and not self.silent:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._pipes.add(task)
        try:
            if self.silent:
                await asyncio.sleep(3600)
            up_reader, up_writer = await asyncio.open_connection(*self.target)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            self._pipes.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError):
            writer.close()


def through(url: str, port: int, *, password: str | None = None) -> str:
    parts = urlsplit(url)
    user = parts.username or ""
    secret = parts.password if password is None else password
    netloc = f"{user}:{secret}@127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


@asynccontextmanager
async def relayed(database_url: str) -> AsyncIterator[PostgresRelay]:
    parts = urlsplit(database_url)
    async with PostgresRelay((parts.hostname or "127.0.0.1", parts.port or 5432)) as relay:
        yield relay


def state_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("health database")]


async def wait_for(sidecar: Any, classification: str, *, within_s: float) -> None:
    async with asyncio.timeout(within_s):
        while (await sidecar.next_report()).classification != classification:
            pass


async def test_starts_while_the_database_is_down_retries_with_backoff_and_recovers(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with (
        relayed(database_url) as relay,
        running(
            through(database_url, relay.port), FAST, database_retry_max_ms=RETRY_MAX_MS
        ) as sidecar,
    ):
        address = sidecar.address
        assert (await get(address, "/livez")).status == 200
        assert (await get(address, "/readyz")).status == 503
        health = await get(address, "/health")
        assert health.status == 503
        document = json.loads(health.body)
        assert document["classification"] == "unknown"
        verdict = document["checks"]["outbox:classification"][0]
        assert verdict["reasons"][0].startswith("database unavailable: ")
        # Every 100 ms without back-off would be about 30 attempts in 3 s; doubling from
        # the interval up to 0.8 s makes about 7.
        before = relay.connections
        await asyncio.sleep(3.0)
        attempts = relay.connections - before
        assert 2 <= attempts <= 10, attempts
        # Still served as current (not stale) while waiting between attempts.
        document = json.loads((await get(address, "/health")).body)
        assert document["checks"]["outbox:classification"][0]["reasons"][0].startswith(
            "database unavailable: "
        )
        relay.down = False
        await wait_for(sidecar, "within_bounds", within_s=RETRY_MAX_MS / 1000 + 3)
        assert (await get(address, "/readyz")).status == 200
        assert (await get(address, "/livez")).status == 200
    lines = state_lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0].startswith("health database unavailable: ")
    assert "retrying" in lines[0]
    assert lines[1] == "health database reachable again"
    # The outage is one line, not one per family and retry.
    assert "database unavailable" not in caplog.text.replace(lines[0], "")


async def test_refused_connection_at_start_is_unknown_with_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    url = f"postgresql://outbox:pw-{SECRET_MARK}@127.0.0.1:{free_port()}/db_{SECRET_MARK}"
    async with running(url, FAST, database_retry_max_ms=RETRY_MAX_MS) as sidecar:
        await asyncio.sleep(1.5)  # several retries
        assert (await get(sidecar.address, "/livez")).status == 200
        assert (await get(sidecar.address, "/readyz")).status == 503
        document = json.loads((await get(sidecar.address, "/health")).body)
        verdict = document["checks"]["scoring_jobs:classification"][0]
        assert verdict["reasons"] == ["database unavailable: connection refused"]
    assert state_lines(caplog) == [
        "health database unavailable: connection refused;"
        f" retrying with back-off up to {RETRY_MAX_MS / 1000:g} s"
    ]
    assert SECRET_MARK not in caplog.text


async def test_wrong_password_is_unknown_with_a_clear_secret_free_reason(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with relayed(database_url) as relay:
        relay.down = False
        url = through(database_url, relay.port, password=f"wrong-{SECRET_MARK}")
        async with running(url, FAST, database_retry_max_ms=RETRY_MAX_MS) as sidecar:
            before = relay.connections
            await asyncio.sleep(2.0)
            attempts = relay.connections - before
            replies = [await get(sidecar.address, p) for p in ("/livez", "/readyz", "/health")]
    assert [r.status for r in replies] == [200, 503, 503]
    document = json.loads(replies[2].body)
    verdict = document["checks"]["outbox:classification"][0]
    assert verdict["reasons"] == ["database unavailable: authentication failed"]
    # Without back-off: 20 attempts in 2 s, each one or two connections (the driver
    # retries without TLS after a refused login when TLS is only preferred). With it: ~5.
    assert 1 <= attempts <= 14, attempts
    assert state_lines(caplog) == [
        "health database unavailable: authentication failed;"
        f" retrying with back-off up to {RETRY_MAX_MS / 1000:g} s"
    ]
    for text in [r.body.decode() for r in replies] + [caplog.text]:
        assert SECRET_MARK not in text


async def test_unmigrated_database_says_to_migrate_then_recovers_once_migrated(
    empty_database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running(empty_database_url, FAST, database_retry_max_ms=RETRY_MAX_MS) as sidecar:
        assert (await get(sidecar.address, "/livez")).status == 200
        assert (await get(sidecar.address, "/readyz")).status == 503
        health = await get(sidecar.address, "/health")
        assert health.status == 503
        document = json.loads(health.body)
        assert document["classification"] == "unknown"
        for family in ("outbox", "scoring_jobs", "completion_outbox"):
            reasons = document["checks"][f"{family}:classification"][0]["reasons"]
            assert reasons == [
                SCHEMA_BEHIND,
                "the database was never migrated: run `outbox-relay migrate`",
            ]
        await asyncio.sleep(1.0)
        conn = await asyncpg.connect(empty_database_url)  # a migration job finishes
        try:
            await apply(conn, load_migrations())
        finally:
            await conn.close()
        # Not backed off: a schema is looked at again on every evaluation.
        await wait_for(sidecar, "within_bounds", within_s=1.5)
        assert (await get(sidecar.address, "/readyz")).status == 200
    assert state_lines(caplog) == []
    # Once when it appears (not again as the migration moves from file to file), once
    # when it is over.
    assert [r.getMessage() for r in caplog.records if "schema" in r.getMessage()] == [
        f"health {SCHEMA_BEHIND}: the database was never migrated: run `outbox-relay migrate`;"
        " every family is unknown until then",
        "health schema ready; the families are probed",
    ]


async def test_a_database_that_never_answers_is_unavailable_not_a_timed_out_evaluation(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The connection attempt must give up inside the evaluation's budget, so the outage
    # is named and backed off like any other.
    caplog.set_level(logging.INFO)
    policy = loose_policy(
        evaluation=EvaluationSettings(interval_ms=100, timeout_ms=1000, max_evidence_age_ms=5000)
    )
    async with relayed(database_url) as relay:
        relay.silent = True
        url = through(database_url, relay.port)
        async with running(url, policy, database_retry_max_ms=RETRY_MAX_MS) as sidecar:
            assert (await get(sidecar.address, "/livez")).status == 200
            document = json.loads((await get(sidecar.address, "/health")).body)
            verdict = document["checks"]["outbox:classification"][0]
            assert verdict["reasons"] == ["database unavailable: timed out"]
            relay.silent, relay.down = False, False
            await wait_for(sidecar, "within_bounds", within_s=RETRY_MAX_MS / 1000 + 4)
    assert state_lines(caplog) == [
        "health database unavailable: timed out;"
        f" retrying with back-off up to {RETRY_MAX_MS / 1000:g} s",
        "health database reachable again",
    ]
