"""Which database URLs are accepted, and what a message may say about one."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ConfigError
from pgconnect import check_driver_settings, describe_target, validate_database_url

ACCEPTED = [
    "postgresql://u:pw@db.example:5432/app",
    "postgres://u@db.example/app",
    "postgresql://u:a%2Fb%40c%3Ad%25e%23f%3Fg@db.example/app",  # every reserved one, encoded
    "postgresql://u:a:b@db.example/app",  # a raw ':' still splits at the first ':'
    "postgresql://u:pw@[::1]:5433/app?sslmode=require",
    "postgresql:///app?host=/var/run/postgresql",
    "postgresql://db.example",
]

REFUSED = [
    ("mysql://u:pw@h/db", "must start with postgresql://"),
    ("u:pw@h/db", "must start with postgresql://"),
    ("postgresql://u:12345/abc@h/db", "percent-encode"),  # '/' ends the authority early
    ("postgresql://u:12345?abc@h/db", "percent-encode"),
    ("postgresql://u:12345#abc@h/db", "percent-encode"),
    ("postgresql://u:ab@cd@h/db", "percent-encode"),  # two '@': parsers disagree on which
    ("postgresql://u:ab%zzcd@h/db", "percent-encode"),  # '%' that starts no escape
    ("postgresql://u:ab%ffcd@h/db", "not a valid"),  # an escape that is not UTF-8
    # Raw bytes that are not UTF-8, as Python keeps them from argv or the environment.
    ("postgresql://u:ab\udcffcd@h/db", "not a valid"),
    ("postgresql://u:pw@h/d\udcff", "not a valid"),
    ("postgresql://u:pw@h:port/db", "not a valid"),
    ("postgresql://u:pw@h:99999/db", "port outside 1-65535"),
    # Parameters the driver checks when it connects: refused now, not at every attempt.
    ("postgresql://u:pw@h/db?sslmode=bogus", "sslmode must be one of disable, allow"),
    ("postgresql://u:pw@h/db?target_session_attrs=x", "target_session_attrs must be one of"),
    ("postgresql://u:pw@h/db?gsslib=x", "gsslib must be one of gssapi, sspi"),
    ("postgresql://u:pw@[::1/db", "not a valid"),
]


@pytest.mark.parametrize("url", ACCEPTED)
def test_accepted(url: str) -> None:
    assert validate_database_url(url) == url


@pytest.mark.parametrize(("url", "says"), REFUSED)
def test_refused_naming_the_flag_never_the_url(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_database_url(url)
    message = str(refused.value)
    assert message.startswith("--database-url ")
    assert says in message
    for part in ("12345", "abc", "pw@", "cd@", "h/db", "h:"):
        assert part not in message


@pytest.mark.parametrize("unset", [None, ""])
def test_no_url_means_the_pg_environment(unset: str | None) -> None:
    assert validate_database_url(unset) is None
    assert describe_target(unset) == "the database named by the PG* environment"


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("postgresql://u:pw@db.example:5433/app", "db.example:5433/app"),
        ("postgresql://u:a%2Fb@db.example/app", "db.example:5432/app"),
        ("postgresql://db.example", "db.example:5432/(default)"),
        # libpq's host and port parameters in the query: a path is a Unix socket directory.
        ("postgresql:///app?host=/var/run/postgresql", "/var/run/postgresql:5432/app"),
        ("postgresql://u:pw@/app?application_name=r&host=/srv/pg&port=5433", "/srv/pg:5433/app"),
        # A raw reserved character would put part of the password in host, port or name.
        ("postgresql://u:12345/abc@db.example/app", "the database named by --database-url"),
        ("postgresql://u:12345#abc@db.example/app", "the database named by --database-url"),
    ],
)
def test_describe_target_never_shows_user_or_password(url: str, target: str) -> None:
    assert describe_target(url) == target


# -- what the driver reads beyond the URL ----------------------------------------------------
DRIVER_ACCEPTED = [
    # The URL wins over a variable; a socket-only host never loads TLS files.
    ("postgresql://h/db?sslmode=disable", {"PGSSLMODE": "bogus", "PGSSLCERT": "/no/such"}),
    ("postgresql:///db?host=/var/run/postgresql", {"PGSSLCERT": "/no/such"}),
    ("postgresql://h/db?sslmode=prefer", {"PGSSLROOTCERT": "/no/such", "PGSSLCRL": "/no/such"}),
    ("postgresql://h/db", {"PGSSLMAXPROTOCOLVERSION": "", "PGTARGETSESSIONATTRS": "primary"}),
    ("postgresql:///db?host=h&port=5432", {"PGPORT": "abc"}),  # the query's port settles it
    ("postgresql://h:5432/db", {"PGPORT": "99999"}),  # parsed, never used
    ("postgresql://h1,h2/db", {"PGPORT": "5432,5433"}),
    (None, {"PGHOST": "h", "PGPORT": " 5432 "}),
]

DRIVER_REFUSED = [
    ("postgresql://h/db", {"PGSSLMODE": "bogus"}, "PGSSLMODE must be one of disable"),
    ("postgresql://h/db", {"PGSSLMODE": ""}, "PGSSLMODE must be one of"),
    (None, {"PGGSSLIB": "krb"}, "PGGSSLIB must be one of gssapi, sspi"),
    ("postgresql://h/db", {"PGSSLNEGOTIATION": "tls"}, "PGSSLNEGOTIATION must be one of"),
    ("postgresql://h/db?sslnegotiation=direct", {}, "sslnegotiation direct needs sslmode"),
    ("postgresql://h/db", {"PGPORT": "abc"}, "PGPORT must be a port"),
    ("postgresql://h/db", {"PGPORT": "0"}, "PGPORT must be a port"),
    ("postgresql://h:5432/db", {"PGPORT": "abc"}, "PGPORT must be a port"),  # parsed anyway
    ("postgresql://h/db", {"PGPORT": "5432,5433"}, "PGPORT lists 2 ports for 1 host(s)"),
    (None, {"PGPORT": "5432,5433"}, "PGPORT lists 2 ports for 5 host(s)"),  # the default hosts
    ("postgresql://h/db?port=5432,x", {}, "--database-url port must be a port"),
    ("postgresql://h/db?sslmode=verify-ca", {}, "need a root certificate"),
    ("postgresql://h/db?sslmode=require&sslrootcert=/no/such", {}, "--database-url sslrootcert"),
    ("postgresql://h/db?sslmode=require", {"PGSSLCRL": "/no/such"}, "PGSSLCRL could not be"),
    ("postgresql://h/db", {"PGSSLCERT": "/no/such"}, "PGSSLCERT (or its key) could not be"),
]


@pytest.mark.parametrize(("url", "environ"), DRIVER_ACCEPTED)
def test_driver_settings_accepted(url: str | None, environ: dict[str, str], tmp_path: Path) -> None:
    check_driver_settings(validate_database_url(url), environ, home=tmp_path)


@pytest.mark.parametrize(("url", "environ", "says"), DRIVER_REFUSED)
def test_driver_settings_refused_naming_the_source_never_the_value(
    url: str | None, environ: dict[str, str], says: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as refused:
        check_driver_settings(validate_database_url(url), environ, home=tmp_path)
    message = str(refused.value)
    assert says in message
    for value in ("/no/such", "bogus", "krb", "tls", "abc", "5432"):
        assert value not in message


def test_a_broken_default_file_under_home_is_refused_by_its_place(tmp_path: Path) -> None:
    (tmp_path / ".postgresql").mkdir()
    (tmp_path / ".postgresql" / "postgresql.crt").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"~/\.postgresql/postgresql\.crt \(or its key\)"):
        check_driver_settings("postgresql://h/db", {}, home=tmp_path)
    # Not loaded at all where the driver would not use TLS.
    check_driver_settings("postgresql://h/db?sslmode=disable", {}, home=tmp_path)
