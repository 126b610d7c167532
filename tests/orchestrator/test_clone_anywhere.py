"""The services a checkout's path matters to (PostgreSQL 18's binaries and data, PgBouncer's
files, the TLS files) start from a clone under a mode-700 directory whose name has a space,
as a new user's ``git clone … ~/outbox-relay`` as root makes it, and they answer.

PgBouncer runs as the postgres OS user, which cannot enter such a directory: it failed with
``pgbouncer: start failed`` and no reason.
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import tempfile
from pathlib import Path

import asyncpg
import pytest

from scripts.services.host import POSTGRES_USER, listener_inodes
from scripts.services.plan import PortPlan
from tests.orchestrator.scratch import ScratchCheckout, need_root, purged

# It starts PostgreSQL 18, PgBouncer and the TLS files of a checkout of its own.
pytestmark = pytest.mark.services

BASE = 24500  # neither the development block (24000) nor another orchestrator test's


@pytest.mark.timeout(900)
def test_pg18_pgbouncer_and_tls_start_from_a_locked_directory_with_a_space() -> None:
    need_root()
    with tempfile.TemporaryDirectory(prefix="outbox-relay-locked-", dir="/root") as locked:
        Path(locked).chmod(0o700)
        clone = Path(locked) / "my clone" / "outbox-relay"
        clone.mkdir(parents=True)
        unreachable = subprocess.run(
            ["runuser", "-u", POSTGRES_USER, "--", "test", "-x", str(clone)], check=False
        )
        assert unreachable.returncode != 0, "the postgres user can enter the clone"
        checkout = ScratchCheckout(clone, BASE).with_own_venv()
        with purged(checkout):
            done = checkout.services("up", "pg18", "pgbouncer")
            assert done.returncode == 0, done.stderr
            env = checkout.env()
            asyncio.run(_assert_answers(env))
            # the postgres user's files are outside the clone, PostgreSQL 18's binaries too
            side = checkout.layout.postgres_side
            assert (side / "pg18" / "data" / "PG_VERSION").exists()
            assert (side / "pgbouncer" / "pgbouncer.ini").exists()
            assert list((side / "pg18-binaries").iterdir())
            assert env["PG_TEST_CAFILE"].startswith(str(clone))
            status = checkout.services("status")
            for name in ("pg15", "pg18", "pgbouncer"):
                (line,) = [line for line in status.stdout.splitlines() if line.startswith(name)]
                assert line.split()[1] == "up", status.stdout
        assert not checkout.layout.postgres_side.exists()
        plan = PortPlan(BASE)
        for port in (plan.pg15, plan.pg18, plan.pgbouncer):
            assert not listener_inodes(port), f"port {port} still listened on after purge"


async def _assert_answers(env: dict[str, str]) -> None:
    pg18 = await asyncpg.connect(env["DATABASE_URL_PG18"])
    try:
        assert await pg18.fetchval("SELECT current_setting('server_version_num')::int") >= 180000
    finally:
        await pg18.close()
    pooled = await asyncpg.connect(env["DATABASE_URL_PGBOUNCER"], statement_cache_size=0)
    try:
        assert await pooled.fetchval("SELECT 1") == 1
    finally:
        await pooled.close()
    # The TLS files, read from the clone: the server's certificate verifies against its CA
    # for localhost, and the client certificate logs its role in.
    direct = await asyncpg.connect(env["DATABASE_URL"])
    try:
        await direct.execute(f'CREATE ROLE "{env["PG_TEST_CERT_USER"]}" LOGIN')
    finally:
        await direct.close()
    context = ssl.create_default_context(cafile=env["PG_TEST_CAFILE"])
    context.load_cert_chain(env["PG_TEST_CLIENT_CERTFILE"], env["PG_TEST_CLIENT_KEYFILE"])
    port = int(env["DATABASE_URL"].rsplit(":", 1)[1].split("/", 1)[0])
    certified = await asyncpg.connect(
        host="localhost", port=port, user=env["PG_TEST_CERT_USER"], database="postgres", ssl=context
    )
    try:
        assert await certified.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await certified.close()
