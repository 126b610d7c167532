"""Which database URLs are accepted, and what a message may say about one."""

from __future__ import annotations

import pytest

from contracts.errors import ConfigError
from pgconnect import describe_target, validate_database_url

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
