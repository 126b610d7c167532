"""The orchestrator never uses or changes a PostgreSQL cluster it did not create.

The shell orchestrator it replaces edited the machine's own main cluster (pg_hba.conf,
conf.d, a restart) and made a superuser ``outbox`` with a known password on it. Here a
cluster the test makes itself, with a role of that very name, sits first on the port the
orchestrator wants, then beside it: its configuration files and roles are the same
before and after, and so are the clusters Debian's tools keep in /etc/postgresql.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.services.host import as_postgres, make_postgres_dir, pid_listening_on, run
from scripts.services.plan import PortPlan
from tests.orchestrator.scratch import ScratchCheckout, need_root, purged

# They start PostgreSQL clusters: one of their own and the orchestrator's.
pytestmark = pytest.mark.services

TAKEN_BASE = 24600  # the orchestrator's pg15 port there is the foreign cluster's
FREE_BASE = 24700
PG15 = Path("/usr/lib/postgresql/15/bin")
ROLES = (
    "SELECT rolname, rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolreplication,"
    " rolbypassrls, rolconnlimit, rolpassword, rolvaliduntil FROM pg_authid ORDER BY rolname"
)


class ForeignCluster:
    """A cluster of someone else's: initdb'd by the test, trust on its own socket only."""

    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port

    def _run(self, *argv: str) -> str:
        done = run(as_postgres(argv), timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def start(self) -> None:
        make_postgres_dir(self.root, 0o755)
        self._run(str(PG15 / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust")
        self._run(
            str(PG15 / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w",
            "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1", "start",
        )  # fmt: skip
        self.sql("CREATE ROLE outbox LOGIN NOSUPERUSER PASSWORD 'theirs' CONNECTION LIMIT 7")

    def sql(self, statement: str) -> str:
        return self._run(
            str(PG15 / "psql"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres",
            "-d", "postgres", "-qAtX", "-v", "ON_ERROR_STOP=1", "-c", statement,
        )  # fmt: skip

    def stop(self) -> None:
        run(as_postgres([str(PG15 / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]))

    def fingerprint(self) -> dict[str, str]:
        """Digests of its configuration files and of its roles, as they are now."""
        files = {
            name: hashlib.sha256((self.data / name).read_bytes()).hexdigest()
            for name in ("postgresql.conf", "postgresql.auto.conf", "pg_hba.conf", "pg_ident.conf")
        }
        return {**files, "roles": hashlib.sha256(self.sql(ROLES).encode()).hexdigest()}


def debian_clusters() -> dict[str, str]:
    """Digests of every file under /etc/postgresql (read only)."""
    root = Path("/etc/postgresql")
    if not root.is_dir():
        return {}
    return {
        str(path): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def foreign() -> Iterator[ForeignCluster]:
    need_root()
    if not (PG15 / "initdb").exists():
        pytest.skip("no PostgreSQL 15 binaries here to make a foreign cluster with")
    root = Path(tempfile.mkdtemp(prefix="outbox-relay-foreign-"))
    root.chmod(0o755)
    cluster = ForeignCluster(root / "cluster", PortPlan(TAKEN_BASE).pg15)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(600)
def test_a_cluster_it_did_not_create_is_left_as_it_was(
    foreign: ForeignCluster, tmp_path: Path
) -> None:
    before, etc_before = foreign.fingerprint(), debian_clusters()
    holder = pid_listening_on(f"127.0.0.1:{foreign.port}")
    assert holder is not None

    # On its port: refused in one line naming the process, nothing reused or reconfigured.
    taken = ScratchCheckout(tmp_path / "taken", TAKEN_BASE)
    with purged(taken):
        done = taken.services("up", "pg15")
        assert done.returncode == 1, done.stdout + done.stderr
        (line,) = [line for line in done.stderr.splitlines() if "ERROR" in line]
        assert line.startswith(
            f"services: ERROR: pg15: port {foreign.port} is taken by pid {holder} ("
        )
        assert str(foreign.data) in line

    # Beside it: the orchestrator's own cluster comes up; the foreign one is not touched.
    beside = ScratchCheckout(tmp_path / "beside", FREE_BASE)
    with purged(beside):
        done = beside.services("up", "pg15")
        assert done.returncode == 0, done.stderr
        ours = beside.env()["DATABASE_URL"]
        assert f":{PortPlan(FREE_BASE).pg15}/" in ours
        assert pid_listening_on(f"127.0.0.1:{PortPlan(FREE_BASE).pg15}") != holder

    assert foreign.fingerprint() == before
    assert debian_clusters() == etc_before
    assert pid_listening_on(f"127.0.0.1:{foreign.port}") == holder  # never restarted
    assert (
        foreign.sql("SELECT rolsuper, rolconnlimit FROM pg_roles WHERE rolname = 'outbox'")
        == "f|7\n"
    )


def test_the_cluster_digest_sees_a_change(foreign: ForeignCluster) -> None:
    """The comparison above can fail: a role changed is a different digest."""
    before = foreign.fingerprint()
    foreign.sql("ALTER ROLE outbox SUPERUSER")
    assert foreign.fingerprint()["roles"] != before["roles"]
    assert {k: v for k, v in foreign.fingerprint().items() if k != "roles"} == {
        k: v for k, v in before.items() if k != "roles"
    }
