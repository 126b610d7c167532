"""Debian's PgBouncer in transaction pooling mode in front of our PostgreSQL 15.

It refuses to run as root, so it runs as the ``postgres`` OS user, and everything it reads
or writes (configuration, auth file, log, pid file) is in the layout's postgres-side
directory, which that user can always reach.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

from scripts.services.declaration import Service
from scripts.services.host import (
    apt_install,
    as_postgres,
    ensure_postgres_user,
    failure,
    make_postgres_dir,
    pid_from_file,
    run,
    terminate,
    write_postgres_file,
)
from scripts.services.postgres import PASSWORD, SUPERUSER
from scripts.services.probes import postgres_answer

log = logging.getLogger("services")

BINARY = "/usr/sbin/pgbouncer"


def pgbouncer_ini(*, port: int, upstream_port: int, home: Path) -> list[str]:
    """The configuration: every database name passed through to the server of the same name
    (``*``), SCRAM for clients and for the server, and a small pool so that clients share
    server connections the way a production pooler makes them. ``ignore_startup_parameters``
    stays unset on purpose: the product must connect without it."""
    return [
        "; written by python -m scripts.services; a change restarts PgBouncer",
        "[databases]",
        f"* = host=127.0.0.1 port={upstream_port}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "pool_mode = transaction",
        "default_pool_size = 4",
        "max_client_conn = 400",
        "auth_type = scram-sha-256",
        f"auth_file = {home / 'userlist.txt'}",
        "server_tls_sslmode = disable",
        f"logfile = {home / 'pgbouncer.log'}",
        f"pidfile = {home / 'pgbouncer.pid'}",
    ]


class PgBouncer(Service):
    """PgBouncer on ``port``, pooling for the cluster on ``upstream_port``."""

    name = "pgbouncer"
    needs = ("pg15",)
    wait_s = 30.0
    address_variable = "DATABASE_URL_PGBOUNCER"

    def __init__(self, *, port: int, upstream_port: int, home: Path) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self.home = home
        self.ini = home / "pgbouncer.ini"

    def url(self) -> str:
        return f"postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def address(self) -> str:
        return self.url()

    def ports(self) -> list[int]:
        return [self.port]

    def log_file(self) -> Path:
        return self.home / "pgbouncer.log"

    def _binary(self) -> str:
        return shutil.which("pgbouncer") or BINARY

    def install(self) -> None:
        ensure_postgres_user()
        if shutil.which("pgbouncer") is None and not Path(BINARY).exists():
            apt_install("pgbouncer")

    def settings(self) -> list[str]:
        version = run([self._binary(), "--version"], timeout=30).stdout.splitlines()[:1]
        return [
            *version,
            *pgbouncer_ini(port=self.port, upstream_port=self.upstream_port, home=self.home),
        ]

    def pid(self) -> int | None:
        return pid_from_file(self.home / "pgbouncer.pid", command_has=["pgbouncer", str(self.ini)])

    def running(self) -> bool:
        return self.pid() is not None

    def start(self) -> None:
        make_postgres_dir(self.home)
        ini = pgbouncer_ini(port=self.port, upstream_port=self.upstream_port, home=self.home)
        write_postgres_file(self.ini, "\n".join(ini) + "\n")
        write_postgres_file(self.home / "userlist.txt", f'"{SUPERUSER}" "{PASSWORD}"\n')
        log.info("pgbouncer: starting (transaction pooling) on 127.0.0.1:%d", self.port)
        done = run(as_postgres([self._binary(), "-d", str(self.ini)]), timeout=60)
        if done.returncode != 0:
            raise failure(
                self.name,
                "did not start",
                output=done.stdout + done.stderr,
                log_file=self.log_file(),
            )
        # -d returns once it has forked; the daemon writes its pid file just after
        deadline = time.monotonic() + 5
        while not self.running():
            if time.monotonic() > deadline:
                raise failure(self.name, "exited after starting", log_file=self.log_file())
            time.sleep(0.1)

    def ready(self) -> str | None:
        answer = postgres_answer(self.url(), pooled=True)
        return answer if isinstance(answer, str) else None

    def probe(self, address: str) -> str | None:
        answer = postgres_answer(address, pooled=True)
        return answer if isinstance(answer, str) else None

    def stop(self) -> None:
        pid = self.pid()
        if pid is None:
            return
        log.info("pgbouncer: stopping pid %d", pid)
        terminate(pid, grace_s=10, service=self.name)

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL_PGBOUNCER": self.url()}

    def describe(self) -> str:
        return f"transaction pooling in front of 127.0.0.1:{self.upstream_port}, files {self.home}"
