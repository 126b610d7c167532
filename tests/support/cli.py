"""Running ``outbox-relay`` as a real process and reading what it printed; the login roles
and database URLs a test hands it, and the migrations this release ships."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

import migrations

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
SHIPPED = (
    "0001_outbox.sql",
    "0002_scoring_job_state.sql",
    "0003_scoring_job_health_indexes.sql",
    "0004_outbox_notify_seq.sql",
    "0005_outbox_time_ordered_id.sql",
    "0006_writer_guard_pinned_search_path.sql",
    "0007_outbox_key_indexes.sql",
    "0008_outbox_tracestate.sql",
    "0009_outbox_door.sql",
    "0010_outbox_held_topic_index.sql",
    "0011_outbox_writer_routes.sql",
    "0012_scoring_functions.sql",
)

# Environment the CLI reads; a test states every input it wants the process to see.
_SCRUBBED_PREFIXES = ("PG", "OUTBOX_RELAY_", "KAFKA_", "DATABASE_URL")
_SCRUBBED = frozenset({"HEALTH_LISTEN_ADDR", "PORT"})


@dataclass(frozen=True)
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def cli_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(_SCRUBBED_PREFIXES) and k not in _SCRUBBED
    }
    env.update(extra)
    return env


async def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120.0
) -> CliResult:
    """``python -m outbox_relay ARGS`` with a clean environment; kills it on timeout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        *args,
        cwd=REPO,
        env=cli_env() if env is None else env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode())


def assert_one_clean_error_line(result: CliResult, *secrets: str) -> str:
    """Exactly one ``outbox-relay: error:`` line on stderr, no traceback, no secret anywhere."""
    lines = result.stderr_lines
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("outbox-relay: error: "), lines[0]
    assert "Traceback" not in result.output
    for secret in secrets:
        assert secret not in result.output
    return lines[0]


def with_password(url: str, password: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username}:{password}@{host}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def with_login(url: str, user: str, password_text: str) -> str:
    """``url`` with this user and this password text, written into the URL exactly as given."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{user}:{password_text}@{host}{port}{parts.path}"


@contextlib.asynccontextmanager
async def login_role(
    database_url: str, password: str, *, member_of: str | None = None
) -> AsyncIterator[str]:
    """A LOGIN role with this password, for one test; what it owns in the database goes too.

    ``database_url`` must name a superuser (the test servers' own role).
    """
    name = f"outbox_relay_role_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(database_url)
    try:
        # Utility statements take no bound parameters; the server quotes name and password.
        create = await admin.fetchval(
            "SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', $1::text, $2::text)",
            name,
            password,
        )
        await admin.execute(create)
        if member_of is not None:
            await admin.execute(f'GRANT "{member_of}" TO "{name}"')
        yield name
    finally:
        await admin.execute(f'DROP OWNED BY "{name}"')
        await admin.execute(f'DROP ROLE IF EXISTS "{name}"')
        await admin.close()


async def run_service_cli(
    *args: str, listen_port: int, env: dict[str, str] | None = None, settle: float = 20.0
) -> tuple[CliResult, dict[str, Any] | None]:
    """Start a long-running verb, wait for its /health to say within_bounds, then SIGTERM it.

    Returns what it printed and its last /health document (None when it never answered).
    A process that exits by itself (a refused start) is returned as it is.
    """
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        *args,
        "--listen",
        f"127.0.0.1:{listen_port}",
        cwd=REPO,
        env=cli_env() if env is None else env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    collected = asyncio.ensure_future(proc.communicate())
    document: dict[str, Any] | None = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle
    while proc.returncode is None and loop.time() < deadline:
        await asyncio.sleep(0.3)
        document = await _health_document(listen_port) or document
        if document is not None and document.get("classification") == "within_bounds":
            break
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = await asyncio.wait_for(collected, 30.0)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return CliResult(proc.returncode, out.decode(), err.decode()), document


async def _health_document(port: int) -> dict[str, Any] | None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2.0)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        raw = await asyncio.wait_for(reader.read(), 5.0)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    _, _, body = raw.partition(b"\r\n\r\n")
    try:
        document = json.loads(body)
    except ValueError:
        return None
    return document if isinstance(document, dict) else None
