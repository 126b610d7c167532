"""tests/support/check.py: make check's two pytest processes leave no test folder out."""

from __future__ import annotations

from pathlib import Path

from tests.support import check

REPO = Path(__file__).resolve().parents[2]


def test_the_two_processes_share_the_selection_and_split_the_folders() -> None:
    first, second = check.commands(["-k", "name"])
    for command in (first, second):
        assert command[command.index("-m", 3) + 1] == "not services"
        assert command[command.index("-k") + 1] == "name"
    assert first[-len(check.FIRST) :] == list(check.FIRST)
    ignored = {arg.removeprefix("--ignore=") for arg in second if arg.startswith("--ignore=")}
    assert ignored == set(check.FIRST)
    assert "tests" in second
    assert all((REPO / folder).is_dir() for folder in check.FIRST)


def test_the_verdict_is_the_first_failure_and_one_empty_selection_is_fine() -> None:
    assert check.verdict([0, 0]) == 0
    assert check.verdict([1, 0]) == 1
    assert check.verdict([0, 2]) == 2
    assert check.verdict([5, 0]) == 0  # -k found its tests in the other process only
    assert check.verdict([5, 5]) == 5
    assert check.verdict([5, 1]) == 1
