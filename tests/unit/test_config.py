"""Configuration validation, listen addresses and database URLs: errors name the input, never a secret."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from contracts.errors import ConfigError
from outbox_relay.cli import build_parser, default_listen, parse_listen, relay_config
from pgconnect import describe_target, validate_database_url
from relay.config import KafkaSecurity, RelayConfig, validate_topic_template

SECRET = "s3cr3t-Passw0rd"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104 - the documented default with PORT


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


def test_cli_reads_the_sasl_password_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KAFKA_SASL_PASSWORD", "KAFKA_SECURITY_PROTOCOL", "OUTBOX_RELAY_BATCH_SIZE"):
        monkeypatch.delenv(name, raising=False)
    secret_file = tmp_path / "sasl"
    secret_file.write_text(SECRET + "\n")
    args = build_parser().parse_args(
        [
            "run",
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
        ]
    )
    c = relay_config(args)
    assert c.kafka_security.protocol == "SASL_SSL"
    assert c.kafka_security.sasl_password == SECRET
    assert SECRET not in repr(c)


def test_cli_flag_beats_environment_and_bad_env_integers_name_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OUTBOX_RELAY_BATCH_SIZE", "250")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    args = build_parser().parse_args(["run", "--batch-size", "10"])
    c = relay_config(args)
    assert c.batch_size == 10
    assert c.kafka_bootstrap == "env:9092"
    assert relay_config(build_parser().parse_args(["run"])).batch_size == 250
    monkeypatch.setenv("OUTBOX_RELAY_BATCH_SIZE", "lots")
    with pytest.raises(ConfigError, match="OUTBOX_RELAY_BATCH_SIZE"):
        relay_config(build_parser().parse_args(["run"]))


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


def test_default_listen_prefers_health_listen_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEALTH_LISTEN_ADDR", "10.0.0.5:7000")
    monkeypatch.setenv("PORT", "9999")
    assert default_listen() == "10.0.0.5:7000"


def test_default_listen_uses_port_on_all_interfaces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEALTH_LISTEN_ADDR", raising=False)
    monkeypatch.setenv("PORT", "9999")
    assert default_listen() == f"{ALL_INTERFACES}:9999"
    assert parse_listen(default_listen()) == (ALL_INTERFACES, 9999)


def test_default_listen_falls_back_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEALTH_LISTEN_ADDR", raising=False)
    monkeypatch.delenv("PORT", raising=False)
    assert default_listen() == "127.0.0.1:8080"
    monkeypatch.setenv("HEALTH_LISTEN_ADDR", "")  # empty counts as unset
    monkeypatch.setenv("PORT", "")
    assert default_listen() == "127.0.0.1:8080"


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
