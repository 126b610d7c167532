"""``outbox-relay`` as a process: exit codes, one-line errors, and never a secret in the output."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.support.cli import (
    REPO,
    SHIPPED,
    assert_one_clean_error_line,
    cli_env,
    run_cli,
    with_password,
)
from tests.support.ports import free_port
from tests.support.services import PostgresServer

POLICY = str(REPO / "docs" / "policy.example.toml")
SECRET = "s3cretpw"


def unreachable_url() -> str:
    return f"postgresql://u:{SECRET}@127.0.0.1:{free_port()}/db"


# -- usage errors -----------------------------------------------------------------------------
async def test_unknown_flag_exits_2_with_one_line() -> None:
    result = await run_cli("migrate", "--no-such-flag")
    line = assert_one_clean_error_line(result)
    assert result.code == 2
    assert "--no-such-flag" in line
    assert result.stdout == ""


@pytest.mark.parametrize(
    "argv",
    [
        # A mistyped flag before a URL: the URL, password included, was echoed back.
        ["migrate", "--database-uri", f"postgresql://u:{SECRET}@127.0.0.1/db"],
        ["migrate", f"--database-uri=postgresql://u:{SECRET}@127.0.0.1/db"],
        ["run", "--policy", POLICY, "--kafka-sasl-password", SECRET],
        ["check", "--policy", POLICY, f"postgresql://u:{SECRET}@127.0.0.1/db"],
    ],
    ids=["flag-then-value", "flag=value", "no-such-secret-flag", "bare-value"],
)
async def test_unrecognized_arguments_are_named_without_their_values(argv: list[str]) -> None:
    result = await run_cli(*argv)
    assert result.code == (3 if argv[0] == "check" else 2)
    line = assert_one_clean_error_line(result, SECRET, "postgresql://")
    assert "unrecognized arguments" in line
    # The mistyped flag itself is named, so the operator can find it.
    for mistyped in ("--database-uri", "--kafka-sasl-password"):
        if any(a.split("=")[0] == mistyped for a in argv):
            assert mistyped in line


@pytest.mark.parametrize(
    ("flag", "kind"), [("--log-format", "invalid choice"), ("--batch-size", "invalid int value")]
)
async def test_a_url_given_to_the_wrong_flag_is_not_echoed(flag: str, kind: str) -> None:
    result = await run_cli("run", flag, f"postgresql://u:{SECRET}@127.0.0.1/db")
    assert result.code == 2
    line = assert_one_clean_error_line(result, SECRET, "postgresql://")
    assert flag in line and kind in line


async def test_unknown_top_level_flag_exits_2_with_one_line() -> None:
    result = await run_cli("--no-such-flag")
    assert result.code == 2
    assert_one_clean_error_line(result)


async def test_unknown_verb_exits_2() -> None:
    result = await run_cli("frobnicate")
    assert result.code == 2
    assert "frobnicate" in assert_one_clean_error_line(result)


async def test_missing_verb_exits_2() -> None:
    result = await run_cli()
    assert result.code == 2
    assert "verb" in assert_one_clean_error_line(result)


async def test_bad_log_level_exits_2_with_one_line() -> None:
    result = await run_cli("migrate", "--log-level", "loud", "--database-url", unreachable_url())
    assert result.code == 2
    assert "--log-level" in assert_one_clean_error_line(result, SECRET)
    from_env = await run_cli(
        "migrate", "--database-url", unreachable_url(), env=cli_env(OUTBOX_RELAY_LOG_LEVEL="loud")
    )
    assert from_env.code == 2
    assert "OUTBOX_RELAY_LOG_LEVEL" in assert_one_clean_error_line(from_env, SECRET)


async def test_non_postgres_database_url_exits_2_without_the_password() -> None:
    result = await run_cli("migrate", "--database-url", "mysql://u:pw@h/db")
    assert result.code == 2
    line = assert_one_clean_error_line(result, "pw@", "mysql://")
    assert "postgresql://" in line
    assert "pw" not in result.output.replace("postgresql://", "")


async def test_malformed_database_url_exits_2_without_the_password() -> None:
    for url in (
        f"postgresql://u:{SECRET}@127.0.0.1:99999/db",
        f"postgresql://u:{SECRET}@127.0.0.1:port/db",
        f"postgresql://u:{SECRET}@[::1/db",
    ):
        result = await run_cli("migrate", "--database-url", url)
        assert result.code == 2, url
        assert "--database-url" in assert_one_clean_error_line(result, SECRET)


async def test_database_url_from_the_environment_is_checked_too() -> None:
    result = await run_cli("migrate", env=cli_env(DATABASE_URL=f"mysql://u:{SECRET}@h/db"))
    assert result.code == 2
    assert_one_clean_error_line(result, SECRET)


async def test_unreachable_database_exits_2_naming_the_cause_not_the_password() -> None:
    result = await run_cli("migrate", "--database-url", unreachable_url())
    assert result.code == 2
    line = assert_one_clean_error_line(result, SECRET, "u:")
    assert "connection refused" in line
    assert "127.0.0.1:" in line  # where it tried, so the operator can tell


async def test_wrong_password_exits_2_with_authentication_failed(
    pg_server: PostgresServer,
) -> None:
    url = with_password(pg_server.url, "wrong-s3cret")
    result = await run_cli("migrate", "--database-url", url)
    assert result.code == 2
    line = assert_one_clean_error_line(result, "wrong-s3cret")
    assert "authentication failed" in line


# check and status follow the monitoring-plugins convention: invalid arguments are
# UNKNOWN (3), so a monitor never reads a typo as "something stalled" (2).
async def test_check_with_a_missing_policy_file_is_unknown_exit_3(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.toml")
    result = await run_cli("check", "--policy", missing, "--database-url", unreachable_url())
    assert result.code == 3
    assert "nowhere.toml" in assert_one_clean_error_line(result, SECRET)
    assert result.stdout == ""


async def test_check_without_a_policy_is_unknown_exit_3() -> None:
    result = await run_cli("check", "--database-url", unreachable_url())
    assert result.code == 3
    assert "--policy" in assert_one_clean_error_line(result, SECRET)


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9"],  # not check's flag
        ["status", "--policy", POLICY, "--watch", "--interval-ms", "soon"],  # not an integer
        ["status", "--policy", POLICY, "--receipt-retention-ms", "0"],  # out of range
        ["check", "--policy", POLICY, "--database-url", "mysql://x"],  # not a PostgreSQL URL
    ],
)
async def test_check_and_status_exit_3_on_any_usage_error(argv: list[str]) -> None:
    result = await run_cli(*argv)
    assert result.code == 3, result
    assert_one_clean_error_line(result)
    assert result.stdout == ""


async def test_check_with_an_unreachable_database_is_unknown_exit_3() -> None:
    result = await run_cli("check", "--policy", POLICY, "--database-url", unreachable_url())
    assert result.code == 3
    assert SECRET not in result.output
    assert "Traceback" not in result.output
    document = json.loads(result.stdout)
    assert document["status"] == "fail"
    assert document["classification"] == "unknown"


async def test_status_with_an_unreachable_database_exits_3() -> None:
    result = await run_cli("status", "--policy", POLICY, "--database-url", unreachable_url())
    assert result.code == 3
    assert SECRET not in result.output
    assert "Traceback" not in result.output


async def test_run_with_a_nonsense_listen_address_exits_2() -> None:
    result = await run_cli(
        "run", "--listen", "nonsense", "--policy", POLICY, "--database-url", unreachable_url()
    )
    assert result.code == 2
    assert "--listen" in assert_one_clean_error_line(result, SECRET)


async def test_run_with_a_bad_listen_address_in_the_environment_exits_2() -> None:
    result = await run_cli(
        "run",
        "--policy",
        POLICY,
        "--database-url",
        unreachable_url(),
        env=cli_env(HEALTH_LISTEN_ADDR="127.0.0.1:99999"),
    )
    assert result.code == 2
    assert "port" in assert_one_clean_error_line(result, SECRET)


async def test_run_with_an_invalid_relay_setting_exits_2() -> None:
    result = await run_cli(
        "run",
        "--policy",
        POLICY,
        "--database-url",
        unreachable_url(),
        "--kafka-bootstrap",
        "127.0.0.1:9",
        "--batch-size",
        "0",
    )
    assert result.code == 2
    assert "--batch-size" in assert_one_clean_error_line(result, SECRET)


async def test_redrive_without_a_filter_exits_2() -> None:
    result = await run_cli("redrive", "--database-url", unreachable_url())
    assert result.code == 2
    assert "--all" in assert_one_clean_error_line(result, SECRET)


async def test_redrive_with_a_bad_id_exits_2() -> None:
    result = await run_cli("redrive", "--id", "not-a-uuid", "--database-url", unreachable_url())
    assert result.code == 2
    assert "--id" in assert_one_clean_error_line(result, SECRET)


async def test_version() -> None:
    result = await run_cli("--version")
    assert result.code == 0
    assert re.fullmatch(r"outbox-relay \d+\.\d+\.\d+\S*\n", result.stdout)


# -- against a real database ------------------------------------------------------------------
async def test_migrate_twice_applies_nothing_the_second_time(empty_database_url: str) -> None:
    first = await run_cli("migrate", "--database-url", empty_database_url)
    assert first.code == 0, first.stderr
    assert f"applied {len(SHIPPED)} migration(s)" in first.stdout
    assert [line for line in first.stdout.splitlines() if line.startswith("applying ")] == [
        f"applying {name}" for name in SHIPPED
    ]
    second = await run_cli("migrate", "--database-url", empty_database_url)
    assert second.code == 0, second.stderr
    assert "applied 0 migration(s)" in second.stdout
    assert "applying" not in second.stdout
    # The environment's password is a plain word ("outbox"); the credential pair must not show.
    parts = urlsplit(empty_database_url)
    assert f"{parts.username}:{parts.password}@" not in first.output + second.output
    assert "postgresql://" not in first.output + second.output


async def test_migrate_reads_database_url_from_the_environment(empty_database_url: str) -> None:
    result = await run_cli("migrate", env=cli_env(DATABASE_URL=empty_database_url))
    assert result.code == 0, result.stderr
    assert f"applied {len(SHIPPED)} migration(s)" in result.stdout
    verify = await run_cli(
        "migrate",
        "--verify",
        "--database-url",
        empty_database_url,
        env=cli_env(DATABASE_URL=unreachable_url()),  # the flag wins
    )
    assert verify.code == 0, verify.stderr


async def test_redrive_on_a_migrated_database_reports_the_count(database_url: str) -> None:
    result = await run_cli("redrive", "--all", "--database-url", database_url)
    assert result.code == 0, result.stderr
    assert "returned 0 quarantined event(s)" in result.stdout
