"""``outbox-relay`` verbs as processes of some release's code, as an operator (or a pod) runs
them: each with its JSON log in a file, its HTTP endpoints, and a stop that waits.

The code is this checkout's unless a :class:`Code` says otherwise (an older release checked
out beside it, run with this venv's interpreter; tests/support/release.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.http import Reply, get
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
# What a test states itself: the database, the broker, the listen address, the settings.
_SCRUBBED_PREFIXES = ("PG", "OUTBOX_RELAY_", "KAFKA_", "DATABASE_URL", "PYTHONPATH")
_SCRUBBED = frozenset({"HEALTH_LISTEN_ADDR", "PORT"})


@dataclass(frozen=True)
class Code:
    """How to start ``outbox-relay`` of one release: the argv before the verb, the
    environment it needs (``PYTHONPATH`` for a tree other than the installed one) and the
    directory it starts in."""

    name: str
    command: tuple[str, ...] = (sys.executable, "-m", "outbox_relay")
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = REPO


THIS_CHECKOUT = Code("this checkout")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything the CLI reads, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED
    }
    env.update(extra)
    return env


@dataclass
class Running:
    """One long-running verb (``run``): its process, its port and its JSON log."""

    name: str
    process: asyncio.subprocess.Process
    port: int
    log_path: Path

    async def get(self, path: str) -> Reply | None:
        """The endpoint's reply; None while nothing answers."""
        try:
            return await get(("127.0.0.1", self.port), path)
        except (OSError, TimeoutError):
            return None

    async def status(self, path: str) -> int | None:
        reply = await self.get(path)
        return None if reply is None else reply.status

    async def health(self) -> dict[str, Any] | None:
        """The /health document; None while nothing answers."""
        reply = await self.get("/health")
        if reply is None:
            return None
        document: dict[str, Any] = json.loads(reply.body)
        return document

    def logs(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    entries.append(json.loads(line))
        return entries

    def logged(self, message: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs() if entry.get("msg") == message]

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait for the exit (killed after ``timeout``); the exit code."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        assert self.process.returncode is not None
        return self.process.returncode


@contextlib.asynccontextmanager
async def running(
    name: str,
    args: Sequence[str],
    env: Mapping[str, str],
    directory: Path,
    code: Code = THIS_CHECKOUT,
) -> AsyncIterator[Running]:
    """``outbox-relay ARGS`` of ``code``, listening on a free port, JSON logs to a file;
    stopped (SIGTERM, then killed) on the way out if the test did not stop it."""
    port = free_port()
    log_path = directory / f"{name}.log"
    full_env = clean_env(
        OUTBOX_RELAY_LOG_FORMAT="json",
        HEALTH_LISTEN_ADDR=f"127.0.0.1:{port}",
        **code.env,
        **env,
    )
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *code.command, *args, cwd=code.cwd, env=full_env, stdout=log, stderr=log
        )
    service = Running(name, process, port, log_path)
    try:
        yield service
    finally:
        await service.stop()


async def run_verb(
    args: Sequence[str], env: Mapping[str, str], code: Code = THIS_CHECKOUT, timeout: float = 300
) -> tuple[int, str]:
    """``outbox-relay ARGS`` of ``code`` to completion: its exit code and what it printed."""
    process = await asyncio.create_subprocess_exec(
        *code.command,
        *args,
        cwd=code.cwd,
        env=clean_env(**code.env, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), timeout)
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace")
