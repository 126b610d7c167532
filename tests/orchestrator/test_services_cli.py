"""``python -m scripts.services``: bad input is one line and exit 2, a failure one line and
exit 1 (run on a copy of scripts/, so that no service of this checkout is touched)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "scripts", tmp_path / "scripts")
    return tmp_path


def _services(checkout: Path, *args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scripts.services", *args],
        cwd=checkout,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **environ},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "environ", "message"),
    [
        (("restart",), {}, "services: error: argument command: invalid choice: 'restart'"),
        (
            ("up", "pg16"),
            {},
            "services: error: unknown service 'pg16' (known: tls pg15 pg18 kafka pgbouncer)",
        ),
        (
            ("status",),
            {"SERVICES_PORT_BASE": "80"},
            "services: error: SERVICES_PORT_BASE must be a port",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    checkout: Path, args: tuple[str, ...], environ: dict[str, str], message: str
) -> None:
    done = _services(checkout, *args, **environ)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith(message)
    assert not (checkout / ".services" / "env").exists()


def test_env_before_any_up_is_one_line_and_exit_1(checkout: Path) -> None:
    done = _services(checkout, "env")
    assert done.returncode == 1
    (line,) = done.stderr.splitlines()
    assert line == f"services: ERROR: {checkout / '.services' / 'env'} not found: run up first"
