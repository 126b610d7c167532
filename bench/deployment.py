"""What the benchmarks and the bench tools start: fresh migrated databases, and the relay
as deployed (its own process beside one health sidecar), from this checkout or another."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from migrations.runner import apply, load_migrations
from tests.support.services import with_database


@contextlib.asynccontextmanager
async def fresh_database(server_url: str, *, up_to: int | None = None) -> AsyncIterator[str]:
    """A fresh database on the server, migrated (up to migration ``up_to`` only, when
    given), dropped afterwards; its URL."""
    name = f"outbox_relay_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    conn = await asyncpg.connect(url)
    await apply(conn, [m for m in load_migrations() if up_to is None or m.version <= up_to])
    await conn.close()
    try:
        yield url
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


REPO = Path(__file__).resolve().parents[1]
# The policy deploy/ gives its sidecar: what runs next to the relays where users run them.
DEPLOYED_POLICY = REPO / "deploy" / "base" / "policy.toml"
ALL_FAMILIES_DISABLED = (
    "[outbox]\nenabled = false\n[scoring_jobs]\nenabled = false\n"
    "[completion_outbox]\nenabled = false\n[relay]\nenabled = false\n"
)


class RelayDeployment:
    """The relay as deployed: ``run --relay-only`` next to one health sidecar
    (``run --no-relay`` evaluating every family of the deployed policy) on the same database
    and machine. ``pid`` and ``returncode`` are the relay's, the process the figures measure;
    the sidecar's database work lands in PostgreSQL's share, as it does in production."""

    def __init__(
        self, relay: asyncio.subprocess.Process, sidecar: asyncio.subprocess.Process | None
    ) -> None:
        self.relay = relay
        self.sidecar = sidecar

    @property
    def pid(self) -> int:
        """The relay process's id."""
        return self.relay.pid

    @property
    def returncode(self) -> int | None:
        """The relay process's exit code, None while it runs."""
        return self.relay.returncode

    def terminate(self) -> None:
        """SIGTERM to both, as an orchestrator stops them."""
        for process in (self.relay, self.sidecar):
            if process is not None and process.returncode is None:
                process.terminate()

    async def wait(self) -> int:
        """Wait for both; the relay's exit code."""
        code = await self.relay.wait()
        if self.sidecar is not None:
            await self.sidecar.wait()
        return code


async def start_relay_process(
    database_url: str,
    bootstrap: str,
    namespace: str,
    workdir: Path,
    *,
    source: Path | None = None,
    families_off: bool = False,
    sidecar: bool = True,
    **env: str,
) -> RelayDeployment:
    """The relay in its own process, topics under ``namespace``, from ``source`` (another
    checkout of the project) instead of this one when given.

    By default the deployed shape: ``run --relay-only`` and, unless ``sidecar`` is False (a
    further instance of a scale-out), one ``run --no-relay`` sidecar beside it. With
    ``families_off`` the shape benchmarks judged before it existed, kept as a reported
    figure: one ``run`` with every health family disabled and no sidecar.
    """
    environment = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{namespace}.{{aggregatetype}}",
        "HEALTH_LISTEN_ADDR": "127.0.0.1:0",
        **env,
    }
    environment.pop("OUTBOX_RELAY_POLICY", None)
    if families_off:
        policy = workdir / "policy.toml"
        policy.write_text(ALL_FAMILIES_DISABLED)
        relay = await _outbox_relay(
            ["run"], {**environment, "OUTBOX_RELAY_POLICY": str(policy)}, source
        )
        return RelayDeployment(relay, None)
    relay = await _outbox_relay(["run", "--relay-only"], environment, source)
    beside = None
    if sidecar:
        beside = await _outbox_relay(
            ["run", "--no-relay"],
            {**environment, "OUTBOX_RELAY_POLICY": str(DEPLOYED_POLICY)},
            source,
        )
    return RelayDeployment(relay, beside)


async def _outbox_relay(
    argv: list[str], environment: dict[str, str], source: Path | None
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        *argv,
        env=environment,
        # ``-m`` imports from the working directory first: the checkout that runs.
        cwd=source or REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
