"""``up``, ``down`` and the env file over stand-in services that record what is asked of them
(the real services are started in tests/orchestrator)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scripts.services import envfile
from scripts.services.declaration import Service
from scripts.services.host import ServiceError
from scripts.services.orchestrator import Orchestrator, masked
from scripts.services.plan import Layout


class StandIn(Service):
    def __init__(self, name: str, calls: list[str], *, needs: tuple[str, ...] = ()) -> None:
        self.name = name
        self.needs = needs
        self.calls = calls
        self.address_variable = f"{name.upper()}_URL"
        self.declared = ["port = 1"]
        self.process = False
        self.answers = True

    def install(self) -> None:
        self.calls.append(f"install {self.name}")

    def settings(self) -> list[str]:
        return self.declared

    def running(self) -> bool:
        return self.process

    def pid(self) -> int | None:
        return 4242 if self.process else None

    def start(self) -> None:
        self.calls.append(f"start {self.name}")
        self.process = True

    def ready(self) -> str | None:
        return None if self.answers else "connection refused"

    def probe(self, address: str) -> str | None:
        return None if address.startswith("ok:") else "connection refused"

    def stop(self) -> None:
        self.calls.append(f"stop {self.name}")
        self.process = False

    def address(self) -> str:
        return f"ours:{self.name}"

    def env(self) -> dict[str, str]:
        assert self.address_variable
        return {self.address_variable: self.address(), f"{self.name.upper()}_CA": "/ca.pem"}


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def services(calls: list[str]) -> dict[str, StandIn]:
    return {
        "db": StandIn("db", calls),
        "broker": StandIn("broker", calls),
        "pooler": StandIn("pooler", calls, needs=("db",)),
    }


@pytest.fixture
def orchestrator(tmp_path: Path, services: dict[str, StandIn]) -> Orchestrator:
    layout = Layout(state=tmp_path / "state", postgres_side=tmp_path / "pg")
    return Orchestrator(layout, list(services.values()))


def _env(orchestrator: Orchestrator) -> dict[str, str]:
    return envfile.parse(orchestrator.env_file.read_text())


def test_up_starts_what_a_service_needs_first_and_writes_the_env(
    orchestrator: Orchestrator, calls: list[str]
) -> None:
    assert orchestrator.up(["pooler"], environ={}) == ["db", "pooler"]
    assert [c for c in calls if c.startswith("start")] == ["start db", "start pooler"]
    assert _env(orchestrator) == {
        "DB_URL": "ours:db",
        "DB_CA": "/ca.pem",
        "POOLER_URL": "ours:pooler",
        "POOLER_CA": "/ca.pem",
    }
    assert orchestrator.started_file.read_text() == "db\npooler\n"


def test_a_service_running_as_declared_is_reused_and_one_declared_otherwise_restarted(
    orchestrator: Orchestrator, services: dict[str, StandIn], calls: list[str]
) -> None:
    orchestrator.up(environ={})
    calls.clear()
    assert orchestrator.up(environ={}) == []
    assert not [c for c in calls if not c.startswith("install")]
    services["broker"].declared = ["port = 2"]
    assert orchestrator.up(environ={}) == ["broker"]
    assert [c for c in calls if not c.startswith("install")] == ["stop broker", "start broker"]
    assert orchestrator.started_file.read_text() == "broker\n"


def test_a_reachable_server_named_in_the_environment_is_used_and_nothing_started_for_it(
    orchestrator: Orchestrator, calls: list[str]
) -> None:
    started = orchestrator.up(environ={"DB_URL": "ok:elsewhere"})
    assert started == ["broker"]  # the pooler fronts only our db: skipped
    assert "start db" not in calls and "start pooler" not in calls
    env = _env(orchestrator)
    assert env["DB_URL"] == "ok:elsewhere"
    assert "DB_CA" not in env and "POOLER_URL" not in env


def test_an_unreachable_server_named_in_the_environment_fails_up(
    orchestrator: Orchestrator,
) -> None:
    with pytest.raises(
        ServiceError, match=r"^DB_URL is set but does not answer: connection refused$"
    ):
        orchestrator.up(["db"], environ={"DB_URL": "bad:elsewhere"})


def test_up_of_one_service_rewrites_only_its_lines(orchestrator: Orchestrator) -> None:
    orchestrator.up(environ={})
    orchestrator.up(["db"], environ={"DB_URL": "ok:elsewhere"})
    env = _env(orchestrator)
    assert env["DB_URL"] == "ok:elsewhere" and "DB_CA" not in env
    assert env["BROKER_URL"] == "ours:broker" and env["POOLER_URL"] == "ours:pooler"


def test_a_failed_start_leaves_the_started_list_for_make_test_to_stop(
    orchestrator: Orchestrator, services: dict[str, StandIn]
) -> None:
    services["broker"].answers = False
    services["broker"].wait_s = 0.3
    with pytest.raises(ServiceError, match=r"^broker: did not answer within 0s"):
        orchestrator.up(environ={})
    # the broker runs, though it never answered: make test's clean-up must stop it too
    assert orchestrator.started_file.read_text() == "db\nbroker\n"


def test_down_stops_in_reverse_order_only_what_runs(
    orchestrator: Orchestrator, calls: list[str]
) -> None:
    orchestrator.up(["db", "broker"], environ={})
    calls.clear()
    assert orchestrator.down() == ["broker", "db"]
    assert calls == ["stop broker", "stop db"]
    with pytest.raises(KeyError, match="unknown service 'nope'"):
        orchestrator.down(["nope"])


def test_down_says_which_named_service_it_found_not_running(
    orchestrator: Orchestrator, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """make test's clean-up names what its up started; one skipped (once, a broker a test
    had restarted was left running without a line) is said, not passed over in silence."""
    orchestrator.up(["db"], environ={})
    calls.clear()
    caplog.set_level(logging.INFO, logger="services")
    assert orchestrator.down(["db", "broker"]) == ["db"]
    assert calls == ["stop db"]
    assert "broker: not running as this checkout's, nothing to stop" in caplog.messages


def test_status_never_prints_a_password() -> None:
    assert masked("postgresql://outbox:s3cret@127.0.0.1:24032/postgres") == (
        "postgresql://outbox:***@127.0.0.1:24032/postgres"
    )
    assert masked("127.0.0.1:24092") == "127.0.0.1:24092"
