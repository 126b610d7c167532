"""Which network paths are not verified by certificate, judged from the settings as the
drivers read them: PostgreSQL over TCP without verify-ca/verify-full (the default,
prefer, included), Kafka without TLS; a Unix socket and loopback addresses excepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ConfigError
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.settings import ServiceSettings
from outbox_relay.transport import (
    KAFKA,
    POSTGRES,
    UnverifiedPath,
    is_loopback,
    unverified_kafka,
    unverified_postgres,
)
from pgconnect import transport
from relay.config import KafkaSecurity

SECRET = "s3cr3t-Passw0rd"
POLICY = str(Path(__file__).resolve().parents[2] / "docs" / "policy.example.toml")
REMOTE = f"postgresql://relay:{SECRET}@db.internal:5432/app"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("relay.localhost", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("192.0.2.2", False),
        ("10.0.0.1", False),
        ("db.internal", False),
        ("localhost.example.com", False),
        ("0.0.0.0", False),  # noqa: S104 - a host name under test, never bound
        ("", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("url", "environ", "tcp_hosts", "sslmode"),
    [
        (REMOTE, {}, ("db.internal",), "prefer"),  # libpq's default
        (REMOTE, {"PGSSLMODE": "require"}, ("db.internal",), "require"),
        (
            REMOTE + "?sslmode=verify-full",
            {"PGSSLMODE": "disable"},
            ("db.internal",),
            "verify-full",
        ),
        ("postgresql://relay@a:1,b:2/app", {}, ("a", "b"), "prefer"),
        ("postgresql://relay@/app?host=/var/run/postgresql", {}, (), "disable"),
        (None, {"PGHOST": "db.internal", "PGSSLMODE": "verify-ca"}, ("db.internal",), "verify-ca"),
        (None, {"PGHOST": "/tmp"}, (), "disable"),  # noqa: S108 - a socket directory
        # Nothing names a host: the driver's socket directories, then localhost over TCP.
        (None, {}, ("localhost",), "prefer"),
    ],
)
def test_the_postgres_transport_as_the_driver_reads_it(
    url: str | None, environ: dict[str, str], tcp_hosts: tuple[str, ...], sslmode: str
) -> None:
    plan = transport(url, environ)
    assert plan.tcp_hosts == tcp_hosts
    assert plan.sslmode == sslmode


@pytest.mark.parametrize(
    ("url", "environ", "reason"),
    [
        (REMOTE, {}, "sslmode prefer over TCP (--database-url)"),
        (REMOTE + "?sslmode=require", {}, "sslmode require over TCP (--database-url)"),
        (REMOTE, {"PGSSLMODE": "disable"}, "sslmode disable over TCP (--database-url)"),
        (None, {"PGHOST": "db.internal"}, "sslmode prefer over TCP (--database-url)"),
        # One remote host in a list is enough.
        ("postgresql://relay@localhost:1,db.internal:2/app", {}, "sslmode prefer over TCP"),
        (REMOTE + "?sslmode=verify-full", {}, None),
        (REMOTE + "?sslmode=verify-ca", {}, None),
        (None, {"PGHOST": "db.internal", "PGSSLMODE": "verify-full"}, None),
        ("postgresql://relay:pw@127.0.0.1:5432/app", {}, None),
        ("postgresql://relay:pw@[::1]:5432/app", {}, None),
        ("postgresql://relay@/app?host=/var/run/postgresql", {}, None),
        (None, {}, None),
    ],
)
def test_postgres_is_unverified_over_tcp_to_a_remote_host_without_verify(
    url: str | None, environ: dict[str, str], reason: str | None
) -> None:
    found = unverified_postgres({"--database-url": url}, environ)
    if reason is None:
        assert found is None
    else:
        assert found is not None and found.path == POSTGRES
        assert reason in found.reason
        assert SECRET not in found.reason and "db.internal" not in found.reason


def test_the_listen_url_is_judged_too() -> None:
    found = unverified_postgres(
        {
            "--database-url": REMOTE + "?sslmode=verify-full",
            "--listen-database-url": REMOTE,
        },
        {},
    )
    assert found == UnverifiedPath(POSTGRES, "sslmode prefer over TCP (--listen-database-url)")


@pytest.mark.parametrize(
    ("bootstrap", "security", "unverified"),
    [
        ("broker:9092", KafkaSecurity(), True),
        ("127.0.0.1:9092,broker:9092", KafkaSecurity(), True),
        ("127.0.0.1:9092,localhost:9093,[::1]:9094", KafkaSecurity(), False),
        ("broker:9093", KafkaSecurity(protocol="SSL"), False),
        (
            "broker:9096",
            KafkaSecurity(
                protocol="SASL_PLAINTEXT",
                sasl_mechanism="SCRAM-SHA-512",
                sasl_username="relay",
                sasl_password=SECRET,
            ),
            True,
        ),
    ],
)
def test_kafka_is_unverified_without_tls_to_a_remote_broker(
    bootstrap: str, security: KafkaSecurity, unverified: bool
) -> None:
    found = unverified_kafka(bootstrap, security)
    assert (found is not None) is unverified
    if found is not None:
        assert found.path == KAFKA and security.protocol in found.reason
        assert "broker" not in found.reason and SECRET not in found.reason


def test_sasl_plain_without_tls_is_refused() -> None:
    with pytest.raises(ConfigError, match="PLAIN") as caught:
        KafkaSecurity(
            protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_username="relay",
            sasl_password=SECRET,
        )
    assert SECRET not in str(caught.value)
    # Over TLS, PLAIN stays allowed; SCRAM never sends the password.
    KafkaSecurity(protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="r", sasl_password="p")


# -- as run resolves it ------------------------------------------------------------------------
def service(argv: list[str], environ: dict[str, str]) -> ServiceSettings:
    settings = resolve(build_parser().parse_args(["run", "--policy", POLICY, *argv]), environ)
    assert isinstance(settings, ServiceSettings)
    return settings


def test_run_finds_both_paths_unverified_by_default() -> None:
    settings = service(
        ["--database-url", REMOTE], {"KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092,broker-2:9092"}
    )
    assert [found.path for found in settings.unverified_transport] == [POSTGRES, KAFKA]


def test_run_without_the_relay_judges_only_postgres() -> None:
    settings = service(["--no-relay", "--database-url", REMOTE], {})
    assert [found.path for found in settings.unverified_transport] == [POSTGRES]


def test_local_paths_are_not_unverified() -> None:
    settings = service(
        ["--database-url", "postgresql://relay:pw@localhost/app"],
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"},
    )
    assert settings.unverified_transport == ()


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        (["--require-verified-transport"], {}),
        ([], {"OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT": "true"}),
    ],
)
def test_require_verified_transport_refuses_in_one_line_without_hosts_or_secrets(
    argv: list[str], environ: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        service(
            ["--database-url", REMOTE, *argv],
            {"KAFKA_BOOTSTRAP_SERVERS": "broker:9092", **environ},
        )
    message = str(caught.value)
    assert message.startswith("--require-verified-transport: ")
    assert "PostgreSQL" in message and "Kafka" in message
    assert "\n" not in message
    assert SECRET not in message and "db.internal" not in message and "broker" not in message


def test_require_verified_transport_accepts_verified_and_local_paths(tmp_path: Path) -> None:
    import trustme

    root = tmp_path / "ca.pem"
    root.write_bytes(trustme.CA().cert_pem.bytes())
    settings = service(
        ["--require-verified-transport", "--database-url", REMOTE + "?sslmode=verify-full"],
        {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "PGSSLROOTCERT": str(root)},
    )
    assert settings.unverified_transport == ()
