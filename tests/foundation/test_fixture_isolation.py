"""Any selection of tests runs alone: the suite's fixtures never hand one server's
template database to a test on another.

tests/fuzz narrows ``pg_server`` to the first server with a conftest of its own. A
session-wide template cached by pytest against that narrowed fixture outlived the switch
to the second server, and a test there was cloned from a template its server never had
(``template database … does not exist``), in a selection as small as the one below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.services import postgres_servers_from_env

# It runs tests against both PostgreSQL servers.
pytestmark = pytest.mark.services

_ROOT = Path(__file__).resolve().parents[2]
# A test under the narrowed pg_server first, then one that runs on every server.
_SELECTION = (
    "tests/fuzz/test_http_requests.py::test_random_bytes_are_answered_or_closed",
    "tests/foundation/test_cli.py::test_redrive_on_a_migrated_database_reports_the_count",
)


def test_a_narrowed_server_fixture_never_leaks_its_template_to_the_other_server() -> None:
    if len(postgres_servers_from_env()) < 2:
        pytest.skip("needs two PostgreSQL servers (make test starts them)")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_SELECTION],
        cwd=_ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tail = "\n".join(done.stdout.splitlines()[-15:])
    assert done.returncode == 0, f"the selection failed on its own:\n{tail}"
    assert "3 passed" in done.stdout, tail
