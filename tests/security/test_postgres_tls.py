"""PostgreSQL with TLS on: verify-full connects; a wrong CA and a wrong host name are one line.

Only the Debian server has TLS (its certificate names DNS:localhost); PostgreSQL 18 from
the wheel is built without it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pgconnect import connect
from tests.security.process import POLICY_OUTBOX_ONLY, run_cli
from tests.support.roles import as_role
from tests.support.services import PostgresServer
from tests.support.tls import service_file, untrusted_ca, with_tls


async def test_verify_full_connects(tls_server: PostgresServer, database_url: str, ca: str) -> None:
    conn = await connect(with_tls(database_url, host="localhost", rootcert=ca))
    try:
        assert await conn.fetchval("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
    finally:
        await conn.close()
    done = run_cli(
        "migrate",
        "--verify",
        "--database-url",
        with_tls(database_url, host="localhost", rootcert=ca),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("migrations up to date")


async def test_check_over_verify_full_is_within_bounds(
    tls_server: PostgresServer, database_url: str, ca: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_OUTBOX_ONLY)
    url = with_tls(database_url, host="localhost", rootcert=ca)
    done = run_cli("check", "--policy", str(policy), "--database-url", url)
    assert done.returncode == 0, done.stdout + done.stderr


def _one_line(done: subprocess.CompletedProcess[str], password: str) -> str:
    (line,) = done.stderr.splitlines()
    assert password not in line and "postgresql://" not in line
    return line


async def test_an_untrusted_server_certificate_is_one_line_naming_it(
    tls_server: PostgresServer, database_url: str, tmp_path: Path
) -> None:
    url = as_role(
        with_tls(database_url, host="localhost", rootcert=untrusted_ca(tmp_path)),
        "outbox",
        "s3cr3t-pg-pw",
    )
    done = run_cli("migrate", "--verify", "--database-url", url)
    assert done.returncode == 2
    line = _one_line(done, "s3cr3t-pg-pw")
    assert line.startswith("outbox-relay: error: cannot connect to localhost:")
    assert line.endswith(": server certificate not trusted (check sslrootcert)")


async def test_a_host_name_the_certificate_does_not_carry_is_one_line_naming_it(
    tls_server: PostgresServer, database_url: str, ca: str
) -> None:
    url = as_role(with_tls(database_url, host="127.0.0.1", rootcert=ca), "outbox", "s3cr3t-pg-pw")
    done = run_cli("migrate", "--verify", "--database-url", url)
    assert done.returncode == 2
    line = _one_line(done, "s3cr3t-pg-pw")
    assert line.startswith("outbox-relay: error: cannot connect to 127.0.0.1:")
    assert line.endswith(": server certificate does not match the host name")


async def test_check_names_an_untrusted_certificate_not_the_url(
    tls_server: PostgresServer, database_url: str, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_OUTBOX_ONLY)
    url = with_tls(database_url, host="localhost", rootcert=untrusted_ca(tmp_path))
    done = run_cli("check", "--policy", str(policy), "--database-url", url)
    assert done.returncode == 3, done.stdout
    assert "could not be parsed" not in done.stdout
    assert "database unavailable: server certificate not trusted" in done.stdout


def _as_cert_user(url: str, user: str, ca: str, cert: str | None, key: str | None) -> str:
    """``url`` as ``user`` with no password, over verify-full, with or without a certificate."""
    parts = urlsplit(with_tls(url, host="localhost", rootcert=ca))
    host = parts.netloc.rpartition("@")[2]
    query = dict(parse_qsl(parts.query))
    if cert and key:
        query.update(sslcert=cert, sslkey=key)
    return urlunsplit(parts._replace(netloc=f"{user}@{host}", query=urlencode(query)))


async def test_a_client_certificate_logs_in_and_its_absence_is_one_line(
    tls_server: PostgresServer, database_url: str, ca: str, tmp_path: Path
) -> None:
    # The role a client certificate names (its CN); pg_hba admits it only with that
    # certificate (scripts/services/postgres.py), never with a password.
    user = service_file("PG_TEST_CERT_USER")  # a role name, read like the files beside it
    cert = service_file("PG_TEST_CLIENT_CERTFILE")
    key = service_file("PG_TEST_CLIENT_KEYFILE")
    admin = await connect(database_url)
    try:
        await admin.execute(
            f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {quote(user)}) "
            f'THEN CREATE ROLE "{user}" LOGIN; END IF; END $$'
        )
        await admin.execute(
            f'GRANT CONNECT ON DATABASE "{urlsplit(database_url).path[1:]}" TO "{user}"'
        )
    finally:
        await admin.close()
    conn = await connect(_as_cert_user(database_url, user, ca, cert, key))
    try:
        assert await conn.fetchval("SELECT current_user") == user
        assert (
            await conn.fetchval("SELECT client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            == f"/CN={user}"
        )
    finally:
        await conn.close()
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY_OUTBOX_ONLY)
    done = run_cli(
        "migrate", "--verify", "--database-url", _as_cert_user(database_url, user, ca, None, None)
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("outbox-relay: error: cannot connect to localhost:")
    assert "authentication failed" in line


def quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
