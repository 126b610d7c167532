"""The tests of ``make check``: every test the ``services`` marker leaves out, in three
pytest processes side by side, so the tests that wait (timers, processes starting) overlap
the ones that compute. Each of the first ones takes the folders :data:`GROUPS` gives it,
the last every other folder, so a new folder is never left out. Each process's report is
printed whole, one after the other; the exit code is the first failing one's.

    python -m tests.support.check [pytest arguments]
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

# Folders whose tests mostly run the CLI as processes or wait on timers, grouped so that the
# processes end at about the same time.
GROUPS = (("tests/fuzz", "tests/health"), ("tests/foundation", "tests/orchestrator"))

SELECT = (
    "-m",
    "not services",
    # It builds a venv from the package index: `make test` runs it.
    "--deselect",
    "tests/deploy/test_lock.py::test_make_venv_installs_exactly_the_lock_and_a_drift_is_caught",
)

NOTHING_COLLECTED = 5


def commands(extra: Sequence[str]) -> list[list[str]]:
    """The pytest command lines, ``extra`` arguments given to each."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECT, *extra]
    named = [folder for group in GROUPS for folder in group]
    rest = ["tests", *(f"--ignore={folder}" for folder in named)]
    return [*([*pytest, *group] for group in GROUPS), [*pytest, *rest]]


def verdict(codes: Sequence[int]) -> int:
    """The run's exit code: a selection that some processes found nothing in is fine, as
    long as another ran something."""
    failed = [code for code in codes if code not in (0, NOTHING_COLLECTED)]
    if failed:
        return failed[0]
    return NOTHING_COLLECTED if all(code == NOTHING_COLLECTED for code in codes) else 0


def main(argv: Sequence[str]) -> int:
    running = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for command in commands(argv)
    ]
    codes = []
    for process in running:
        output, _ = process.communicate()
        sys.stdout.write(output)
        sys.stdout.flush()
        codes.append(process.returncode)
    return verdict(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
