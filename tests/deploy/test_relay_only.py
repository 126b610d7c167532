"""`run --relay-only` resolves to a relay that evaluates nothing: no policy is read (one
given is refused, not ignored), and it cannot be combined with `--no-relay`."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ConfigError
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.settings import ServiceSettings

REPO = Path(__file__).resolve().parents[2]
ENV = {"DATABASE_URL": "postgresql://u@localhost/db", "KAFKA_BOOTSTRAP_SERVERS": "k:9092"}


def _resolve(*argv: str, **env: str) -> ServiceSettings:
    settings = resolve(build_parser().parse_args(["run", *argv]), {**ENV, **env})
    assert isinstance(settings, ServiceSettings)
    return settings


def test_a_relay_only_process_evaluates_no_family_and_needs_no_policy() -> None:
    settings = _resolve("--relay-only")
    assert settings.relay_only
    assert settings.relay is not None
    assert settings.policy.enabled_families() == ()
    assert not _resolve("--policy", str(REPO / "docs" / "policy.example.toml")).relay_only


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (("--relay-only", "--no-relay"), {}, "exclude each other"),
        (("--relay-only", "--policy", "p.toml"), {}, "evaluates no health family"),
        (("--relay-only",), {"OUTBOX_RELAY_POLICY": "p.toml"}, "evaluates no health family"),
    ],
)
def test_what_a_relay_only_process_would_not_use_is_refused(
    argv: tuple[str, ...], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        _resolve(*argv, **env)
