"""``outbox-relay`` as operators run it, in its own process, with everything it prints kept."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.support.ports import free_port
from tests.support.processes import POLICY_ALL_DISABLED

# Only the outbox family: a report with no family enabled would not need the database.
POLICY_OUTBOX_ONLY = POLICY_ALL_DISABLED.replace(
    "[outbox]\nenabled = false",
    "[outbox]\nmax_pending_count = 10000\nmax_pending_age_ms = 60000\n"
    "max_quarantined_count = 0\ngates_readiness = true",
)


def run_cli(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``outbox-relay ARGS`` to completion, its output kept apart."""
    return subprocess.run(
        [sys.executable, "-m", "outbox_relay", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def policy_file(directory: Path, text: str = POLICY_ALL_DISABLED) -> str:
    path = directory / "policy.toml"
    path.write_text(text)
    return str(path)


class Service:
    """A running ``outbox-relay run``: its output lines, its HTTP endpoints, its process list."""

    def __init__(self, env: Mapping[str, str], *args: str) -> None:
        self.port = free_port()
        self.lines: list[str] = []
        full_env = {**env, "HEALTH_LISTEN_ADDR": f"127.0.0.1:{self.port}"}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox_relay", "run", *args],
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):
                    return line
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no such line; output was: {self.lines}")

    def get(self, path: str) -> tuple[int, str]:
        """The endpoint's status and body; status 0 while nothing listens."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as reply:
                return reply.status, reply.read().decode("utf-8")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8")
        except (urllib.error.URLError, ConnectionError):
            return 0, ""  # not listening (yet)

    def stop(self) -> int:
        """SIGTERM, wait, and return the exit code (the output stays in ``lines``)."""
        if self.process.poll() is None:
            self.process.terminate()
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return code


def process_list(*pids: int) -> str:
    """The full command lines of ``pids`` as any user of the machine sees them in ``ps``."""
    selected = ",".join(str(pid) for pid in pids)
    return subprocess.run(
        ["ps", "-ww", "-o", "pid=,args=", "-p", selected],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
