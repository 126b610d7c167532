"""No part of a database password ever appears in what ``outbox-relay`` prints.

Each password holds a URL-reserved character. Written into the URL percent-encoded, it
must work; written raw, the URL either still means the same login (``:`` does) or is
refused in one line naming ``--database-url``. Either way, every piece of the password
between reserved characters, and its percent-encoded form, stays out of all output.
"""

from __future__ import annotations

import re
import secrets
import string
from urllib.parse import quote, urlsplit

import pytest

from tests.support.cli import (
    REPO,
    CliResult,
    assert_one_clean_error_line,
    cli_env,
    login_role,
    run_cli,
    run_service_cli,
    with_login,
)
from tests.support.ports import free_port

POLICY = str(REPO / "docs" / "policy.example.toml")
RESERVED = "/@:%#?"
# A raw ':' in the password splits user from password at the first ':' in every parser
# this product meets, so it keeps meaning the same login.
UNAMBIGUOUS_RAW = frozenset(":")


def _word() -> str:
    # Starts with letters that are no hex digit, so a raw '%' before it is no valid escape.
    return "qz" + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


def _password(reserved: str) -> str:
    # A numeric first piece reads as a port when '/', '#' or '?' cut the authority short.
    digits = "".join(secrets.choice("123456789") for _ in range(5))
    return reserved.join((digits, _word(), _word())) if len(reserved) == 1 else _mixed()


def _mixed() -> str:
    digits = "".join(secrets.choice("123456789") for _ in range(5))
    pieces = [digits] + [_word() for _ in RESERVED]
    return "".join(p + c for p, c in zip(pieces, RESERVED, strict=False)) + pieces[-1]


def secret_fragments(password: str) -> list[str]:
    """Every piece between reserved characters of length >= 3, the whole and its encoding."""
    pieces = [p for p in re.split(f"[{re.escape(RESERVED)}]", password) if len(p) >= 3]
    return [*pieces, password, quote(password, safe="")]


def assert_no_fragment(result: CliResult, password: str, context: str) -> None:
    for fragment in secret_fragments(password):
        assert fragment not in result.output, (context, fragment, result.output)


def test_secret_fragments_cover_every_piece_and_the_encoding() -> None:
    assert secret_fragments("12345/qzabc@xy") == [
        "12345",
        "qzabc",
        "12345/qzabc@xy",
        "12345%2Fqzabc%40xy",
    ]


CASES = [*RESERVED, RESERVED]


@pytest.mark.parametrize("reserved", CASES, ids=[f"char-{ord(c[0]):x}" for c in RESERVED] + ["all"])
async def test_no_verb_prints_any_part_of_a_password_with_reserved_characters(
    database_url: str, kafka_bootstrap: str, reserved: str
) -> None:
    password = _password(reserved)
    owner = urlsplit(database_url).username
    assert owner is not None
    async with login_role(database_url, password, member_of=owner) as role:
        encoded = with_login(database_url, role, quote(password, safe=""))
        raw = with_login(database_url, role, password)
        raw_works = set(reserved) <= UNAMBIGUOUS_RAW
        for url, works, how in ((encoded, True, "encoded"), (raw, raw_works, "raw")):
            context = f"{how} password with {reserved!r}"
            migrate = await run_cli("migrate", "--log-level", "debug", "--database-url", url)
            redrive = await run_cli(
                "redrive", "--all", "--log-level", "debug", "--database-url", url
            )
            from_env = await run_cli("redrive", "--all", env=cli_env(DATABASE_URL=url))
            run, health = await run_service_cli(
                "run",
                "--log-level",
                "debug",
                "--database-url",
                url,
                "--policy",
                POLICY,
                "--kafka-bootstrap",
                kafka_bootstrap,
                listen_port=free_port(),
            )
            for verb, result in (
                ("migrate", migrate),
                ("redrive", redrive),
                ("redrive from DATABASE_URL", from_env),
                ("run", run),
            ):
                assert_no_fragment(result, password, f"{verb}: {context}")
                if works:
                    assert result.code == 0, (verb, context, result.stderr)
                else:
                    assert result.code == 2, (verb, context, result.output)
                    line = assert_one_clean_error_line(result)
                    assert "--database-url" in line, (verb, context, line)
                    assert result.stdout == ""
            if works:
                assert "applied 0 migration(s)" in migrate.stdout
                assert "returned 0 quarantined event(s)" in redrive.stdout
                # It really ran with that login: the health sidecar read the database.
                assert health is not None and health["classification"] == "within_bounds", (
                    context,
                    health,
                    run.stderr[-2000:],
                )


async def test_a_malformed_url_is_refused_in_one_line_without_echoing_it() -> None:
    password = _password("/")
    for url in (
        f"postgresql://u:{password}@127.0.0.1:{free_port()}/db",
        f"postgresql://u:{password}@[::1/db",
        f"postgresql://u:{password}@127.0.0.1:99999/db",
        f"postgresql://u:{quote(password, safe='')}@127.0.0.1:99999/db",
    ):
        for verb in (("migrate",), ("redrive", "--all")):
            result = await run_cli(*verb, "--database-url", url)
            assert result.code == 2, (verb, url, result.output)
            line = assert_one_clean_error_line(result, "127.0.0.1", "/db", "u:")
            assert "--database-url" in line
            assert_no_fragment(result, password, f"{verb} {url}")
