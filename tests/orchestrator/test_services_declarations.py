"""What the services are declared with: settings fingerprints and the files rendered from
the port plan (pure; no service runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.services.declaration import fingerprint
from scripts.services.kafka import DEV_PROFILE, KafkaProfile, listeners, server_properties
from scripts.services.pgbouncer import pgbouncer_ini
from scripts.services.plan import PortPlan
from scripts.services.postgres import Binaries, PostgresCluster, hba_lines, role_sql
from scripts.services.tls import DevTls

PLAN = PortPlan(30000)


class FixedBinaries(Binaries):
    major = 15

    def install(self) -> None:
        pass

    def bin_dir(self) -> Path:
        return Path("/nonexistent/bin")

    def version(self) -> str:
        return "postgres (PostgreSQL) 15.99"


def _cluster(
    home: Path, port: int, settings: tuple[str, ...] = ("max_connections = 300",)
) -> PostgresCluster:
    return PostgresCluster(
        name="pg15", binaries=FixedBinaries(), port=port, home=home, settings=settings
    )


def test_a_fingerprint_changes_with_any_setting_and_only_then() -> None:
    settings = ["port = 1", "max_connections = 300"]
    assert fingerprint(settings) == fingerprint(list(settings))
    assert fingerprint(settings) != fingerprint(["port = 2", "max_connections = 300"])
    assert fingerprint(settings) != fingerprint([*settings, "fsync = off"])
    # lines are kept apart: moving a character across a line break is a change
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])


def test_a_cluster_s_settings_carry_its_port_socket_and_server_settings(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path / "pg", 30032)
    conf = cluster.conf_lines()
    assert "port = 30032" in conf
    assert f"unix_socket_directories = '{tmp_path / 'pg'}'" in conf
    assert "max_connections = 300" in conf
    assert not any(line.startswith("ssl") for line in conf)
    base = fingerprint(cluster.settings())
    assert fingerprint(_cluster(tmp_path / "pg", 30033).settings()) != base
    assert (
        fingerprint(_cluster(tmp_path / "pg", 30032, ("max_connections = 200",)).settings()) != base
    )
    assert fingerprint(_cluster(tmp_path / "pg", 30032).settings()) == base


def test_pg_hba_admits_the_certificate_role_by_certificate_before_any_password_line() -> None:
    lines = hba_lines(tls=True)
    cert = lines.index("hostssl all outbox_cert 127.0.0.1/32 cert")
    catch_all = lines.index("host all all 127.0.0.1/32 scram-sha-256")
    assert cert < catch_all  # pg_hba's first matching line decides
    assert all("trust" not in line for line in lines if not line.startswith("local"))
    assert not any("outbox_cert" in line for line in hba_lines(tls=False))


def test_the_login_role_is_made_or_brought_back_with_its_password_quoted() -> None:
    sql = role_sql("outbox", "it's")
    assert "CREATE ROLE outbox LOGIN SUPERUSER PASSWORD 'it''s'" in sql
    assert "ALTER ROLE outbox LOGIN SUPERUSER PASSWORD 'it''s'" in sql


def _properties(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines)


def test_the_broker_listens_on_the_plan_and_advertises_the_proxies_ports(tmp_path: Path) -> None:
    tls = DevTls(tmp_path / "tls")
    tls.dir.mkdir()
    (tls.dir / "kafka-plain-relay.password").write_text("pw\n")
    props = _properties(server_properties(PLAN, tmp_path / "data", DEV_PROFILE, tls))
    assert props["listeners"].split(",") == [
        "PLAINTEXT://127.0.0.1:30092",
        "CONTROLLER://127.0.0.1:30093",
        "PROXY0://127.0.0.1:30094",
        "PROXY1://127.0.0.1:30095",
        "PROXY2://127.0.0.1:30096",
        "SASL_SSL://127.0.0.1:30097",
        "SSL://127.0.0.1:30098",
    ]
    advertised = props["advertised.listeners"].split(",")
    assert "PROXY0://127.0.0.1:30194" in advertised
    assert not any(a.startswith("CONTROLLER") for a in advertised)
    assert props["controller.quorum.voters"] == "1@127.0.0.1:30093"
    assert props["log.dirs"] == str(tmp_path / "data")
    assert props["ssl.truststore.location"] == str(tls.ca)
    assert 'user_relay-plain="pw"' in props["listener.name.sasl_ssl.plain.sasl.jaas.config"]
    assert "SASL_SSL:SASL_SSL" in props["listener.security.protocol.map"]


def test_a_broker_without_tls_has_only_plain_listeners_and_no_authorizer(tmp_path: Path) -> None:
    profile = KafkaProfile(proxies=1, secured=False)
    props = _properties(server_properties(PLAN, tmp_path, profile, None))
    assert [name for name, _, _ in listeners(PLAN, profile)] == [
        "PLAINTEXT",
        "CONTROLLER",
        "PROXY0",
    ]
    assert "authorizer.class.name" not in props
    assert "SSL" not in props["listener.security.protocol.map"]
    with pytest.raises(ValueError, match="need the development TLS files"):
        server_properties(PLAN, tmp_path, DEV_PROFILE, None)


def test_pgbouncer_pools_for_its_upstream_with_its_files_in_its_home(tmp_path: Path) -> None:
    ini = pgbouncer_ini(port=30064, upstream_port=30032, home=tmp_path)
    assert "* = host=127.0.0.1 port=30032" in ini
    assert "listen_port = 30064" in ini
    assert "pool_mode = transaction" in ini
    for name in ("auth_file", "logfile", "pidfile"):
        (line,) = [line for line in ini if line.startswith(f"{name} =")]
        assert Path(line.split("= ", 1)[1]).parent == tmp_path
