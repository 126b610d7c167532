"""The operator's terminal: ``status --watch`` and ``redrive --dry-run`` / progress."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import asyncpg
import pytest

from tests.operator.stack import write_policy

CLEAR = b"\x1b[H\x1b[2J"
COLOUR = b"\x1b[32m"  # within_bounds


def _ctrl_c_as_at_a_terminal() -> None:
    """A terminal's foreground process gets Ctrl-C; a shell that runs this suite in the
    background (``make test &``) ignores SIGINT, and its children inherit that, so the
    watcher would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _watch(database_url: str, policy: Path, stdout: int, **env: str) -> subprocess.Popen[bytes]:
    # COLUMNS and LINES would override the terminal's own size.
    inherited = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "LINES")}
    environment = inherited | env
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "outbox_relay",
            "status",
            "--watch",
            "--interval-ms",
            "100",
            "--database-url",
            database_url,
            "--policy",
            str(policy),
        ],
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=environment,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )


def _read_until(fd: int, marker: bytes, count: int, timeout: float = 90.0) -> bytes:
    """Read ``fd`` until ``marker`` has been seen ``count`` times."""
    data = b""
    deadline = time.monotonic() + timeout
    while data.count(marker) < count:
        assert time.monotonic() < deadline, data[-2000:]
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, data[-2000:]
            data += chunk
    return data


def _interrupt(process: subprocess.Popen[bytes]) -> tuple[int, bytes]:
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    return process.returncode, stderr


def test_watch_into_a_pipe_prints_plain_blocks_and_ctrl_c_exits_130(
    database_url: str, tmp_path: Path
) -> None:
    process = _watch(database_url, write_policy(tmp_path), subprocess.PIPE)
    assert process.stdout is not None
    try:
        output = _read_until(process.stdout.fileno(), b"overall: ", 3)
        code, stderr = _interrupt(process)
    finally:
        if process.poll() is None:
            process.kill()
    assert b"\x1b" not in output  # neither clearing nor colour when not a terminal
    assert output.count(b"FAMILY ") >= 3
    assert b"expired_lease_count=0/max 0" in output
    assert code == 130
    assert b"Traceback" not in stderr


@pytest.mark.parametrize("no_color", [False, True])
def test_watch_on_a_terminal_redraws_in_place_coloured_unless_no_color(
    database_url: str, tmp_path: Path, no_color: bool
) -> None:
    controller, terminal = pty.openpty()
    env = {"NO_COLOR": "1"} if no_color else {}
    try:
        process = _watch(database_url, write_policy(tmp_path), terminal, **env)
        os.close(terminal)
        try:
            output = _read_until(controller, b"overall: ", 2)
            code, stderr = _interrupt(process)
        finally:
            if process.poll() is None:
                process.kill()
    finally:
        os.close(controller)
    assert output.count(CLEAR) >= 2
    assert (COLOUR in output) is not no_color
    assert code == 130
    assert b"Traceback" not in stderr


# Every measurement the test policy's four families show, as ``name=`` in the table.
MEASUREMENTS = sorted(
    [
        "pending_count",
        "oldest_pending_age",
        "retrying_count",
        "quarantined_count",
        "active_count",
        "oldest_active_age",
        "quarantined_count",
        "expired_lease_count",
        "oldest_expired_lease_age",
        "missing_count",
        "oldest_missing_age",
        "live_instance_count",
        "instance_count",
        "heartbeat_age",
        "last_publish_age",
        "unowned_lane_count",
        "lane_count",
        "oldest_ready_age",
        "blocking_transaction_count",
        "oldest_blocking_transaction_age",
    ]
)
_ANSI = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
# One measurement as the table shows it: ``name=value`` and its bound, if any.
_SHOWN = re.compile(r"\b([a-z_]+)=(?:-|\d+(?:ms)?)(?:/max \d+(?:ms)?)?(?=\s|$)")


def _frame_on_a_terminal(database_url: str, policy: Path, columns: int) -> list[str]:
    """The first table ``status --watch`` draws on a terminal ``columns`` wide, as lines."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    try:
        process = _watch(database_url, policy, terminal, NO_COLOR="1")
        os.close(terminal)
        try:
            output = _read_until(controller, CLEAR, 2)
            code, stderr = _interrupt(process)
        finally:
            if process.poll() is None:
                process.kill()
    finally:
        os.close(controller)
    assert code == 130, stderr
    frame = _ANSI.sub(b"", output.split(CLEAR)[1]).decode()
    return frame.replace("\r\n", "\n").rstrip("\n").split("\n")


@pytest.mark.parametrize("columns", [80, 110, 200])
def test_watch_lays_each_family_out_to_the_terminal_width(
    database_url: str, tmp_path: Path, columns: int
) -> None:
    lines = _frame_on_a_terminal(database_url, write_policy(tmp_path), columns)
    text = "\n".join(lines)
    # Nothing the terminal would wrap: every line fits, so no measurement is cut mid-word.
    assert max(len(line) for line in lines) <= columns, text
    shown = [name for line in lines for name in _SHOWN.findall(line)]
    assert sorted(shown) == MEASUREMENTS, text
    if columns >= 200:
        # Wide: the measurements stand in columns beside each other.
        assert max(len(_SHOWN.findall(line)) for line in lines) >= 3, text
    assert lines[0].startswith("FAMILY"), text
    assert any(line.startswith("overall: ") for line in lines), text


async def _quarantine(db: asyncpg.Connection, cause: str, keys: int, per_key: int) -> None:
    await db.executemany(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4)",
        [
            ("order", f"{cause}-key-{k}", "placed", json.dumps({"n": n}))
            for k in range(keys)
            for n in range(per_key)
        ],
    )
    await db.execute(
        "UPDATE outbox SET quarantined_at = clock_timestamp(), attempts = 5, "
        "last_error_class = $1 WHERE aggregateid LIKE $1 || '-key-%'",
        cause,
    )


async def _cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        *args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stdout, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


OUTBOX_ROWS = "SELECT * FROM outbox ORDER BY seq"


async def test_redrive_dry_run_shows_each_cause_and_changes_nothing(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _quarantine(db, "MessageSizeTooLarge", keys=2, per_key=3)
    await _quarantine(db, "InvalidTopic", keys=1, per_key=1)
    before = [tuple(row) for row in await db.fetch(OUTBOX_ROWS)]

    code, stdout, stderr = await _cli(
        "redrive", "--all", "--dry-run", "--database-url", database_url
    )

    assert code == 0, stderr
    assert stdout.splitlines() == [
        "dry run: would return 7 quarantined event(s) to the relay",
        "  MessageSizeTooLarge: 6 event(s) on 2 key(s)",
        "  InvalidTopic: 1 event(s) on 1 key(s)",
    ]
    assert [tuple(row) for row in await db.fetch(OUTBOX_ROWS)] == before
    # A narrower filter narrows the preview the same way the redrive would.
    code, stdout, _ = await _cli(
        "redrive", "--error-class", "InvalidTopic", "--dry-run", "--database-url", database_url
    )
    assert stdout.splitlines()[0] == "dry run: would return 1 quarantined event(s) to the relay"
    assert [tuple(row) for row in await db.fetch(OUTBOX_ROWS)] == before


async def test_a_long_redrive_shows_progress_per_batch_on_stderr(
    database_url: str, db: asyncpg.Connection
) -> None:
    await _quarantine(db, "MessageSizeTooLarge", keys=50, per_key=50)  # 2500: three batches

    code, stdout, stderr = await _cli("redrive", "--all", "--database-url", database_url)

    assert code == 0, stderr
    assert stdout.strip() == "returned 2500 quarantined event(s) to the relay"
    assert [line for line in stderr.splitlines() if line.startswith("redrive:")] == [
        "redrive: returned 1000 of 2500",
        "redrive: returned 2000 of 2500",
        "redrive: returned 2500 of 2500",
    ]
    assert await db.fetchval("SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL") == 0
