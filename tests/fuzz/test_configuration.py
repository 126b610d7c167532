"""Fuzzing the configuration: odd values for every declared flag, on the command line or
in its environment variable.

The real CLI runs in-process (parse → logging → resolve), and in place of the verb's work
a stand-in builds what the verb would build from the resolved settings (the relay, the
sidecar) and stops there. Every run either exits 2 (3 for check and status) with one line
on stderr or accepts a configuration the relay can use: no traceback, no value that fails
later at run time. A few known-bad values also go through a real process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import outbox_relay.cli as cli
from health.sidecar import HealthSidecar
from outbox_relay.flags import Integer, Option, Repeated, Switch, Text
from outbox_relay.options import OPTIONS
from outbox_relay.settings import HealthReportSettings, ServiceSettings, Settings
from relay.config import RelayConfig
from relay.engine import Relay
from relay.metrics import RelayMetrics
from relay.records import RecordMapper
from tests.fuzz.profiles import fuzz_settings
from tests.support.cli import REPO, assert_one_clean_error_line, cli_env, run_cli

POLICY = str(REPO / "docs" / "policy.example.toml")
INT4_MAX = 2**31 - 1
# The relay binds these as PostgreSQL integer (int4): a larger value fails every write.
INT4_SETTINGS = frozenset({"retry_base_ms", "retry_cap_ms", "max_attempts"})
# A valid starting point per verb; the fuzzed values are added after it (so they win).
BASE_ARGS = {
    "run": ["--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9", "--listen", "127.0.0.1:0"],
    "check": ["--policy", POLICY],
    "demo": ["--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9", "--listen", "127.0.0.1:0"],
    "migrate": [],
    "redrive": ["--all"],
    "grant": ["--to", "someone", "--as", "relay"],
}
VERBS = sorted(BASE_ARGS)


@dataclass
class Outcome:
    code: int
    stderr: str
    settings: list[Settings] = field(default_factory=list)


async def built_instead_of_run(settings: Settings, seen: list[Settings]) -> int:
    """What the verb constructs from its settings before any I/O; then stop with 0."""
    seen.append(settings)
    if isinstance(settings, ServiceSettings):
        if settings.relay is not None:
            Relay(settings.relay, RelayMetrics.register(CollectorRegistry()))
            RecordMapper(
                topic_template=settings.relay.topic_template, ce_source=settings.relay.ce_source
            )
        HealthSidecar(settings.sidecar, registry=CollectorRegistry())
    return 0


@contextlib.contextmanager
def root_logging_kept() -> Iterator[None]:
    """The CLI configures the root logger for its process; put the test's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:], root.level = handlers, level


def run_in_process(argv: list[str], environ: dict[str, str]) -> Outcome:
    """``outbox-relay ARGV`` with exactly ``environ``: its exit code and stderr."""
    seen: list[Settings] = []
    err = io.StringIO()

    async def stand_in(settings: Settings) -> int:
        return await built_instead_of_run(settings, seen)

    with (
        root_logging_kept(),
        mock.patch.dict(os.environ, environ, clear=True),
        mock.patch.object(cli, "_run_verb", stand_in),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
    ):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's own exit, for usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return Outcome(code, err.getvalue(), seen)


def assert_usable(settings: Settings) -> None:
    """An accepted configuration holds only values the relay and the sidecar can use."""
    relay: RelayConfig | None = None
    url = getattr(settings, "database_url", None)
    if url is not None:
        url.encode()  # sent to PostgreSQL as it is: bytes that are not UTF-8 cannot be
    if isinstance(settings, ServiceSettings):
        relay = settings.relay
        host, port = settings.listen
        assert host and 0 <= port < 65536
        assert settings.receipt_retention_ms > 0
    if isinstance(settings, HealthReportSettings):
        assert settings.receipt_retention_ms > 0
    if relay is None:
        return
    # Some aggregatetype gets a topic name Kafka accepts (its whole rule, end included).
    sample_topic = relay.topic_template.replace("{aggregatetype}", "order")
    assert re.fullmatch(r"[A-Za-z0-9._-]{1,249}", sample_topic), relay.topic_template
    # Sent to PostgreSQL, to the broker or in every record: they must be UTF-8 text.
    for name in ("ce_source", "instance_id", "kafka_bootstrap"):
        getattr(relay, name).encode()
    for secret in (relay.kafka_security.sasl_username, relay.kafka_security.sasl_password):
        if secret is not None:
            secret.encode()
    for f in fields(relay):
        value = getattr(relay, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            assert value >= 0, f.name
            if f.name in INT4_SETTINGS:
                assert value <= INT4_MAX, f.name


# -- odd values --------------------------------------------------------------------------------
# Text a process can receive: no NUL (argv and the environment cannot carry one), and
# bytes that are not UTF-8, which Python hands over as lone surrogates (surrogateescape).
texts = st.text(
    st.one_of(
        st.characters(blacklist_characters="\x00", codec="utf-8"),
        st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
    ),
    max_size=30,
)
numbers = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63, 10**30, -(10**30)]),
).map(str)
odd_numbers = st.one_of(
    numbers,
    st.sampled_from(["", " 7 ", "1e3", "0x10", "1_000", "١٢", "²", "nan", "inf", "9" * 5000]),
    texts,
)
listen_values = st.one_of(
    st.tuples(
        st.sampled_from(
            [
                "127.0.0.1",
                "[::1]",
                "::1",
                "0.0.0.0",  # noqa: S104 - never bound: resolution only
                "",
                "host name",
                "[",
                "é",
            ]
        ),
        st.sampled_from([":", "::", ""]),
        odd_numbers,
    ).map("".join),
    texts,
)
urls = st.one_of(
    st.tuples(
        st.sampled_from(["postgresql://", "postgres://", "http://", "postgresql:/", ""]),
        texts,
        st.sampled_from(["", "@", "@h", ":", ":99999", ":-1", ":x", "/db", "?sslmode=x", "#"]),
    ).map("".join),
    texts,
)
templates = st.one_of(
    st.tuples(
        texts,
        st.sampled_from(["{aggregatetype}", "{", "}", "{x}", "{}", "{{aggregatetype}}"]),
        texts,
    ).map("".join),
    texts,
)


def values_for(option: Option) -> st.SearchStrategy[str]:
    match option.flag:
        case "--listen":
            return listen_values
        case "--database-url":
            return urls
        case "--topic-template":
            return templates
        case "--kafka-bootstrap":
            return st.one_of(st.sampled_from(["", ",", "h:", ":1", "a:b:c", "h:99999"]), texts)
        case "--id":
            return st.one_of(st.uuids().map(str), texts)
    if isinstance(option, Integer):
        return odd_numbers
    if isinstance(option, Text) and option.choices:
        return st.one_of(st.sampled_from(option.choices), texts)
    return texts


@st.composite
def configurations(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    """A verb, its valid base, and odd values for a few of its flags or their variables."""
    verb = draw(st.sampled_from(VERBS))
    argv = [verb, *BASE_ARGS[verb]]
    environ: dict[str, str] = {}
    usable = [o for o in OPTIONS if verb in o.verbs]
    for option in draw(st.lists(st.sampled_from(usable), max_size=4, unique_by=lambda o: o.flag)):
        if isinstance(option, Switch):
            if option.env and draw(st.booleans()):
                environ[option.env] = draw(st.one_of(st.sampled_from(["1", "yes", "0"]), texts))
            else:
                argv.append(option.flag)
            continue
        value = draw(values_for(option))
        variables = [v for v in (option.env, option.fallback_env) if v]
        if variables and draw(st.booleans()) and not isinstance(option, Repeated):
            environ[draw(st.sampled_from(variables))] = value
        else:
            argv.append(f"{option.flag}={value}")
    return argv, environ


def usage_exit(argv: list[str]) -> int:
    """2, or 3 for check and status (monitoring-plugins: invalid arguments are UNKNOWN)."""
    return 3 if argv[:1] in (["check"], ["status"]) else 2


def assert_exit_2_on_one_line_or_usable(outcome: Outcome, argv: list[str]) -> None:
    if outcome.code == 0:
        assert len(outcome.settings) == 1
        assert_usable(outcome.settings[0])
        return
    assert outcome.code == usage_exit(argv), outcome
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    assert lines[0].startswith("outbox-relay: error: "), outcome.stderr
    assert "Traceback" not in outcome.stderr


@fuzz_settings(max_examples=200)
@given(configuration=configurations())
@example(configuration=(["run", *BASE_ARGS["run"], "--listen=127.0.0.1:²"], {}))
@example(configuration=(["run", *BASE_ARGS["run"][:-2]], {"PORT": "²"}))
@example(configuration=(["check", "--policy=no\x85such"], {}))  # a line break in a path
# Bytes that are not UTF-8 (here 0xff): a traceback, or a relay failing at every write.
@example(configuration=(["migrate"], {"DATABASE_URL": "postgresql://u:p\udcff@h/db"}))
@example(configuration=(["run", *BASE_ARGS["run"], "--ce-source=\udcff"], {}))
@example(configuration=(["run", *BASE_ARGS["run"]], {"OUTBOX_RELAY_INSTANCE_ID": "r\udcff"}))
@example(configuration=(["run", *BASE_ARGS["run"], "--retry-cap-ms=3000000000"], {}))
@example(configuration=(["run", *BASE_ARGS["run"], "--max-attempts=9999999999"], {}))
@example(configuration=(["run", *BASE_ARGS["run"], "--topic-template=a b {aggregatetype}"], {}))
# A trailing line break (a value read from a file) passed start-up; every event was quarantined.
@example(configuration=(["run", *BASE_ARGS["run"], "--topic-template=o.{aggregatetype}\n"], {}))
@example(configuration=(["run", *BASE_ARGS["run"]], {"OUTBOX_RELAY_NO_NOTIFY": "TRUE!"}))
@example(configuration=(["check", *BASE_ARGS["check"], "--receipt-retention-ms=-1"], {}))
@example(
    configuration=(
        ["run", *BASE_ARGS["run"], "--no-relay"],
        {"OUTBOX_RELAY_RECEIPT_RETENTION_MS": "0"},
    )
)
def test_configuration_exits_2_on_one_line_or_is_usable(
    configuration: tuple[list[str], dict[str, str]],
) -> None:
    argv, environ = configuration
    assert_exit_2_on_one_line_or_usable(run_in_process(argv, environ), argv)


RUN_WITHOUT_LISTEN = ["run", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9"]
# Where a case was accepted before it was refused, the process must not bind the default port.
RUN_ANY_PORT = [*RUN_WITHOUT_LISTEN, "--listen", "127.0.0.1:0"]


@pytest.mark.parametrize(
    ("argv", "environ"),
    [
        # A few of what the in-process test covers, through a real process: each was a
        # traceback or a configuration accepted only to fail at run time.
        (RUN_WITHOUT_LISTEN, {"PORT": "²"}),
        ([*RUN_WITHOUT_LISTEN, "--retry-cap-ms", "3000000000"], {}),
        ([*RUN_WITHOUT_LISTEN, "--topic-template", "events/{aggregatetype}"], {}),
        (["check", "--policy", POLICY, "--receipt-retention-ms", "0"], {}),
        ([*RUN_WITHOUT_LISTEN, "--ce-source=" + os.fsdecode(b"urn:\xff")], {}),
        # Each of these was accepted, then retried for ever or failed at run time.
        (["run", "--policy", POLICY, "--kafka-bootstrap", "host:abc"], {}),
        (["run", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:99999"], {}),
        (["run", "--policy", POLICY, "--kafka-bootstrap", ","], {}),
        (["run", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9,:9092"], {}),
        ([*RUN_WITHOUT_LISTEN, "--kafka-security-protocol", "SSL"], {"KAFKA_SSL_CAFILE": "/no"}),
        ([*RUN_WITHOUT_LISTEN, "--kafka-security-protocol", "SSL"], {"KAFKA_SSL_CAFILE": POLICY}),
        ([*RUN_WITHOUT_LISTEN, "--kafka-ssl-keyfile", POLICY], {}),
        (RUN_WITHOUT_LISTEN, {"DATABASE_URL": "postgresql://u:pw@127.0.0.1/db?sslmode=bogus"}),
        (["migrate"], {"DATABASE_URL": "postgresql://u:pw@127.0.0.1/db?sslmode=bogus"}),
        (["check", "--policy", POLICY], {"DATABASE_URL": "postgresql://h/db?sslmode=bogus"}),
        (["migrate"], {"DATABASE_URL": "postgresql://h/db?target_session_attrs=bogus"}),
        (["migrate"], {"DATABASE_URL": "postgresql://h/db?sslnegotiation=bogus"}),
        # The PG* variables the driver reads where the URL is silent: `run` retried for ever
        # (a certificate file as a "network error"), `check` blamed the URL.
        (RUN_WITHOUT_LISTEN, {"DATABASE_URL": "postgresql://u@127.0.0.1/db", "PGSSLMODE": "x"}),
        (["check", "--policy", POLICY], {"PGHOST": "127.0.0.1", "PGTARGETSESSIONATTRS": "x"}),
        (["migrate"], {"DATABASE_URL": "postgresql://127.0.0.1/db", "PGSSLNEGOTIATION": "x"}),
        (["check", "--policy", POLICY], {"DATABASE_URL": "postgresql://h/db", "PGPORT": "abc"}),
        (RUN_WITHOUT_LISTEN, {"DATABASE_URL": "postgresql://u@127.0.0.1/db", "PGPORT": "99999"}),
        (
            RUN_WITHOUT_LISTEN,
            {"DATABASE_URL": "postgresql://u@127.0.0.1/db?sslmode=verify-ca&sslrootcert=/no"},
        ),
        (RUN_WITHOUT_LISTEN, {"DATABASE_URL": "postgresql://u@127.0.0.1/db", "PGSSLCERT": "/no"}),
        (
            ["check", "--policy", POLICY],
            {"DATABASE_URL": "postgresql://127.0.0.1/db?sslmode=require", "PGSSLROOTCERT": POLICY},
        ),
        ([*RUN_WITHOUT_LISTEN, "--database-retry-max-ms", "0"], {}),
        ([*RUN_WITHOUT_LISTEN, "--http-max-connections", str(10**20)], {}),
        ([*RUN_WITHOUT_LISTEN, "--no-relay", "--batch-size", "-1"], {}),
        (RUN_WITHOUT_LISTEN, {"OUTBOX_RELAY_LOG_FORMAT": "xml"}),
        (["status", "--policy", POLICY, "--interval-ms", "-5"], {}),
        (["demo", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9", "--jobs", "1e3"], {}),
        (["demo", "--policy", POLICY, "--kafka-bootstrap", "127.0.0.1:9", "--rate", "0"], {}),
        (["redrive", "--type", os.fsdecode(b"\xff"), "--dry-run"], {}),
        (["grant", "--to", os.fsdecode(b"\xff"), "--as", "relay"], {}),
        # Accepted, then every event quarantined: a template ending in a line break.
        ([*RUN_ANY_PORT, "--topic-template", "outbox.event.{aggregatetype}\n"], {}),
        (RUN_ANY_PORT, {"OUTBOX_RELAY_TOPIC_TEMPLATE": "outbox.event.{aggregatetype}\n"}),
        # A switch variable that is neither on nor off was read as off.
        (RUN_ANY_PORT, {"OUTBOX_RELAY_NO_NOTIFY": "TRUE!"}),
        # SASL PLAIN without TLS sends the password in the clear: it was accepted.
        (
            [
                *RUN_ANY_PORT,
                "--kafka-security-protocol=SASL_PLAINTEXT",
                "--kafka-sasl-mechanism=PLAIN",
                "--kafka-sasl-username=relay",
            ],
            {"KAFKA_SASL_PASSWORD": "pw-not-shown"},
        ),
        # Nothing verifies the database's certificate, and the operator asked for it.
        (
            RUN_ANY_PORT,
            {
                "DATABASE_URL": "postgresql://u:pw@db.internal/app",
                "OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT": "yes",
            },
        ),
    ],
)
async def test_bad_configuration_in_a_real_process_exits_2(
    argv: list[str], environ: dict[str, str]
) -> None:
    # Every case is refused before anything listens or connects, so none can hang.
    result = await run_cli(*argv, env=cli_env(**environ), timeout=60)
    assert result.code == usage_exit(argv), result
    assert "Traceback" not in result.output
    assert_one_clean_error_line(result)


async def test_a_kafka_password_file_that_is_not_utf8_exits_2_on_one_line(
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_bytes(b"\xff\xfe")
    argv = [
        *RUN_WITHOUT_LISTEN,
        "--kafka-security-protocol=SASL_SSL",
        "--kafka-sasl-mechanism=PLAIN",
        "--kafka-sasl-username=relay",
        f"--kafka-sasl-password-file={password_file}",
    ]
    result = await run_cli(*argv, env=cli_env(), timeout=60)
    assert result.code == 2, result
    assert "not UTF-8" in assert_one_clean_error_line(result)


async def test_the_largest_attempt_budget_is_named_in_the_message() -> None:
    result = await run_cli(*RUN_WITHOUT_LISTEN, f"--max-attempts={10**16}", env=cli_env())
    assert result.code == 2, result
    assert "at most 2147483647" in assert_one_clean_error_line(result)
