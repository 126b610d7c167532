"""The health sidecar's own limits as flags and variables: --http-max-connections,
--database-retry-max-ms, --completion-recheck-period-ms."""

from __future__ import annotations

import pytest

from contracts.errors import ConfigError
from health.config import SidecarConfig
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.service import run_service
from outbox_relay.settings import ServiceSettings

POLICY = "docs/policy.example.toml"


def sidecar(argv: list[str], environ: dict[str, str]) -> tuple[int, int, int]:
    """The three limits of the sidecar's configuration, as ``run`` resolves them."""
    args = build_parser().parse_args(["run", "--no-relay", "--policy", POLICY, *argv])
    settings = resolve(args, environ)
    assert isinstance(settings, ServiceSettings)
    config = settings.sidecar
    return (
        config.http_max_connections,
        config.database_retry_max_ms,
        config.completion_recheck_period_ms,
    )


def test_defaults_are_the_sidecars_own() -> None:
    assert sidecar([], {}) == (
        SidecarConfig.http_max_connections,
        SidecarConfig.database_retry_max_ms,
        SidecarConfig.completion_recheck_period_ms,
    )
    assert sidecar([], {}) == (256, 30_000, 21_600_000)


def test_flags_set_them() -> None:
    argv = [
        "--http-max-connections",
        "64",
        "--database-retry-max-ms",
        "5000",
        "--completion-recheck-period-ms",
        "0",
    ]
    assert sidecar(argv, {}) == (64, 5000, 0)


def test_variables_set_them_and_flags_win() -> None:
    environ = {
        "OUTBOX_RELAY_HTTP_MAX_CONNECTIONS": "32",
        "OUTBOX_RELAY_DATABASE_RETRY_MAX_MS": "1000",
        "OUTBOX_RELAY_COMPLETION_RECHECK_PERIOD_MS": "600000",
    }
    assert sidecar([], environ) == (32, 1000, 600_000)
    assert sidecar(["--http-max-connections", "8"], environ)[0] == 8


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--http-max-connections", "0"], "--http-max-connections"),
        (["--database-retry-max-ms", "-1"], "--database-retry-max-ms"),
        (["--completion-recheck-period-ms", "-5"], "--completion-recheck-period-ms"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_flag(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        sidecar(argv, {})


class _Captured(Exception):
    pass


async def test_run_hands_them_to_the_sidecar(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def capture(config: SidecarConfig, **kwargs: object) -> None:
        seen.update(vars(config))
        raise _Captured

    monkeypatch.setattr("outbox_relay.service.HealthSidecar", capture)
    argv = ["--http-max-connections", "9", "--database-retry-max-ms", "700"]
    argv += ["--completion-recheck-period-ms", "1200", "--database-pooler", "transaction"]
    args = build_parser().parse_args(["run", "--no-relay", "--policy", POLICY, *argv])
    settings = resolve(args, {})
    assert isinstance(settings, ServiceSettings)
    with pytest.raises(_Captured):
        await run_service(settings)
    assert seen["http_max_connections"] == 9
    assert seen["database_retry_max_ms"] == 700
    assert seen["completion_recheck_period_ms"] == 1200
    assert seen["transaction_pooler"] is True
