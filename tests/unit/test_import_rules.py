"""The package graph's rules are enforced: import-linter passes on the tree and fails on a
planted forbidden import (so the check in ``make lint`` can actually fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "outbox_relay",
    "relay",
    "health",
    "scoring",
    "migrations",
    "pgconnect",
    "contracts",
    "bench",
)
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _copy_tree(target: Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, target / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    _copy_tree(tmp_path)
    result = _lint(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        ("health/planted.py", "import relay.engine\n", "never import each other"),
        ("scoring/planted.py", "from health import evaluate\n", "never import each other"),
        ("relay/planted.py", "import outbox_relay.cli\n", "composition root above"),
        ("contracts/planted.py", "import pgconnect\n", "composition root above"),
        ("relay/planted.py", "import aiokafka\n", "Kafka seam imports aiokafka"),
        ("health/planted.py", "from aiokafka.errors import KafkaError\n", "Kafka seam"),
        ("bench/report/judging.py", "from bench.report import printed\n", "report's modules"),
        ("bench/report/plot.py", "from bench.report import history\n", "report's modules"),
    ],
)
def test_a_planted_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, planted: str, broken: str
) -> None:
    _copy_tree(tmp_path)
    (tmp_path / module).write_text(planted)
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert f"{broken}" in result.stdout
    assert "BROKEN" in result.stdout
