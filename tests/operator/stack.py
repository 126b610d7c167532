"""Running ``outbox-relay run`` as operators do, and reading its HTTP surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Ports of this test package: one per process, well away from the services.
PORT_BASE = 26150

POLICY = """
[outbox]
max_pending_count = 1000
max_pending_age_ms = 3600000
max_quarantined_count = 0
gates_readiness = true
[scoring_jobs]
max_active_job_count = 1000
max_active_job_age_ms = 3600000
max_quarantined_job_count = 0
max_expired_lease_count = 0
gates_readiness = true
[completion_outbox]
grace_ms = 30000
lookback_ms = 86400000
max_missing_count = 0
gates_readiness = true
[relay]
max_heartbeat_age_ms = 20000
max_unowned_lane_count = 0
max_publish_stall_ms = 30000
max_blocking_transaction_age_ms = 60000
gates_readiness = true
[evaluation]
interval_ms = 200
timeout_ms = 2000
max_evidence_age_ms = 10000
"""


def write_policy(tmp_path: Path) -> Path:
    """The policy every test here runs with: tight counts, loose ages, fast evaluations."""
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


def instance_id(port: int) -> str:
    """The relay instance id of the process listening on ``port``."""
    return f"operator-{port}"


@dataclass(frozen=True)
class Stack:
    """What ``outbox-relay run`` needs here: a scratch database, the broker, a topic
    namespace of its own and the policy file (its log is written beside it)."""

    database_url: str
    bootstrap: str
    namespace: str
    policy: Path

    def log(self, port: int) -> str:
        """The log of the process that listened on ``port``."""
        return self.policy.with_name(f"run-{port}.log").read_text()


@contextmanager
def running(stack: Stack, port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """``outbox-relay run`` on ``127.0.0.1:port``, killed on exit."""
    env = {
        **os.environ,
        "DATABASE_URL": stack.database_url,
        "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap,
        "OUTBOX_RELAY_POLICY": str(stack.policy),
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{stack.namespace}.{{aggregatetype}}",
        "OUTBOX_RELAY_INSTANCE_ID": instance_id(port),
        "OUTBOX_RELAY_LEASE_TTL_MS": "3000",
        "OUTBOX_RELAY_LEASE_RENEW_MS": "500",
        "OUTBOX_RELAY_SEND_TIMEOUT_MS": "1500",
        "HEALTH_LISTEN_ADDR": f"127.0.0.1:{port}",
    }
    log = stack.policy.with_name(f"run-{port}.log")
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "outbox_relay", "run", *extra],
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)


def fetch(port: int, path: str) -> tuple[int, bytes] | None:
    """Status and body of one GET, or None while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def header(port: int, path: str, name: str) -> str | None:
    """One response header of a GET."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
        value: str | None = reply.headers[name]
        return value


def health(port: int) -> dict[str, Any] | None:
    """The /health document once an evaluation has finished, else None."""
    answer = fetch(port, "/health")
    if answer is None:
        return None
    document: dict[str, Any] = json.loads(answer[1])
    return document if "classification" in document else None  # absent before the first
