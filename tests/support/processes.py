"""``outbox-relay run`` as processes, the way operators run it, for the fault scenarios and
the soak: each with its JSON log in a file the test reads."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.ports import free_port

# The sidecar runs beside every relay; no health family matters to these tests.
POLICY_ALL_DISABLED = "".join(
    f"[{family}]\nenabled = false\n"
    for family in ("outbox", "scoring_jobs", "completion_outbox", "relay")
)

# Small leases and timeouts keep every scenario within seconds; each test overrides what
# its fault needs. The relay's own check holds: lease > 2 x renew + send timeout.
FAST_RELAY = {
    "OUTBOX_RELAY_BATCH_SIZE": "100",
    "OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES": "2",
    "OUTBOX_RELAY_LEASE_TTL_MS": "6000",
    "OUTBOX_RELAY_LEASE_RENEW_MS": "500",
    "OUTBOX_RELAY_SEND_TIMEOUT_MS": "3000",
    "OUTBOX_RELAY_POLL_INTERVAL_MS": "200",
    "OUTBOX_RELAY_RETRY_BASE_MS": "100",
    "OUTBOX_RELAY_RETRY_CAP_MS": "1000",
    "OUTBOX_RELAY_DRAIN_TIMEOUT_MS": "3000",
    "OUTBOX_RELAY_LINGER_MS": "1",
}


@dataclass
class RelayProcess:
    """One ``outbox-relay run`` process; its JSON log lines go to a file the test reads."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    signalled_at: float | None = None
    exited_at: float | None = None

    def __post_init__(self) -> None:
        # Exit time as it happens, not as a poll notices it.
        self._exited = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        self.process.wait()
        self.exited_at = time.monotonic()
        self._exited.set()

    def logs(self) -> list[dict[str, Any]]:
        entries = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    continue
        return entries

    def logged(self, message: str) -> list[dict[str, Any]]:
        return [entry for entry in self.logs() if entry.get("msg") == message]

    def terminate(self) -> None:
        self.signalled_at = time.monotonic()
        self.process.send_signal(signal.SIGTERM)

    async def exited_within(self, seconds: float) -> float | None:
        """Seconds from SIGTERM to exit, or None if still running after ``seconds``."""
        assert self.signalled_at is not None
        remaining = self.signalled_at + seconds - time.monotonic()
        if not await asyncio.to_thread(self._exited.wait, max(remaining, 0.0)):
            return None
        assert self.exited_at is not None
        return self.exited_at - self.signalled_at


@dataclass
class Relays:
    """Starts relay processes for one test and kills whatever is left at its end."""

    database_url: str
    namespace: str
    directory: Path
    started: list[RelayProcess] = field(default_factory=list)

    def start(self, name: str, bootstrap: str, *run_args: str, **overrides: str) -> RelayProcess:
        """``outbox-relay run [run_args]``, e.g. ``--no-relay`` for a sidecar alone."""
        policy = self.directory / "policy.toml"
        policy.write_text(POLICY_ALL_DISABLED)
        log_path = self.directory / f"{name}.log"
        env = {
            **os.environ,
            **FAST_RELAY,
            "DATABASE_URL": self.database_url,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "OUTBOX_RELAY_POLICY": str(policy),
            "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{self.namespace}.{{aggregatetype}}",
            "OUTBOX_RELAY_INSTANCE_ID": name,
            "OUTBOX_RELAY_LOG_FORMAT": "json",
            "HEALTH_LISTEN_ADDR": f"127.0.0.1:{free_port()}",
            **overrides,  # a test's own settings win, e.g. a database behind a proxy
        }
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "outbox_relay", "run", *run_args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        relay = RelayProcess(name, process, log_path)
        self.started.append(relay)
        return relay

    def kill_all(self) -> None:
        for relay in self.started:
            if relay.process.poll() is None:
                relay.process.kill()
            relay.process.wait(timeout=30)


def redrive_all(database_url: str) -> str:
    """``outbox-relay redrive --all`` as an operator runs it; returns what it printed."""
    done = subprocess.run(
        [sys.executable, "-m", "outbox_relay", "redrive", "--all"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        timeout=30,
        check=True,
    )
    return done.stdout.decode()
