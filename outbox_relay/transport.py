"""Which of the service's network paths are not verified by certificate: PostgreSQL over
TCP without ``sslmode`` verify-ca or verify-full (libpq's default, ``prefer``, included),
Kafka without TLS. A Unix socket and a loopback address never leave the host, so they
count as verified. ``run`` warns about the rest once, exports them as a gauge, and refuses
to start with ``--require-verified-transport``.

Pure: judged from the settings as the drivers will read them, before anything connects.
Host names are never resolved here: a name other than ``localhost`` counts as remote.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from pgconnect import VERIFYING_SSLMODES, transport
from relay.config import KafkaSecurity

POSTGRES: Final = "postgres"
KAFKA: Final = "kafka"
PATHS: Final = (POSTGRES, KAFKA)


@dataclass(frozen=True)
class UnverifiedPath:
    """A network path the service would use without verifying the other end's certificate."""

    path: str  # POSTGRES or KAFKA
    reason: str  # what makes it so, as settings name it; never a host, URL or secret


def is_loopback(host: str) -> bool:
    """``localhost`` (and names under it), 127.0.0.0/8, ::1 and IPv4-mapped loopback."""
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def unverified_postgres(
    urls: Mapping[str, str | None], environ: Mapping[str, str]
) -> UnverifiedPath | None:
    """The PostgreSQL path when one of ``urls`` (by the setting that names it; None: the
    PG* variables) reaches a host off this machine over TCP without verification."""
    reasons = []
    for setting, url in urls.items():
        plan = transport(url, environ)
        remote = [host for host in plan.tcp_hosts if not is_loopback(host)]
        if remote and plan.sslmode not in VERIFYING_SSLMODES:
            reasons.append(f"sslmode {plan.sslmode} over TCP ({setting})")
    return UnverifiedPath(POSTGRES, "; ".join(reasons)) if reasons else None


def unverified_kafka(bootstrap: str, security: KafkaSecurity) -> UnverifiedPath | None:
    """The Kafka path when a bootstrap server off this machine is reached without TLS."""
    if security.tls:
        return None
    hosts = [server.strip().rpartition(":")[0] for server in bootstrap.split(",")]
    if all(is_loopback(host) for host in hosts):
        return None
    return UnverifiedPath(KAFKA, f"{security.protocol}, no TLS")


def refusal(unverified: tuple[UnverifiedPath, ...]) -> str:
    """The one line ``--require-verified-transport`` refuses the start with."""
    said = []
    for found in unverified:
        if found.path == POSTGRES:
            said.append(f"PostgreSQL is reached with {found.reason}: use sslmode verify-full")
        else:
            said.append(f"Kafka is reached with {found.reason}: use SSL or SASL_SSL")
    return f"--require-verified-transport: {'; '.join(said)}"
