"""Bringing a set of declared services up and down, and saying how they are."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from scripts.services import envfile
from scripts.services.declaration import Service, fingerprint, wait_until_ready
from scripts.services.host import ServiceError, port_taken_by, remove_tree
from scripts.services.kafka import DEV_PROFILE, KafkaBroker
from scripts.services.pgbouncer import PgBouncer
from scripts.services.plan import PORT_BASE_VARIABLE, Layout, PortPlan
from scripts.services.postgres import (
    COMMON_SETTINGS,
    LOGICAL_WAL_SETTINGS,
    DebianBinaries,
    PostgresCluster,
    WheelBinaries,
)
from scripts.services.tls import DevTls

log = logging.getLogger("services")

LOCK_WAIT_S = 300.0


def dev_services(layout: Layout, ports: PortPlan) -> list[Service]:
    """The development and test services, in the order they come up."""
    tls = DevTls(layout.state / "tls")
    pg15 = PostgresCluster(
        name="pg15",
        binaries=DebianBinaries(15),
        port=ports.pg15,
        home=layout.postgres_side / "pg15",
        # localhost (127.0.0.1 and ::1 where there is one): the name tests reach it by and
        # the one its certificate carries
        listen="localhost",
        settings=(*COMMON_SETTINGS, *LOGICAL_WAL_SETTINGS),
        tls=tls,
        address_variable="DATABASE_URL",
    )
    pg18 = PostgresCluster(
        name="pg18",
        binaries=WheelBinaries(layout.postgres_side / "pg18-binaries"),
        port=ports.pg18,
        home=layout.postgres_side / "pg18",
        settings=COMMON_SETTINGS,
        address_variable="DATABASE_URL_PG18",
    )
    kafka = KafkaBroker(
        ports=ports,
        # not .services/kafka, where a broker of an older layout may still be logging
        home=layout.state / "broker",
        lib=layout.state / "kafka-lib",
        profile=DEV_PROFILE,
        tls=tls,
    )
    pgbouncer = PgBouncer(
        port=ports.pgbouncer, upstream_port=ports.pg15, home=layout.postgres_side / "pgbouncer"
    )
    return [tls, pg15, pg18, kafka, pgbouncer]


def masked(address: str) -> str:
    """An address fit to print: a URL's password replaced by ``***``."""
    parts = urlsplit(address)
    if not parts.password:
        return address
    user, _, host = parts.netloc.rpartition("@")
    name = user.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))


class Orchestrator:
    """A set of services in one layout: ``up``, ``down``, ``status``, ``purge``."""

    def __init__(self, layout: Layout, services: Sequence[Service]) -> None:
        self.layout = layout
        self.services = {service.name: service for service in services}

    # -- files --------------------------------------------------------------------------------
    @property
    def env_file(self) -> Path:
        return self.layout.state / "env"

    @property
    def started_file(self) -> Path:
        """What the last ``up`` started (``make test`` stops exactly those)."""
        return self.layout.state / "started-by-last-up"

    def _settings_file(self, service: Service) -> Path:
        return self.layout.state / f"{service.name}.settings"

    def _recorded(self, service: Service) -> str | None:
        try:
            return self._settings_file(service).read_text().strip()
        except OSError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One ``up``/``down`` at a time per layout."""
        self.layout.state.mkdir(parents=True, exist_ok=True)
        with (self.layout.state / ".lock").open("w") as lock:
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ServiceError(
                            f"another up or down holds {self.layout.state / '.lock'}"
                        ) from None
                    time.sleep(0.5)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    # -- names --------------------------------------------------------------------------------
    def resolve(self, names: Sequence[str], *, with_needs: bool) -> list[str]:
        """The named services (all when none are named), in declaration order; with what they
        need when ``with_needs``."""
        unknown = [name for name in names if name not in self.services]
        if unknown:
            raise KeyError(f"unknown service {unknown[0]!r} (known: {' '.join(self.services)})")
        chosen = set(names or self.services)
        while with_needs:
            needed = {need for name in chosen for need in self.services[name].needs}
            if needed <= chosen:
                break
            chosen |= needed
        return [name for name in self.services if name in chosen]

    # -- up -----------------------------------------------------------------------------------
    def start(self, service: Service) -> None:
        """Start one service on free ports, record its settings, wait until it answers."""
        self._launch(service)
        wait_until_ready(service)
        log.info("%s: ready", service.name)

    def _launch(self, service: Service) -> None:
        for port in service.ports():
            holder = port_taken_by(port)
            if holder:
                raise ServiceError(
                    f"{service.name}: port {port} is taken by {holder}, not by a service of "
                    f"this checkout ({PORT_BASE_VARIABLE} moves the whole block)"
                )
        wanted = fingerprint(service.settings())
        service.start()
        self._settings_file(service).write_text(wanted + "\n")

    def up(self, names: Sequence[str] = (), environ: Mapping[str, str] | None = None) -> list[str]:
        """Start what is missing or runs with other settings; write ``.services/env``.
        Returns the services this call started."""
        environ = os.environ if environ is None else environ
        began = time.monotonic()
        with self._locked():
            chosen = self.resolve(names, with_needs=True)
            started: list[str] = []
            self.started_file.write_text("")
            elsewhere: set[str] = set()
            values: dict[str, str] = {}
            for name in chosen:
                service = self.services[name]
                variable = service.address_variable
                given = environ.get(variable, "") if variable else ""
                if variable and given and given != service.address():
                    why = service.probe(given)
                    if why:
                        raise ServiceError(f"{variable} is set but does not answer: {why}")
                    log.info("%s: using %s from the environment, starting none", name, variable)
                    values[variable] = given
                    elsewhere.add(name)
                    continue
                if any(need in elsewhere for need in service.needs):
                    log.info(
                        "%s: skipped, it fronts only this checkout's %s", name, service.needs[0]
                    )
                    continue
                self._bring_up(service, started)
                values |= service.env()
            owned = {key for name in chosen for key in self.services[name].env_keys()}
            owned |= {self.services[name].address_variable or "" for name in chosen} - {""}
            earlier = {} if not names else envfile.parse(self._read(self.env_file))
            self._write(self.env_file, envfile.render(envfile.merge(earlier, owned, values)))
            log.info(
                "services up (%s) in %.0fs; env: %s",
                " ".join(chosen),
                time.monotonic() - began,
                self.env_file,
            )
            return started

    def _bring_up(self, service: Service, started: list[str]) -> None:
        """Up one service. One it (re)starts joins ``started`` (and the started file) once
        launched, before it answers: one that fails to come up is stopped all the same by
        whoever stops what this ``up`` started."""
        service.install()
        wanted = fingerprint(service.settings())
        if service.running():
            if self._recorded(service) == wanted:
                wait_until_ready(service)
                log.info("%s: running with the declared settings, reusing it", service.name)
                return
            log.info("%s: runs with other settings than declared; restarting it", service.name)
            service.stop()
        try:
            self._launch(service)
        finally:
            if service.pid() is not None:
                started.append(service.name)
                self.started_file.write_text("".join(f"{name}\n" for name in started))
        wait_until_ready(service)
        log.info("%s: ready", service.name)

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text()
        except OSError:
            return ""

    @staticmethod
    def _write(path: Path, text: str) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)

    # -- down, status, purge --------------------------------------------------------------------
    def down(self, names: Sequence[str] = ()) -> list[str]:
        """Stop the named services of this checkout (all when none are named)."""
        with self._locked():
            stopped = []
            for name in reversed(self.resolve(names, with_needs=False)):
                service = self.services[name]
                if service.running():
                    if service.pid() is None:
                        continue  # files, not a process: they stay as they are
                    service.stop()
                    stopped.append(name)
                elif names:
                    # said, so that a service asked for and skipped shows in the output
                    log.info("%s: not running as this checkout's, nothing to stop", name)
                self._settings_file(service).unlink(missing_ok=True)
            if not names:
                self.started_file.unlink(missing_ok=True)
            return stopped

    def wait_ready(self, name: str) -> None:
        wait_until_ready(self.services[name])

    def status(self) -> list[str]:
        """One line per service: up or down, where, and whose."""
        env = envfile.parse(self._read(self.env_file))
        lines = []
        for name, service in self.services.items():
            if service.pid() is None and not service.address():
                state = "ready" if service.ready() is None else "missing"
                lines.append(f"{name:<10} {state:<5} {service.describe()}")
                continue
            variable = service.address_variable
            address = env.get(variable, "") if variable else ""
            if address and address != service.address():
                why = service.probe(address)
                state = "up" if why is None else "down"
                lines.append(f"{name:<10} {state:<5} {masked(address)} (external)")
                continue
            why = service.ready()
            pid = service.pid()
            state = "up" if why is None else "down"
            whose = f"pid {pid}, this checkout's" if pid else "not running"
            detail = f"{service.describe()}, {whose}"
            lines.append(f"{name:<10} {state:<5} {masked(service.address())} ({detail})")
        return lines

    def purge(self) -> None:
        """Stop everything and remove all the state of this layout, both directories."""
        self.down()
        remove_tree(self.layout.postgres_side)
        remove_tree(self.layout.state)
