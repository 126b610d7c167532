"""What nothing expected, as an operator sees it: one log line with the exception's type and
the innermost frame of the product (file:line), the whole traceback only at debug level,
never Python's raw traceback and never the exception's text; a verb it ends exits 1.

The errors are planted in real processes (tests/foundation/planted.py) against the real
services; each planted message carries a secret-shaped URL, as driver text can.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import outbox_relay.cli
import outbox_relay.service
from tests.support.cli import REPO, cli_env
from tests.support.ports import free_port

SECRET = "pl4nted-s3cret"
PLANTED_MESSAGE = f"cannot reach postgresql://relay:{SECRET}@db.internal/app"
POLICY = str(REPO / "docs" / "policy.example.toml")


def line_of(module: Any, text: str) -> int:
    """The number of the one line of ``module``'s source that holds ``text``."""
    lines = Path(module.__file__).read_text(encoding="utf-8").splitlines()
    found = [number for number, line in enumerate(lines, 1) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


async def planted(
    plant: str,
    *args: str,
    env: dict[str, str],
    until: str | None = None,
    timeout: float = 60.0,
) -> tuple[int, str, str]:
    """Run ``outbox-relay ARGS`` with ``plant``; stopped (SIGTERM) once stderr holds
    ``until``, else left to exit by itself. Returns the exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.foundation.planted",
        plant,
        *args,
        cwd=REPO,
        env={**env, "PLANTED_MESSAGE": PLANTED_MESSAGE},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr: list[bytes] = []

    async def read_stderr() -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            stderr.append(line)
            if until is not None and until.encode() in line and proc.returncode is None:
                proc.send_signal(signal.SIGTERM)

    try:
        _, stdout = await asyncio.wait_for(
            asyncio.gather(read_stderr(), proc.stdout.read()), timeout
        )
        code = await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"still running; stderr so far: {b''.join(stderr)!r}") from None
    return code, stdout.decode(), b"".join(stderr).decode()


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every stderr line, each of which must be one JSON object."""
    return [json.loads(line) for line in stderr.splitlines() if line.strip()]


def the_line(lines: list[dict[str, Any]], msg: str) -> dict[str, Any]:
    found = [line for line in lines if line["msg"] == msg]
    assert len(found) == 1, lines
    return found[0]


def run_args(database_url: str, kafka_bootstrap: str, *more: str) -> list[str]:
    return [
        "run",
        "--policy",
        POLICY,
        "--database-url",
        database_url,
        "--kafka-bootstrap",
        kafka_bootstrap,
        "--listen",
        f"127.0.0.1:{free_port()}",
        *more,
    ]


async def test_an_error_that_ends_run_is_one_line_with_its_type_and_place_and_exit_1(
    database_url: str, kafka_bootstrap: str
) -> None:
    code, stdout, stderr = await planted(
        "relay-run", *run_args(database_url, kafka_bootstrap), env=cli_env()
    )

    assert code == 1, stderr
    assert "Traceback" not in stderr
    assert SECRET not in stdout + stderr and "db.internal" not in stdout + stderr
    line = the_line(json_lines(stderr), "stopped by an unexpected error")
    assert line["level"] == "error"
    assert line["exc_type"] == "RuntimeError"
    # The innermost frame of the product: where the service called the relay.
    called = line_of(outbox_relay.service, "await relay.run(stop, ")
    assert line["at"] == f"outbox_relay/service.py:{called}"
    assert "traceback" not in line  # only at debug level


async def test_at_debug_level_the_whole_traceback_is_logged_without_any_message(
    database_url: str, kafka_bootstrap: str
) -> None:
    code, stdout, stderr = await planted(
        "relay-run",
        *run_args(database_url, kafka_bootstrap, "--log-level", "debug"),
        env=cli_env(),
    )

    assert code == 1, stderr
    assert SECRET not in stdout + stderr and "db.internal" not in stdout + stderr
    line = the_line(json_lines(stderr), "stopped by an unexpected error")
    trace = line["traceback"]
    called = line_of(outbox_relay.service, "await relay.run(stop, ")
    assert f'File "outbox_relay/service.py", line {called}, in _relay_then_stop' in trace
    assert 'File "tests/foundation/planted.py"' in trace  # where it was raised
    assert "RuntimeError (message not shown)" in trace
    assert "Traceback (most recent call last):" in trace


async def test_an_error_that_ends_migrate_is_logged_the_same_way(database_url: str) -> None:
    code, stdout, stderr = await planted(
        "migrate", "migrate", "--database-url", database_url, env=cli_env()
    )

    assert code == 1, stderr
    assert "Traceback" not in stderr
    assert SECRET not in stdout + stderr
    line = the_line(json_lines(stderr), "stopped by an unexpected error")
    assert line["exc_type"] == "RuntimeError"
    assert line["verb"] == "migrate"
    called = line_of(outbox_relay.cli, "applied = await apply(")
    assert line["at"] == f"outbox_relay/cli.py:{called}"


@pytest.mark.parametrize("level", ["info", "debug"])
async def test_a_crash_of_the_kafka_clients_sender_task_is_logged(
    database_url: str, kafka_bootstrap: str, topic_namespace: str, level: str
) -> None:
    # aiokafka logs it itself (at error, with the exception): its logger was silenced to
    # critical at the default level, so this crash left no line at all.
    args = run_args(
        database_url,
        kafka_bootstrap,
        "--topic-template",
        f"{topic_namespace}.{{aggregatetype}}",
        "--log-level",
        level,
    )
    code, stdout, stderr = await planted(
        "kafka-sender", *args, env=cli_env(), until="Unexpected error in sender routine"
    )

    assert code == 0, stderr  # stopped by SIGTERM once the line was there
    assert SECRET not in stdout + stderr
    lines = json_lines(stderr)
    line = the_line(lines, "Unexpected error in sender routine")
    assert line["level"] == "error"
    assert line["logger"].startswith("aiokafka")
    assert line["exc_type"] == "RuntimeError"
    # No frame of the product in the sender task: the innermost frame, the planted one.
    assert line["at"].startswith("tests/foundation/planted.py:")
    assert ("traceback" in line) is (level == "debug")
    # Never below info from the Kafka client, also at debug level.
    assert not [x for x in lines if x["logger"].startswith("aiokafka") and x["level"] == "debug"]
