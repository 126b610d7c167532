"""The Makefile's entry points: `make help` is built from the `## ` comment on each target's
rule, and `make check` is lint plus every test that needs no service."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support import check

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()


def _make(*args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_help_lists_every_target_with_what_its_rule_says() -> None:
    phony = re.search(r"^\.PHONY: (.+)$", MAKEFILE, re.MULTILINE)
    assert phony is not None
    targets = phony.group(1).split()
    listed = dict(line.split(None, 1) for line in _make("-s", "help").splitlines())
    assert list(listed) == targets  # in the Makefile's order, none left out
    for target, says in listed.items():
        assert re.search(rf"^{re.escape(target)}:.*## {re.escape(says)}$", MAKEFILE, re.M)
    assert "check" in listed and "test" in listed


def test_check_is_lint_then_the_tests_the_services_marker_leaves_out() -> None:
    planned = _make("-n", "check")
    for step in ("ruff check", "ruff format --check", "mypy", "lint-imports"):
        assert step in planned
    assert planned.index("lint-imports") < planned.index("-m tests.support.check")
    for command in check.commands([]):
        assert command[command.index("-m", 3) : command.index("-m", 3) + 2] == [
            "-m",
            "not services",
        ]
