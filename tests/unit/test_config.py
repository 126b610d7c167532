"""Configuration: validation, resolution of flags over environment over defaults, listen
addresses and database URLs. Errors name the input, never a secret."""

from __future__ import annotations

import re
import uuid
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints

import msgspec
import pytest

from contracts.errors import ConfigError
from contracts.ranges import MAX_SETTING, ranges
from health.config import SidecarConfig
from health.policy import parse_policy
from outbox_relay.cli import build_parser
from outbox_relay.flags import Integer, Option, Switch, Text
from outbox_relay.options import (
    OPTIONS,
    VERBS,
    listen_address,
    parse_listen,
    resolve,
    resolve_logging,
)
from outbox_relay.settings import (
    DemoOptions,
    HealthReportSettings,
    LogSettings,
    RedriveSettings,
    ServiceSettings,
)
from pgconnect import describe_target, validate_database_url
from relay.config import KafkaSecurity, RelayConfig, validate_topic_template

SECRET = "s3cr3t-Passw0rd"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - the documented default with PORT
POLICY = str(Path(__file__).resolve().parents[2] / "docs" / "policy.example.toml")
EVENT = uuid.UUID("0192b7f0-0000-7000-8000-000000000001")


def service(argv: list[str], environ: dict[str, str]) -> ServiceSettings:
    """``run ARGV`` resolved against exactly ``environ`` (never the test runner's)."""
    settings = resolve(build_parser().parse_args(["run", "--policy", POLICY, *argv]), environ)
    assert isinstance(settings, ServiceSettings)
    return settings


def relay(argv: list[str], environ: dict[str, str]) -> RelayConfig:
    settings = service(argv, environ)
    assert settings.relay is not None
    return settings.relay


def config(**overrides: Any) -> RelayConfig:
    values: dict[str, Any] = {"database_url": None, "kafka_bootstrap": "127.0.0.1:9092"}
    values.update(overrides)
    return RelayConfig(**values)


def test_defaults_are_valid() -> None:
    c = config()
    assert c.topic_template == "outbox.event.{aggregatetype}"
    assert c.kafka_security.protocol == "PLAINTEXT"
    assert c.instance_id.startswith("relay-")
    assert c.instance_id != config().instance_id


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"topic_template": "events.{type}"}, "--topic-template"),
        ({"topic_template": "events.{aggregateid}"}, "--topic-template"),
        ({"topic_template": "events.{}"}, "--topic-template"),
        ({"topic_template": "  "}, "--topic-template"),
        ({"kafka_bootstrap": ""}, "--kafka-bootstrap"),
        ({"batch_size": 0}, "--batch-size"),
        ({"batch_size": -5}, "--batch-size"),
        ({"max_in_flight_batches": 0}, "--max-in-flight-batches"),
        ({"poll_interval_ms": 0}, "--poll-interval-ms"),
        ({"max_attempts": 0}, "--max-attempts"),
        ({"retry_base_ms": 0}, "--retry-base-ms"),
        ({"retry_base_ms": 1_000, "retry_cap_ms": 999}, "--retry-cap-ms"),
        ({"send_timeout_ms": -1}, "--send-timeout-ms"),
        ({"receipt_retention_ms": 0}, "--receipt-retention-ms"),
        ({"prune_batch_size": 0}, "--prune-batch-size"),
        ({"drain_timeout_ms": 0}, "--drain-timeout-ms"),
        ({"lease_renew_ms": 0}, "--lease-renew-ms"),
        ({"lease_ttl_ms": 0}, "--lease-ttl-ms"),
        # 2 x renew + send timeout must stay below the lease TTL.
        ({"lease_ttl_ms": 9_000}, "--lease-ttl-ms"),
        ({"lease_ttl_ms": 9_001, "lease_renew_ms": 2_000, "send_timeout_ms": 5_001}, "--lease-ttl"),
        ({"lease_ttl_ms": 3_000, "lease_renew_ms": 1_500, "send_timeout_ms": 1}, "--lease-ttl-ms"),
        ({"compression": "brotli"}, "--compression"),
        ({"compression": "GZIP"}, "--compression"),
        # Bound as PostgreSQL integer: larger values failed every write at run time.
        ({"retry_cap_ms": 2**31}, "--retry-cap-ms"),
        ({"retry_base_ms": 2**31, "retry_cap_ms": 2**31}, "--retry-base-ms"),
        ({"max_attempts": 2**31}, "--max-attempts"),
        ({"batch_size": 10**15 + 1}, "--batch-size"),
        ({"linger_ms": -1}, "--linger-ms"),
        ({"blocking_transaction_warn_ms": -1}, "--blocking-transaction-warn-ms"),
        # No event could ever get a valid topic name from these.
        ({"topic_template": "events/{aggregatetype}"}, "--topic-template"),
        ({"topic_template": "a b.{aggregatetype}"}, "--topic-template"),
        ({"topic_template": "x" * 249 + "{aggregatetype}"}, "--topic-template"),
        # A file or ConfigMap value ends in a line break: every event would be quarantined.
        ({"topic_template": "outbox.event.{aggregatetype}\n"}, "--topic-template"),
        ({"topic_template": "static-topic\n"}, "--topic-template"),
        # Bytes that are not UTF-8 reach Python as lone surrogates; nothing can send them.
        ({"ce_source": "urn:\udcff"}, "--ce-source"),
        ({"instance_id": "relay-\udcff"}, "--instance-id"),
        ({"kafka_bootstrap": "h\udcff:9092"}, "--kafka-bootstrap"),
    ],
)
def test_invalid_settings_raise_config_error_naming_the_flag(
    overrides: dict[str, Any], flag: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config(**overrides)
    assert flag in str(caught.value)


def test_lease_ttl_just_above_the_margin_is_accepted() -> None:
    c = config(lease_ttl_ms=9_001, lease_renew_ms=2_000, send_timeout_ms=5_000)
    assert c.lease_ttl_ms == 9_001


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_known_compressions_are_accepted(compression: str | None) -> None:
    assert config(compression=compression).compression == compression


@pytest.mark.parametrize(
    "template", ["outbox.event.{aggregatetype}", "static-topic", "{aggregatetype}"]
)
def test_valid_topic_templates(template: str) -> None:
    validate_topic_template(template)
    assert config(topic_template=template).topic_template == template


# -- Kafka security ---------------------------------------------------------------------------
def test_unknown_security_protocol_is_refused() -> None:
    with pytest.raises(ConfigError, match="--kafka-security-protocol"):
        KafkaSecurity(protocol="TLS")


def test_sasl_user_name_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(ConfigError, match="--kafka-sasl-username is not UTF-8"):
        KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="\udcff")


def test_sasl_needs_a_known_mechanism() -> None:
    with pytest.raises(ConfigError, match="--kafka-sasl-mechanism"):
        KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_username="u")


@pytest.mark.parametrize("password", [None, ""])
def test_sasl_without_a_password_is_refused(password: str | None) -> None:
    with pytest.raises(ConfigError, match="--kafka-sasl-username and a password"):
        KafkaSecurity(
            protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="relay",
            sasl_password=password,
        )


def test_sasl_without_a_username_is_refused() -> None:
    with pytest.raises(ConfigError, match="--kafka-sasl-username"):
        KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_password=SECRET)


def test_the_sasl_password_never_shows_in_repr_or_str() -> None:
    security = KafkaSecurity(
        protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="relay",
        sasl_password=SECRET,
    )
    assert security.sasl_password == SECRET
    assert SECRET not in repr(security)
    assert SECRET not in str(security)
    assert "relay" in repr(security)
    assert SECRET not in repr(config(kafka_security=security))


def test_plaintext_has_no_tls_context_and_ssl_has_a_verifying_one() -> None:
    assert KafkaSecurity().ssl_context() is None
    context = KafkaSecurity(protocol="SSL").ssl_context()
    assert context is not None
    assert context.check_hostname is True


def test_unreadable_tls_files_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Kafka TLS files"):
        KafkaSecurity(protocol="SSL", ssl_cafile="/nonexistent/ca.pem").ssl_context()


def test_cli_reads_the_sasl_password_from_a_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "sasl"
    secret_file.write_text(SECRET + "\n")
    c = relay(
        [
            "--kafka-bootstrap",
            "b:9092",
            "--kafka-security-protocol",
            "sasl_ssl",
            "--kafka-sasl-mechanism",
            "PLAIN",
            "--kafka-sasl-username",
            "relay",
            "--kafka-sasl-password-file",
            str(secret_file),
        ],
        {"KAFKA_SASL_PASSWORD": "not-this-one"},  # the file wins
    )
    assert c.kafka_security.protocol == "SASL_SSL"
    assert c.kafka_security.sasl_password == SECRET
    assert SECRET not in repr(c)


def test_cli_reads_the_sasl_password_from_the_environment_without_a_file() -> None:
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092",
        "KAFKA_SECURITY_PROTOCOL": "sasl_plaintext",
        "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KAFKA_SASL_USERNAME": "relay",
        "KAFKA_SASL_PASSWORD": SECRET,
    }
    c = relay([], environ)
    assert c.kafka_security.protocol == "SASL_PLAINTEXT"
    assert c.kafka_security.sasl_password == SECRET


def test_an_unreadable_sasl_password_file_names_the_flag(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="--kafka-sasl-password-file"):
        relay(["--kafka-sasl-password-file", missing], {"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})


def test_cli_flag_beats_environment_and_bad_env_integers_name_the_variable() -> None:
    environ = {"OUTBOX_RELAY_BATCH_SIZE": "250", "KAFKA_BOOTSTRAP_SERVERS": "env:9092"}
    c = relay(["--batch-size", "10"], environ)
    assert c.batch_size == 10
    assert c.kafka_bootstrap == "env:9092"
    assert relay([], environ).batch_size == 250
    with pytest.raises(ConfigError, match="OUTBOX_RELAY_BATCH_SIZE"):
        relay([], {**environ, "OUTBOX_RELAY_BATCH_SIZE": "lots"})


def test_without_flags_or_environment_the_relay_gets_relay_config_defaults() -> None:
    c = relay([], {"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})
    defaults = RelayConfig(database_url=None, kafka_bootstrap="b:9092")
    assert c == replace(defaults, instance_id=c.instance_id)
    assert c.instance_id.startswith("relay-")


def test_empty_variables_count_as_unset() -> None:
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": "b:9092",
        "OUTBOX_RELAY_BATCH_SIZE": "",
        "OUTBOX_RELAY_TOPIC_TEMPLATE": "",
        "OUTBOX_RELAY_INSTANCE_ID": "",
        "KAFKA_SECURITY_PROTOCOL": "",
        "DATABASE_URL": "",
    }
    settings = service([], environ)
    assert settings.database_url is None
    assert settings.relay is not None
    assert settings.relay.batch_size == RelayConfig.batch_size
    assert settings.relay.topic_template == "outbox.event.{aggregatetype}"
    assert settings.relay.instance_id.startswith("relay-")
    assert settings.relay.kafka_security.protocol == "PLAINTEXT"


@pytest.mark.parametrize(
    ("argv", "environ", "notify"),
    [
        ([], {}, True),
        (["--no-notify"], {}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "1"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "true"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "yes"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "0"}, True),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": ""}, True),
        # The usual spellings, in any case: TRUE was read as off.
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "TRUE"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "Yes"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "on"}, False),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "OFF"}, True),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "False"}, True),
        ([], {"OUTBOX_RELAY_NO_NOTIFY": "no"}, True),
    ],
)
def test_no_notify_from_flag_or_environment(
    argv: list[str], environ: dict[str, str], notify: bool
) -> None:
    c = relay(argv, {"KAFKA_BOOTSTRAP_SERVERS": "b:9092", **environ})
    assert c.notify is notify


@pytest.mark.parametrize("value", ["ture", "2", "y es", "enabled", "1\n", "\udcff"])
def test_a_switch_variable_that_is_neither_on_nor_off_is_refused(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        relay([], {"KAFKA_BOOTSTRAP_SERVERS": "b:9092", "OUTBOX_RELAY_NO_NOTIFY": value})
    message = str(caught.value)
    assert "OUTBOX_RELAY_NO_NOTIFY" in message
    assert value not in message


def test_a_switch_variable_is_checked_where_the_verb_does_not_use_it() -> None:
    # run --no-relay takes the relay's settings without using them: still refused.
    with pytest.raises(ConfigError, match="OUTBOX_RELAY_NO_NOTIFY"):
        service(["--no-relay"], {"OUTBOX_RELAY_NO_NOTIFY": "maybe"})


def test_the_relay_and_the_sidecar_share_one_url_and_one_retention() -> None:
    url = f"postgresql://relay:{SECRET}@db.internal/app"
    settings = service(
        ["--database-url", url, "--receipt-retention-ms", "5000"],
        {"KAFKA_BOOTSTRAP_SERVERS": "b:9092", "DATABASE_URL": "postgresql:///other"},
    )
    assert settings.relay is not None
    assert settings.database_url == settings.relay.database_url == url
    assert settings.receipt_retention_ms == settings.relay.receipt_retention_ms == 5000
    assert SECRET not in repr(settings)


def test_settings_refuse_a_relay_that_disagrees_with_the_sidecar() -> None:
    settings = service([], {"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})
    assert settings.relay is not None
    sidecar = settings.sidecar
    assert sidecar.receipt_retention_ms is not None
    with pytest.raises(ConfigError, match="share"):
        replace(
            settings,
            sidecar=replace(sidecar, receipt_retention_ms=sidecar.receipt_retention_ms + 1),
        )
    with pytest.raises(ConfigError, match="share"):
        replace(settings, sidecar=replace(sidecar, database_url="postgresql:///elsewhere"))
    with pytest.raises(ConfigError, match="share"):
        replace(
            settings, sidecar=replace(sidecar, transaction_pooler=not sidecar.transaction_pooler)
        )


def test_no_relay_needs_no_kafka_and_still_reads_the_retention() -> None:
    settings = service(["--no-relay"], {"OUTBOX_RELAY_RECEIPT_RETENTION_MS": "60000"})
    assert settings.relay is None
    assert settings.receipt_retention_ms == 60_000
    assert settings.demo is None


def test_the_relay_needs_a_bootstrap_server() -> None:
    with pytest.raises(ConfigError, match=r"--kafka-bootstrap \(KAFKA_BOOTSTRAP_SERVERS\)"):
        service([], {})


@pytest.mark.parametrize("verb", ["check", "status"])
def test_health_reports_default_to_the_relays_receipt_retention(verb: str) -> None:
    settings = resolve(build_parser().parse_args([verb, "--policy", POLICY]), {})
    assert isinstance(settings, HealthReportSettings)
    assert settings.receipt_retention_ms == RelayConfig.receipt_retention_ms
    assert settings.table is (verb == "status")


def test_health_reports_need_a_policy() -> None:
    with pytest.raises(ConfigError, match="no built-in health bounds"):
        resolve(build_parser().parse_args(["check"]), {})


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, DemoOptions(jobs=2000, workers=4, exit_when_done=False)),
        ([], {"OUTBOX_RELAY_DEMO_JOBS": "50"}, DemoOptions(50, 4, False)),
        (["--jobs", "7"], {"OUTBOX_RELAY_DEMO_JOBS": "50"}, DemoOptions(7, 4, False)),
        (["--workers", "2", "--exit-when-done"], {}, DemoOptions(2000, 2, True)),
    ],
)
def test_demo_options(argv: list[str], environ: dict[str, str], expected: DemoOptions) -> None:
    argv = ["demo", "--policy", POLICY, *argv]
    settings = resolve(
        build_parser().parse_args(argv), {"KAFKA_BOOTSTRAP_SERVERS": "b:9", **environ}
    )
    assert isinstance(settings, ServiceSettings)
    assert settings.demo == expected
    assert settings.relay is not None


@pytest.mark.parametrize(
    ("argv", "ids", "everything"),
    [
        (["--all"], None, True),
        (["--id", str(EVENT), "--id", str(EVENT)], [EVENT, EVENT], False),
    ],
)
def test_redrive_selection(argv: list[str], ids: list[uuid.UUID] | None, everything: bool) -> None:
    settings = resolve(build_parser().parse_args(["redrive", *argv]), {})
    assert isinstance(settings, RedriveSettings)
    assert settings.selection.ids == ids
    assert settings.selection.everything is everything


def test_redrive_refuses_an_id_that_is_not_a_uuid() -> None:
    with pytest.raises(ConfigError, match="--id"):
        resolve(build_parser().parse_args(["redrive", "--id", "nope"]), {})


@pytest.mark.parametrize(
    ("argv", "environ", "expected"),
    [
        ([], {}, LogSettings("info", "json")),
        (
            [],
            {"OUTBOX_RELAY_LOG_LEVEL": "debug", "OUTBOX_RELAY_LOG_FORMAT": "text"},
            LogSettings("debug", "text"),
        ),
        (
            ["--log-level", "error"],
            {"OUTBOX_RELAY_LOG_LEVEL": "debug"},
            LogSettings("error", "json"),
        ),
    ],
)
def test_log_settings(argv: list[str], environ: dict[str, str], expected: LogSettings) -> None:
    args = build_parser().parse_args(["migrate", *argv])
    assert resolve_logging(args, environ) == expected


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.flag)
@pytest.mark.parametrize("verb", [name for name, _ in VERBS])
def test_each_verb_takes_exactly_its_declared_flags(option: Option, verb: str) -> None:
    value = option.choices[0] if isinstance(option, Text) and option.choices else "1"
    argv = [verb, option.flag] if isinstance(option, Switch) else [verb, option.flag, value]
    if verb in option.verbs:
        assert option.dest in vars(build_parser().parse_args(argv))
    else:
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)


# -- listen addresses -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8080", ("127.0.0.1", 8080)),
        (f"{ALL_INTERFACES}:0", (ALL_INTERFACES, 0)),
        ("[::1]:9000", ("::1", 9000)),
        ("[::]:80", ("::", 80)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_parse_listen(value: str, expected: tuple[str, int]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize(
    "value", ["nohost", ":80", "h:99999", "h:65536", "h:", "h:-1", "h:8o", "", "h: 80"]
)
def test_parse_listen_refuses_bad_addresses(value: str) -> None:
    with pytest.raises(ConfigError, match="--listen"):
        parse_listen(value)


def default_listen(environ: dict[str, str], *argv: str) -> str:
    return listen_address(build_parser().parse_args(["run", *argv]), environ)


def test_default_listen_prefers_health_listen_addr() -> None:
    assert (
        default_listen({"HEALTH_LISTEN_ADDR": "10.0.0.5:7000", "PORT": "9999"}) == "10.0.0.5:7000"
    )


def test_the_listen_flag_beats_the_environment() -> None:
    environ = {"HEALTH_LISTEN_ADDR": "10.0.0.5:7000", "PORT": "9999"}
    assert default_listen(environ, "--listen", "127.0.0.2:81") == "127.0.0.2:81"


def test_default_listen_uses_port_on_all_interfaces() -> None:
    assert default_listen({"PORT": "9999"}) == f"{ALL_INTERFACES}:9999"
    assert parse_listen(default_listen({"PORT": "9999"})) == (ALL_INTERFACES, 9999)


def test_default_listen_falls_back_to_loopback() -> None:
    assert default_listen({}) == "127.0.0.1:8080"
    # Empty counts as unset.
    assert default_listen({"HEALTH_LISTEN_ADDR": "", "PORT": ""}) == "127.0.0.1:8080"


# -- database URLs ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://relay:{SECRET}@db.internal:5433/app",
        f"postgres://relay:{SECRET}@db.internal/app",
        "postgresql:///app",
        "postgresql://",
    ],
)
def test_valid_database_urls_pass_through(url: str) -> None:
    assert validate_database_url(url) == url


@pytest.mark.parametrize("url", [None, ""])
def test_no_database_url_means_libpq_environment(url: str | None) -> None:
    assert validate_database_url(url) is None
    assert "PG" in describe_target(url)


@pytest.mark.parametrize(
    "url",
    [
        f"mysql://relay:{SECRET}@h/db",
        f"http://relay:{SECRET}@h/db",
        f"relay:{SECRET}@h/db",
        f"postgresql://relay:{SECRET}@h:99999/db",
        f"postgresql://relay:{SECRET}@h:0/db",
        f"postgresql://relay:{SECRET}@h:port/db",
        f"postgresql://relay:{SECRET}@[::1/db",
    ],
)
def test_invalid_database_urls_are_refused_without_echoing_them(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate_database_url(url)
    message = str(caught.value)
    assert "--database-url" in message
    assert SECRET not in message
    assert "relay" not in message


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (f"postgresql://relay:{SECRET}@db.internal:5433/app", "db.internal:5433/app"),
        (f"postgresql://relay:{SECRET}@db.internal/app", "db.internal:5432/app"),
        (f"postgresql://relay:{SECRET}@[::1]:6000/app", "::1:6000/app"),
        ("postgresql://relay@/app", "localhost:5432/app"),
        (f"postgresql://relay:{SECRET}@h", "h:5432/(default)"),
    ],
)
def test_describe_target_never_includes_user_or_password(url: str, expected: str) -> None:
    described = describe_target(url)
    assert described == expected
    assert SECRET not in described
    assert "relay" not in described
    assert not re.search(r"[@]", described)


def _sidecar(**limits: int) -> SidecarConfig:
    policy = parse_policy(Path(POLICY).read_text())
    return SidecarConfig(database_url=None, policy=policy, listen=("127.0.0.1", 0), **limits)


# Each integer setting of demo, the sidecar and status --watch, built directly with the
# value its flag refuses: the settings refuse it too, with the same words.
_DIRECT: dict[str, Any] = {
    "--jobs": lambda v: DemoOptions(jobs=v, workers=1, exit_when_done=False),
    "--workers": lambda v: DemoOptions(jobs=1, workers=v, exit_when_done=False),
    "--rate": lambda v: DemoOptions(jobs=1, workers=1, exit_when_done=False, rate=v),
    "--story-hold-ms": lambda v: DemoOptions(1, 1, False, story_hold_ms=v),
    "--http-max-connections": lambda v: _sidecar(http_max_connections=v),
    "--database-retry-max-ms": lambda v: _sidecar(database_retry_max_ms=v),
    "--completion-recheck-period-ms": lambda v: _sidecar(completion_recheck_period_ms=v),
}
_SIDECAR = frozenset(
    {"--http-max-connections", "--database-retry-max-ms", "--completion-recheck-period-ms"}
)


@pytest.mark.parametrize("flag", sorted(_DIRECT))
@pytest.mark.parametrize("edge", ["below", "above"])
def test_settings_refuse_what_their_flag_refuses(flag: str, edge: str) -> None:
    option = next(option for option in OPTIONS if option.flag == flag)
    assert isinstance(option, Integer)
    value = option.minimum - 1 if edge == "below" else option.maximum + 1
    verb = "run" if flag in _SIDECAR else "demo"
    argv = [verb, "--policy", POLICY, "--kafka-bootstrap", "b:9", flag, str(value)]
    with pytest.raises(ConfigError) as by_flag:
        resolve(build_parser().parse_args(argv), {})
    with pytest.raises(ConfigError) as built:
        _DIRECT[flag](value)
    assert str(built.value) == str(by_flag.value)
    _DIRECT[flag](option.minimum)  # the least the flag takes is taken


# -- ranges: declared once, on the field a flag fills --------------------------------------------
def test_every_integer_flag_takes_its_range_from_the_field_it_fills() -> None:
    integers = [option for option in OPTIONS if isinstance(option, Integer)]
    assert integers
    for option in integers:
        settings, name = option.fills
        declared = {f.name for f in fields(settings)}
        assert name in declared, option.flag
        # The field's own annotation, read without the product's helper.
        hint = get_type_hints(settings, include_extras=True)[name]
        annotated = next(arg for arg in (hint, *get_args(hint)) if get_origin(arg) is Annotated)
        meta = next(m for m in annotated.__metadata__ if isinstance(m, msgspec.Meta))
        assert (option.minimum, option.maximum) == (meta.ge, meta.le), option.flag
        assert ranges(settings)[name] == (meta.ge, meta.le)


def test_the_relay_settings_ranges_are_those_of_its_flags() -> None:
    # Every ranged RelayConfig field has its flag, and every relay integer flag its field.
    relay_flags = {
        option.fills[1]
        for option in OPTIONS
        if isinstance(option, Integer) and option.fills[0] is RelayConfig
    }
    assert set(ranges(RelayConfig)) == relay_flags
    assert ranges(RelayConfig)["max_attempts"] == (1, 2**31 - 1)  # bound as int4
    assert ranges(RelayConfig)["linger_ms"] == (0, MAX_SETTING)


def test_a_policy_bound_has_the_settings_ceiling() -> None:
    text = Path(POLICY).read_text()
    assert "max_pending_count = 10000" in text
    parse_policy(text.replace("max_pending_count = 10000", f"max_pending_count = {MAX_SETTING}"))
    with pytest.raises(ConfigError, match=r"^policy: \[outbox\] max_pending_count is too large$"):
        parse_policy(
            text.replace("max_pending_count = 10000", f"max_pending_count = {MAX_SETTING + 1}")
        )
