"""Where the services live: the loopback ports they bind and the directories they keep.

Every port is an offset from one base, declared here once, so a whole set of services
moves by changing the base: the development services use :data:`DEV_PORT_BASE` (or
``SERVICES_PORT_BASE``), the soak and the orchestrator's own tests take blocks of their own.
"""

from __future__ import annotations

import hashlib
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

# Clear of PostgreSQL's, Kafka's and PgBouncer's usual ports (a machine may run those for
# other projects), of the soak's blocks (25000-25999) and of the kernel's ephemeral range.
DEV_PORT_BASE = 24000
PORT_BASE_VARIABLE = "SERVICES_PORT_BASE"
BLOCK = 500
PROXY_ADVERTISED_OFFSET = 100
PROXIES = 3


@dataclass(frozen=True)
class PortPlan:
    """Every loopback port of one set of services, all in ``[base, base + BLOCK)``."""

    base: int

    @property
    def pg15(self) -> int:
        return self.base + 32

    @property
    def pg18(self) -> int:
        return self.base + 33

    @property
    def pgbouncer(self) -> int:
        return self.base + 64

    @property
    def kafka(self) -> int:
        return self.base + 92

    @property
    def kafka_controller(self) -> int:
        return self.base + 93

    @property
    def kafka_sasl_ssl(self) -> int:
        return self.base + 97

    @property
    def kafka_ssl(self) -> int:
        return self.base + 98

    def kafka_proxy(self, n: int) -> tuple[int, int]:
        """(advertised, bound) of fault-proxy listener ``n``: a client bootstrapped at the
        advertised port, where a test's proxy listens, sends all its traffic through it."""
        if not 0 <= n < PROXIES:
            raise ValueError(f"no proxy listener {n} (0..{PROXIES - 1})")
        bound = self.base + 94 + n
        return bound + PROXY_ADVERTISED_OFFSET, bound

    def named(self) -> dict[str, int]:
        """Every port by name (for checks and the status line)."""
        ports = {
            "pg15": self.pg15,
            "pg18": self.pg18,
            "pgbouncer": self.pgbouncer,
            "kafka": self.kafka,
            "kafka controller": self.kafka_controller,
            "kafka SASL_SSL": self.kafka_sasl_ssl,
            "kafka SSL": self.kafka_ssl,
        }
        for n in range(PROXIES):
            advertised, bound = self.kafka_proxy(n)
            ports[f"kafka proxy{n}"] = bound
            ports[f"kafka proxy{n} advertised"] = advertised
        return ports


class PlanError(ValueError):
    """A port base that cannot hold a block of ports."""


def port_base(environ: dict[str, str] | os._Environ[str]) -> int:
    """The development port base: ``SERVICES_PORT_BASE`` when set, else the default."""
    text = environ.get(PORT_BASE_VARIABLE, "").strip()
    if not text:
        return DEV_PORT_BASE
    if not text.isdigit() or not 1024 <= int(text) <= 65535 - BLOCK:
        raise PlanError(f"{PORT_BASE_VARIABLE} must be a port from 1024 to {65535 - BLOCK}")
    return int(text)


def checkout_key(checkout: Path) -> str:
    """A short name for one checkout, the same on every run and different for every path."""
    return hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:12]


def postgres_home() -> Path:
    """The postgres OS user's home (Debian's default when the user does not exist yet)."""
    try:
        return Path(pwd.getpwnam("postgres").pw_dir)
    except KeyError:
        return Path("/var/lib/postgresql")


@dataclass(frozen=True)
class Layout:
    """The two directories one set of services keeps its state in.

    ``state`` belongs to whoever runs the orchestrator (the env file, the TLS files,
    Kafka's jars and data, what is running with which settings). ``postgres_side`` holds
    what the ``postgres`` OS user must read and write: the clusters' data, their logs and
    sockets, PgBouncer's files, PostgreSQL 18's binaries when they had to be copied.
    """

    state: Path
    postgres_side: Path

    @classmethod
    def for_checkout(cls, checkout: Path) -> Layout:
        """``.services/`` in the checkout, and a directory under the postgres user's home.

        PostgreSQL and PgBouncer run as ``postgres``, which cannot enter a checkout under a
        mode-700 directory such as ``/root``; its own home it always can. The directory is
        named after the checkout's path, so two clones never share a cluster.
        """
        checkout = checkout.resolve()
        return cls(
            state=checkout / ".services",
            postgres_side=postgres_home() / f"outbox-relay-{checkout_key(checkout)}",
        )
