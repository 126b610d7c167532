"""Two minutes of the soak (``make soak`` runs ten): the system on services of its own under
seeded faults; fails when an event is lost, a key's order breaks, a terminal job lacks its
one event, health broke an expectation, or the run proved too little (a fault that failed
to apply, fewer events or jobs than its rates promise). The seed is printed (``SOAK_SEED``
repeats it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.soak.services import REPO
from tests.support.services import REQUIRED

# It starts services of its own.
pytestmark = pytest.mark.services

SECONDS = 120
BASE_PORT = 25500  # make soak uses 25000: the two never meet


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_minutes_under_faults_lose_nothing_and_health_tells_the_truth(
    tmp_path: Path,
) -> None:
    if os.geteuid() != 0 and not REQUIRED:
        pytest.skip("the soak runs PostgreSQL as the postgres OS user: needs root")
    seed = os.environ.get("SOAK_SEED")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.soak.run",
            "--seconds",
            str(SECONDS),
            "--base-port",
            str(BASE_PORT),
            "--report",
            str(tmp_path / "report"),
            *(["--seed", seed] if seed else []),
        ],
        cwd=REPO,
        env={**os.environ, "SOAK_WORK_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    summary = done.stdout
    print(summary)
    assert "lost: 0\n" in summary, summary + done.stderr[-3000:]
    assert "order violations: 0\n" in summary, summary
    assert "scoring jobs without exactly one event: 0\n" in summary, summary
    assert "health expectations broken: 0\n" in summary, summary
    # Every scheduled fault applied, a ledger and a job table as full as the rates promise.
    assert "run problems: 0\n" in summary, summary
    assert done.returncode == 0, summary + done.stderr[-3000:]
    assert (tmp_path / "report" / "soak.png").stat().st_size > 0
