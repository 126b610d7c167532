"""The orchestrator's port plan and layout: one block of ports, one directory per checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.services.kafka import DEV_PROFILE, proxy_routes
from scripts.services.plan import (
    BLOCK,
    DEV_PORT_BASE,
    PlanError,
    PortPlan,
    checkout_key,
    port_base,
    postgres_home,
)
from scripts.services.plan import Layout as ServiceLayout
from tests.support.kafka_paths import ProxyRoute, parse_routes

# What a machine may already run: PostgreSQL, PgBouncer and Kafka on their usual ports (a
# shared set of services, another project's), the soak's blocks, the kernel's ephemeral range.
USUAL = {5432, 5433, 6432, *range(9092, 9099), *range(19094, 19097)}
SOAK_BLOCKS = range(25000, 26000)
EPHEMERAL = range(32768, 61000)


def test_every_port_is_distinct_and_inside_its_block() -> None:
    plan = PortPlan(31000)
    ports = list(plan.named().values())
    assert len(ports) == len(set(ports))
    assert all(31000 <= port < 31000 + BLOCK for port in ports)


def test_the_development_block_avoids_the_usual_ports_the_soak_and_ephemeral_ones() -> None:
    ports = set(PortPlan(DEV_PORT_BASE).named().values())
    assert not ports & USUAL
    assert not any(port in SOAK_BLOCKS or port in EPHEMERAL for port in ports)


def test_the_base_comes_from_the_environment_or_is_refused_in_one_line() -> None:
    assert port_base({}) == DEV_PORT_BASE
    assert port_base({"SERVICES_PORT_BASE": " 30000 "}) == 30000
    for bad in ("abc", "80", "65500", "-1"):
        with pytest.raises(PlanError, match="SERVICES_PORT_BASE must be a port"):
            port_base({"SERVICES_PORT_BASE": bad})


def test_proxy_routes_are_what_the_fault_tests_parse() -> None:
    plan = PortPlan(DEV_PORT_BASE)
    assert parse_routes(proxy_routes(plan, DEV_PROFILE)) == [
        ProxyRoute(f"127.0.0.1:{24194 + n}", f"127.0.0.1:{24094 + n}") for n in range(3)
    ]
    with pytest.raises(ValueError, match="no proxy listener 3"):
        plan.kafka_proxy(3)


def test_each_checkout_has_a_postgres_side_directory_of_its_own(tmp_path: Path) -> None:
    spaced = tmp_path / "with space" / "clone"
    other = tmp_path / "other" / "clone"
    first = ServiceLayout.for_checkout(spaced)
    assert first == ServiceLayout.for_checkout(spaced)
    assert first.postgres_side != ServiceLayout.for_checkout(other).postgres_side
    assert first.state == spaced.resolve() / ".services"
    # under the postgres user's home, which it can always enter, and free of the path's space
    assert first.postgres_side.parent == postgres_home()
    assert " " not in first.postgres_side.name
    assert first.postgres_side.name == f"outbox-relay-{checkout_key(spaced)}"
