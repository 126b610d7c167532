"""Running ``outbox-relay`` as a real process, and reading what it printed."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import migrations

REPO = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent
SHIPPED = ("0001_outbox.sql", "0002_scoring_job_state.sql", "0003_scoring_job_health_indexes.sql")

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
