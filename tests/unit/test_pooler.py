"""Behind a transaction pooler: the connection options, the LISTEN decision, and the flags
that choose them (``--database-pooler``, ``--listen-database-url``)."""

from __future__ import annotations

import argparse

import pytest

from contracts.errors import ConfigError
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.settings import (
    HealthReportSettings,
    MigrateSettings,
    RedriveSettings,
    ServiceSettings,
)
from pgconnect import connection_options, pool_options
from relay.wakeups import ListenPlan, listen_plan

POLICY = "docs/policy.example.toml"
DIRECT = "postgresql://u@db:5432/app"
POOLED = "postgresql://u@pgbouncer:6432/app"
SETTINGS = {"application_name": "outbox-relay", "jit": "off"}


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


# -- connection options ----------------------------------------------------------------------
def test_direct_connections_carry_every_setting_and_the_statement_cache() -> None:
    assert connection_options(SETTINGS, transaction_pooler=False) == {"server_settings": SETTINGS}
    assert "reset" not in pool_options(SETTINGS, transaction_pooler=False)


def test_pooled_connections_send_only_what_the_pooler_passes_on_and_name_no_statements() -> None:
    options = connection_options(SETTINGS, transaction_pooler=True)
    assert options == {
        "server_settings": {"application_name": "outbox-relay"},
        "statement_cache_size": 0,
    }


def test_a_pooled_pool_does_not_reset_a_session_it_does_not_have() -> None:
    options = pool_options(SETTINGS, transaction_pooler=True)
    assert callable(options["reset"])
    assert options["statement_cache_size"] == 0


# -- the LISTEN decision ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("notify", "listen_url", "pooler", "expected"),
    [
        (True, None, False, ListenPlan(True, POOLED)),
        (True, DIRECT, False, ListenPlan(True, DIRECT)),
        (True, DIRECT, True, ListenPlan(True, DIRECT)),
        (False, DIRECT, True, ListenPlan(False, off_because="--no-notify")),
        (False, None, False, ListenPlan(False, off_because="--no-notify")),
    ],
)
def test_listen_plan(
    notify: bool, listen_url: str | None, pooler: bool, expected: ListenPlan
) -> None:
    plan = listen_plan(
        notify=notify,
        database_url=POOLED,
        listen_database_url=listen_url,
        transaction_pooler=pooler,
    )
    assert plan == expected


def test_behind_a_pooler_without_a_listen_url_wake_ups_are_off_and_the_fix_is_named() -> None:
    plan = listen_plan(
        notify=True, database_url=POOLED, listen_database_url=None, transaction_pooler=True
    )
    assert not plan.listen
    assert plan.off_because is not None and "--listen-database-url" in plan.off_because


# -- the flags -------------------------------------------------------------------------------
def test_run_takes_the_pooler_and_the_listen_url_for_relay_and_sidecar() -> None:
    args = parse("run", "--policy", POLICY, "--database-url", POOLED, "--kafka-bootstrap", "k:9092")
    environ = {"OUTBOX_RELAY_DATABASE_POOLER": "transaction"}
    environ["OUTBOX_RELAY_LISTEN_DATABASE_URL"] = DIRECT
    settings = resolve(args, environ)
    assert isinstance(settings, ServiceSettings) and settings.relay is not None
    assert settings.transaction_pooler and settings.relay.transaction_pooler
    assert settings.relay.listen_database_url == DIRECT
    assert settings.relay.database_url == settings.database_url == POOLED


def test_without_the_flag_nothing_changes() -> None:
    args = parse("run", "--policy", POLICY, "--database-url", DIRECT, "--kafka-bootstrap", "k:9092")
    settings = resolve(args, {})
    assert isinstance(settings, ServiceSettings) and settings.relay is not None
    assert not settings.transaction_pooler and not settings.relay.transaction_pooler
    assert settings.relay.listen_database_url is None


@pytest.mark.parametrize("verb", ["check", "status"])
def test_check_and_status_take_the_pooler(verb: str) -> None:
    settings = resolve(parse(verb, "--policy", POLICY, "--database-pooler", "transaction"), {})
    assert isinstance(settings, HealthReportSettings) and settings.transaction_pooler


def test_redrive_takes_the_pooler() -> None:
    settings = resolve(parse("redrive", "--all", "--database-pooler", "transaction"), {})
    assert isinstance(settings, RedriveSettings) and settings.transaction_pooler


def test_migrate_behind_a_pooler_runs_on_the_listen_url() -> None:
    args = parse("migrate", "--database-url", POOLED, "--database-pooler", "transaction")
    settings = resolve(args, {"OUTBOX_RELAY_LISTEN_DATABASE_URL": DIRECT})
    assert isinstance(settings, MigrateSettings) and settings.database_url == DIRECT


def test_migrate_behind_a_pooler_without_a_direct_url_is_refused() -> None:
    args = parse("migrate", "--database-url", POOLED, "--database-pooler", "transaction")
    with pytest.raises(ConfigError, match="--listen-database-url"):
        resolve(args, {})


def test_migrate_without_a_pooler_keeps_the_database_url() -> None:
    settings = resolve(parse("migrate", "--database-url", DIRECT), {})
    assert isinstance(settings, MigrateSettings) and settings.database_url == DIRECT


def test_an_unknown_pooler_in_the_environment_is_refused() -> None:
    with pytest.raises(ConfigError, match="OUTBOX_RELAY_DATABASE_POOLER"):
        resolve(parse("check", "--policy", POLICY), {"OUTBOX_RELAY_DATABASE_POOLER": "session"})


def test_a_malformed_listen_url_is_named_as_such() -> None:
    args = parse("run", "--policy", POLICY, "--kafka-bootstrap", "k:9092")
    with pytest.raises(ConfigError, match="--listen-database-url"):
        resolve(args, {"OUTBOX_RELAY_LISTEN_DATABASE_URL": "mysql://x"})


def test_the_demo_refuses_a_pooler() -> None:
    with pytest.raises(ConfigError, match="demo connects to PostgreSQL directly"):
        resolve(
            parse("demo", "--policy", POLICY, "--kafka-bootstrap", "k:9092"),
            {"OUTBOX_RELAY_DATABASE_POOLER": "transaction"},
        )
