"""What the settings check refuses, the driver fails on; what it accepts, the driver connects with.

Each case is given twice: to :func:`pgconnect.check_driver_settings` (with the variables
and a home directory of its own) and to asyncpg itself, connecting to the PostgreSQL
server that speaks TLS with the same variables and home in the process environment. The
two verdicts must agree, so a setting refused at start-up is one the driver would have
failed on at every attempt, and one accepted is not refused for nothing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import asyncpg
import pytest

from contracts.errors import ConfigError
from pgconnect import check_driver_settings, validate_database_url
from tests.support.services import PostgresServer
from tests.support.tls import service_file

# A stand-in for a file's content, resolved per test: the services' CA and client pair,
# or bytes that are no PEM at all.
CA, CLIENT_CERT, CLIENT_KEY, GARBAGE = "<ca>", "<client cert>", "<client key>", "<garbage>"
MISSING = "<missing>"


@dataclass(frozen=True)
class Case:
    name: str
    accepted: bool
    query: dict[str, str] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    home: dict[str, str] = field(default_factory=dict)  # ~/.postgresql/<name> → content
    # Where the URL's port is: with its host, in the query (host too), or nowhere, so
    # PGPORT gives it (the server's, unless the case sets PGPORT).
    port: str = "netloc"
    # The driver fails before asking any server (False: it asks the wrong one).
    fails_in_client: bool = True


CASES = [
    # Accepted: the URL wins over a variable, an empty protocol bound is unset, files load.
    Case("url-mode-wins", True, {"sslmode": "disable"}, {"PGSSLMODE": "bogus"}),
    Case("prefer-ignores-root", True, {"sslmode": "prefer"}, {"PGSSLROOTCERT": MISSING}),
    Case("require-with-root", True, {"sslmode": "require"}, {"PGSSLROOTCERT": CA}),
    Case("verify-full-home-root", True, {"sslmode": "verify-full"}, home={"root.crt": CA}),
    Case(
        "client-pair",
        True,
        {"sslmode": "require"},
        {"PGSSLCERT": CLIENT_CERT, "PGSSLKEY": CLIENT_KEY},
    ),
    Case(
        "home-client-pair", True, home={"postgresql.crt": CLIENT_CERT, "postgresql.key": CLIENT_KEY}
    ),
    Case("empty-min-version", True, environ={"PGSSLMINPROTOCOLVERSION": ""}),
    Case("read-write", True, environ={"PGTARGETSESSIONATTRS": "read-write"}),
    Case("query-port-settles-it", True, environ={"PGPORT": "abc"}, port="query"),
    Case("pgport-gives-the-port", True, port="pgport"),
    Case("pgport-unused-range", True, environ={"PGPORT": "99999"}),
    # Refused: each fails every connection attempt the same way.
    Case("bad-mode", False, environ={"PGSSLMODE": "bogus"}),
    Case("empty-mode", False, environ={"PGSSLMODE": ""}),
    Case("bad-session-attrs", False, environ={"PGTARGETSESSIONATTRS": "x"}),
    Case("bad-negotiation", False, environ={"PGSSLNEGOTIATION": "x"}),
    Case("bad-gsslib", False, environ={"PGGSSLIB": "x"}),
    Case("bad-max-version", False, environ={"PGSSLMAXPROTOCOLVERSION": "TLSv9"}),
    Case("direct-needs-require", False, {"sslmode": "prefer"}, {"PGSSLNEGOTIATION": "direct"}),
    Case("pgport-not-a-number", False, environ={"PGPORT": "abc"}),
    # The driver takes 99999 modulo 65536 and connects to port 34463: refused here, and
    # some other service's wherever that port is open.
    Case(
        "pgport-out-of-range", False, {}, {"PGPORT": "99999"}, port="pgport", fails_in_client=False
    ),
    Case("pgport-count", False, environ={"PGPORT": "5432,5433"}),
    Case("verify-ca-no-root", False, {"sslmode": "verify-ca"}),
    Case("root-missing", False, {"sslmode": "require"}, {"PGSSLROOTCERT": MISSING}),
    Case("root-garbage", False, {"sslmode": "require"}, {"PGSSLROOTCERT": GARBAGE}),
    Case("home-root-garbage", False, {"sslmode": "require"}, home={"root.crt": GARBAGE}),
    Case("crl-missing", False, {"sslmode": "require"}, {"PGSSLCRL": MISSING}),
    Case("cert-missing", False, environ={"PGSSLCERT": MISSING}),
    Case("cert-without-key", False, environ={"PGSSLCERT": CLIENT_CERT}),
    Case("cert-wrong-key", False, environ={"PGSSLCERT": CLIENT_CERT, "PGSSLKEY": GARBAGE}),
    Case("home-cert-garbage", False, home={"postgresql.crt": GARBAGE}),
]


def _content(marker: str, tmp_path: Path) -> str:
    """The path a marker stands for."""
    files = {
        CA: service_file("PG_TEST_CAFILE"),
        CLIENT_CERT: service_file("PG_TEST_CLIENT_CERTFILE"),
        CLIENT_KEY: service_file("PG_TEST_CLIENT_KEYFILE"),
    }
    if marker in files:
        return files[marker]
    if marker == GARBAGE:
        path = tmp_path / "garbage.pem"
        path.write_text("not a certificate\n")
        return str(path)
    if marker == MISSING:
        return str(tmp_path / "missing.pem")
    return marker  # a plain value


def _url(server_url: str, case: Case, tmp_path: Path) -> str:
    parts = urlsplit(server_url)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    port = hostport.rpartition(":")[2]
    query = {name: _content(value, tmp_path) for name, value in case.query.items()}
    # localhost: the name the server's certificate carries
    netloc = {"netloc": f"{userinfo}@localhost:{port}", "query": f"{userinfo}@"}.get(
        case.port, f"{userinfo}@localhost"
    )
    if case.port == "query":
        query |= {"host": "localhost", "port": port}
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def _home(case: Case, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    directory = home / ".postgresql"
    directory.mkdir(parents=True)
    for name, marker in case.home.items():
        (directory / name).write_bytes(Path(_content(marker, tmp_path)).read_bytes())
    return home


def _preflight_accepts(url: str, environ: dict[str, str], home: Path) -> bool:
    try:
        check_driver_settings(validate_database_url(url), environ, home=home)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_the_check_and_the_driver_agree(
    case: Case, tls_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _url(tls_server.url, case, tmp_path)
    environ = {name: _content(value, tmp_path) for name, value in case.environ.items()}
    if case.port == "pgport":
        environ.setdefault("PGPORT", str(urlsplit(tls_server.url).port))
    home = _home(case, tmp_path)
    assert _preflight_accepts(url, environ, home) is case.accepted

    for name in [name for name in os.environ if re.fullmatch("PG[A-Z]+", name)]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(home))
    if case.accepted:
        conn = await asyncpg.connect(url, timeout=10)
        try:
            assert await conn.fetchval("SELECT 1") == 1
        finally:
            await conn.close()
    else:
        # What the driver raises varies (its configuration error, a ValueError from int(),
        # OverflowError, FileNotFoundError, ssl.SSLError); that it fails is the point.
        with pytest.raises(Exception) as failed:  # noqa: PT011 - any failure is the verdict
            await asyncpg.connect(url, timeout=10)
        # Failed in the client, before any server said no or was not there.
        server_said_no = isinstance(failed.value, asyncpg.PostgresError | ConnectionRefusedError)
        assert server_said_no is not case.fails_in_client
