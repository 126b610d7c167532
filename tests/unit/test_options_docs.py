"""docs/cli.md's verb and configuration tables say what ``outbox_relay.options`` declares, both
ways.

Every option with an environment variable has a row in the configuration table with the
same variable(s) and default, and every row there is declared. Every flag without a variable
is shown on its verb's line of the verb table, and every flag shown there is declared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from outbox_relay.flags import Option
from outbox_relay.options import OPTIONS, VERBS

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_DAY_MS = 24 * 3600 * 1000
_ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
_NOTE = re.compile(r"\s*\(.*\)$")  # "5 (permanent failures before quarantine)" → "5"

DECLARED = {option.flag: option for option in OPTIONS}


@dataclass(frozen=True)
class Documented:
    """One flag as a configuration-table row describes it."""

    flag: str
    env: str
    more_env: frozenset[str]
    default: object


def section(text: str, heading: str) -> list[str]:
    """The lines of a markdown section, up to the next heading of any level."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("#")), len(lines))
    return lines[start:end]


def table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of the first table in ``lines``, header and rule left out."""
    rows = []
    for line in lines:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
        rows.append(cells)
    return [row for row in rows[1:] if not set("".join(row)) <= set("-: ")]


def code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def expand(short: str, previous: str, separator: str) -> str:
    """``-certfile`` after ``--kafka-ssl-cafile`` → ``--kafka-ssl-certfile``; ``…_CAP_MS`` likewise.

    The shorthand replaces as many trailing words of the previous name as it has itself.
    """
    if short.startswith("…"):
        short = short[1:]
    elif short.startswith("--") or not short.startswith(separator):
        return short
    words = short.strip(separator).split(separator)
    kept = previous.split(separator)[: -len(words)]
    return separator.join([*kept, *words])


def parse_default(text: str) -> object:
    """A default cell → the value the declaration should hold (or its default text)."""
    text = _NOTE.sub("", text).replace("`", "").strip()
    if text in ("—", "none"):
        return None
    if text.isdigit():
        return int(text)
    if days := re.fullmatch(r"(\d+) days?", text):
        return int(days.group(1)) * _DAY_MS
    return text


def configuration_table() -> list[Documented]:
    documented = []
    for flags_cell, env_cell, default_cell in table_rows(
        section(CLI_DOC.read_text(encoding="utf-8"), "## Configuration")
    ):
        flags: list[str] = []
        for short in (span for span in code_spans(flags_cell) if span.startswith("-")):
            flags.append(expand(short, flags[-1], "-") if flags else short)
        env_parts = env_cell.split(" / ")
        defaults = default_cell.split(" / ")
        assert len(env_parts) == len(flags), f"one environment part per flag: {flags_cell}"
        assert len(defaults) in (1, len(flags)), f"one default, or one per flag: {flags_cell}"
        previous_env = ""
        for i, flag in enumerate(flags):
            names = []
            for span in code_spans(env_parts[i]):
                name = expand(span.split("=")[0], previous_env, "_")
                if _ENV_NAME.fullmatch(name):
                    names.append(name)
            assert names, f"no environment variable documented for {flag}"
            previous_env = names[0]
            documented.append(
                Documented(
                    flag=flag,
                    env=names[0],
                    more_env=frozenset(names[1:]),
                    default=parse_default(defaults[i if len(defaults) > 1 else 0]),
                )
            )
    return documented


def verb_table() -> dict[str, set[str]]:
    """Each verb in the verb table and the flags its line shows."""
    lines = section(CLI_DOC.read_text(encoding="utf-8"), "## Verbs")
    shown = {}
    for usage, _ in table_rows(lines):
        text = usage.replace("`", "")
        shown[text.split()[0]] = set(re.findall(r"--[a-z][a-z-]*", text))
    return shown


def documented_default(option: Option) -> object:
    return option.default_text if option.default_text is not None else option.default_value


# -- the tests ---------------------------------------------------------------------------------
CONFIGURATION = configuration_table()
WITH_ENV = [option for option in OPTIONS if option.env]
WITHOUT_ENV = [option for option in OPTIONS if not option.env]


def test_the_configuration_table_was_read() -> None:
    assert len(CONFIGURATION) >= len(WITH_ENV) > 20


def test_each_flag_has_one_row() -> None:
    flags = [row.flag for row in CONFIGURATION]
    assert len(flags) == len(set(flags))


@pytest.mark.parametrize("option", WITH_ENV, ids=lambda option: option.flag)
def test_every_option_with_a_variable_is_documented_as_declared(option: Option) -> None:
    rows = [row for row in CONFIGURATION if row.flag == option.flag]
    assert rows, f"{option.flag} ({option.env}) is missing from docs/cli.md's table"
    (row,) = rows
    assert row.env == option.env
    assert row.more_env == frozenset({option.fallback_env} - {None})
    assert row.default == documented_default(option)


@pytest.mark.parametrize("row", CONFIGURATION, ids=lambda row: row.flag)
def test_every_documented_row_is_declared(row: Documented) -> None:
    option = DECLARED.get(row.flag)
    assert option is not None, f"docs/cli.md documents {row.flag}, which no verb takes"
    assert option.env == row.env


def test_the_cli_table_lists_every_verb() -> None:
    assert set(verb_table()) == {name for name, _ in VERBS}


@pytest.mark.parametrize("option", WITHOUT_ENV, ids=lambda option: option.flag)
def test_every_flag_without_a_variable_is_shown_on_its_verbs_line(option: Option) -> None:
    shown = verb_table()
    for verb in option.verbs:
        assert option.flag in shown[verb], (
            f"docs/cli.md's `{verb}` line does not show {option.flag}"
        )


@pytest.mark.parametrize(("verb", "flags"), sorted(verb_table().items()))
def test_every_flag_on_a_verbs_line_is_declared_for_that_verb(verb: str, flags: set[str]) -> None:
    for flag in flags:
        assert flag in DECLARED and verb in DECLARED[flag].verbs, f"{verb} {flag}"


# -- the reader itself -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("short", "previous", "separator", "expected"),
    [
        ("-certfile", "--kafka-ssl-cafile", "-", "--kafka-ssl-certfile"),
        ("--linger-ms", "--compression", "-", "--linger-ms"),
        ("…_KEYFILE", "KAFKA_SSL_CAFILE", "_", "KAFKA_SSL_KEYFILE"),
        ("…_CAP_MS", "OUTBOX_RELAY_RETRY_BASE_MS", "_", "OUTBOX_RELAY_RETRY_CAP_MS"),
        ("…_RENEW_MS", "OUTBOX_RELAY_LEASE_TTL_MS", "_", "OUTBOX_RELAY_LEASE_RENEW_MS"),
        ("KAFKA_SASL_USERNAME", "KAFKA_SASL_MECHANISM", "_", "KAFKA_SASL_USERNAME"),
    ],
)
def test_shorthand_names_expand(short: str, previous: str, separator: str, expected: str) -> None:
    assert expand(short, previous, separator) == expected


@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ("—", None),
        ("— (required for the relay)", None),
        ("none", None),
        ("1000", 1000),
        ("5 (permanent failures before quarantine)", 5),
        ("7 days", 7 * _DAY_MS),
        ("`info`", "info"),
        ("`PLAINTEXT` (`SSL`, `SASL_PLAINTEXT`, `SASL_SSL`)", "PLAINTEXT"),
        ("random per process", "random per process"),
    ],
)
def test_default_cells_read_as_values(cell: str, expected: object) -> None:
    assert parse_default(cell) == expected
