"""``.services/env``: export lines a shell sources, rewritten only where a service owns them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from scripts.services import envfile

VALUES = {
    "DATABASE_URL": "postgresql://outbox:outbox@127.0.0.1:24032/postgres",
    "PG_TEST_CAFILE": "/root/or ch/clone/.services/tls/ca.pem",
    "KAFKA_PROXY_ROUTES": "127.0.0.1:24194>127.0.0.1:24094,127.0.0.1:24195>127.0.0.1:24095",
    "ODD": "it's $HOME `x`",
}


def test_what_is_written_is_what_is_read_back() -> None:
    assert envfile.parse(envfile.render(VALUES)) == VALUES


def test_bash_sources_the_file_to_the_same_values(tmp_path: Path) -> None:
    path = tmp_path / "env"
    path.write_text(envfile.render(VALUES))
    for name, value in VALUES.items():
        done = subprocess.run(
            ["bash", "-c", f'set -a; . "$0"; set +a; printf %s "${name}"', str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert done.stdout == value


def test_up_of_some_services_keeps_the_others_lines_and_drops_its_stale_ones() -> None:
    earlier = {
        "DATABASE_URL": "postgresql://old",
        "PG_TEST_CAFILE": "/old/ca.pem",
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:24092",
    }
    # pg15 now comes from the environment: its TLS lines no longer apply and are dropped
    fresh = {"DATABASE_URL": "postgresql://elsewhere"}
    merged = envfile.merge(earlier, {"DATABASE_URL", "PG_TEST_CAFILE"}, fresh)
    assert merged == {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:24092",
        "DATABASE_URL": "postgresql://elsewhere",
    }
