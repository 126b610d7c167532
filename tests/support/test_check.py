"""tests/support/check.py: make check's pytest processes leave no test folder out."""

from __future__ import annotations

from pathlib import Path

from tests.support import check

REPO = Path(__file__).resolve().parents[2]


def test_the_processes_share_the_selection_and_split_the_folders() -> None:
    commands = check.commands(["-k", "name"])
    assert len(commands) == len(check.GROUPS) + 1
    for command in commands:
        assert command[command.index("-m", 3) + 1] == "not services"
        assert command[command.index("-k") + 1] == "name"
    named = [folder for group in check.GROUPS for folder in group]
    assert len(set(named)) == len(named)  # no folder runs twice
    for command, group in zip(commands, check.GROUPS, strict=False):
        assert command[-len(group) :] == list(group)
    *_, rest = commands
    ignored = [arg.removeprefix("--ignore=") for arg in rest if arg.startswith("--ignore=")]
    assert ignored == named
    assert "tests" in rest
    assert all((REPO / folder).is_dir() for folder in named)


def test_the_verdict_is_the_first_failure_and_an_empty_selection_is_fine() -> None:
    assert check.verdict([0, 0, 0]) == 0
    assert check.verdict([1, 0, 0]) == 1
    assert check.verdict([0, 2, 1]) == 2
    assert check.verdict([5, 0, 5]) == 0  # -k found its tests in one process only
    assert check.verdict([5, 5, 5]) == 5
    assert check.verdict([5, 1, 0]) == 1
