"""``outbox-relay``: parse → configure logging → resolve settings → run the verb → exit code.

Every flag is declared in :mod:`outbox_relay.options`. Exit codes: 0 success, 1 a runtime
failure, 2 usage or configuration error (including an unreachable database for ``migrate``
and ``redrive``, and an unmigrated one for ``redrive``); ``check`` and ``status`` use 0
within bounds, 2 stalled, 3 unknown (a usage or configuration error included);
``status --watch`` runs until Ctrl-C and then exits 130.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import sys
import uuid
from collections.abc import Sequence
from typing import NoReturn

from contracts import __version__
from contracts.errors import (
    ConfigError,
    DatabaseUnavailable,
    OutboxRelayError,
    SchemaNotMigrated,
)
from contracts.unexpected import log_unexpected
from health.commands import check, status
from health.render.table import STATUS_WIDTH
from migrations.excess import read_excess, render_excess
from migrations.grants import (
    apply_plan,
    plan_grants,
    read_facts,
    render_pending,
    render_script,
    schema_creators_warning,
    shown,
)
from migrations.runner import apply, load_migrations, require_migrated, verify
from outbox_relay.logs import configure_logging
from outbox_relay.options import CHECK, STATUS, VERBS, add_options, resolve, resolve_logging
from outbox_relay.runtime import (
    event_loop_factory,
    freeze_startup_heap,
    space_young_collections,
    tune_allocator,
)
from outbox_relay.service import run_service
from outbox_relay.settings import (
    GrantSettings,
    HealthReportSettings,
    LogSettings,
    MigrateSettings,
    RedriveSettings,
    ServiceSettings,
    Settings,
)
from outbox_relay.tracing import start_tracing, stop_tracing
from pgconnect import connect, connection_options, describe_target
from relay.errors import RelayError
from relay.redrive import preview, redrive

log = logging.getLogger("outbox_relay")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3  # check and status: the health could not be evaluated
EXIT_INTERRUPTED = 130
# ANSI: cursor home, clear the screen; the watch redraws in place on a terminal.
_CLEAR = "\x1b[H\x1b[2J"
# The name part of a word that looks like a flag; what follows it may be a secret.
_FLAG_NAME = re.compile(r"--?[A-Za-z0-9][A-Za-z0-9_-]*")
# A value argparse quotes in its message ("invalid choice: 'x'", "invalid int value: 'x'").
_QUOTED_VALUE = re.compile(r"(value|choice): (?P<value>'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")")
# A value shown as typed: a word (a mistyped verb, a number out of form), never a URL.
_PLAIN_WORD = re.compile(r"'[A-Za-z0-9_.+-]{1,64}'")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2 (3 for check and status)."""

    usage_exit = EXIT_USAGE

    def error(self, message: str) -> NoReturn:
        self.exit(self.usage_exit, f"outbox-relay: error: {_without_values(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line, generated from the option declaration."""
    parser = _Parser(
        prog="outbox-relay", description="Relay committed outbox rows to Kafka; health sidecar."
    )
    parser.add_argument("--version", action="version", version=f"outbox-relay {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for name, text in VERBS:
        # No abbreviations: `run --to x` must be refused, not read as --topic-template.
        verb = verbs.add_parser(name, help=text, allow_abbrev=False)
        verb.usage_exit = _usage_exit(name)
        add_options(verb, name)
    return parser


def _usage_exit(verb: str) -> int:
    # check and status follow the monitoring-plugins convention, where invalid arguments
    # are UNKNOWN, as an unreachable database is: a monitor must not read a typo as
    # "something stalled". Every other verb says 2 for both.
    return EXIT_UNKNOWN if verb in (CHECK, STATUS) else EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """Run one verb; returns the process exit code."""
    parser = build_parser()
    args, unrecognized = parser.parse_known_args(argv)
    usage_exit = _usage_exit(args.verb)
    if unrecognized:  # found by the top-level parser, which does not know the verb's code
        return _fail(usage_exit, f"unrecognized arguments: {_named(unrecognized)}")
    try:
        _configure_logging(resolve_logging(args))
        return _run(resolve(args))
    except (ConfigError, DatabaseUnavailable, SchemaNotMigrated) as exc:
        return _fail(usage_exit, str(exc))
    except RelayError as exc:
        # The relay's signals end inside it (relay/errors.py): one that gets here is a
        # defect, and its text may hold a row's content.
        return _died(args.verb, exc)
    except OutboxRelayError as exc:
        return _fail(EXIT_FAILURE, str(exc))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (Exception, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.subgroup(Exception) is None:
            if exc.subgroup(KeyboardInterrupt) is not None:
                return EXIT_INTERRUPTED
            raise
        return _died(args.verb, exc)


def _run(settings: Settings) -> int:
    loop_factory = event_loop_factory() if isinstance(settings, ServiceSettings) else None
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_run_verb(settings))
    except BaseExceptionGroup as group:
        # A task group's failure: a configuration error inside it (else another error of
        # ours) is still its one line.
        ours: BaseException | None = group.subgroup(ConfigError) or group.subgroup(_told)
        while isinstance(ours, BaseExceptionGroup):
            ours = ours.exceptions[0]
        if ours is None:
            raise
        raise ours from None


def _told(exc: BaseException) -> bool:
    """An error whose message is the operator's one line (the relay's signals are not)."""
    return isinstance(exc, OutboxRelayError) and not isinstance(exc, RelayError)


def _died(verb: str, exc: BaseException) -> int:
    """An error nothing expected ends the verb: logged once, by its type and where it was
    raised (the whole traceback at --log-level debug), never its text; exit 1."""
    if not logging.getLogger().handlers:  # it came before logging was configured
        configure_logging()
    log_unexpected(log, "stopped by an unexpected error", exc, verb=verb)
    return EXIT_FAILURE


def _configure_logging(settings: LogSettings) -> None:
    try:
        configure_logging(settings.level, settings.format)
    except ValueError:  # logging's "Unknown level" would otherwise escape as a traceback
        raise ConfigError(
            "--log-level (OUTBOX_RELAY_LOG_LEVEL) must be debug, info, warning or error"
        ) from None


def _without_values(message: str) -> str:
    """argparse's message with a quoted value left out unless it is a plain word: a URL
    given to the wrong flag would carry its password into the message."""

    def shown(match: re.Match[str]) -> str:
        value = match["value"]
        return match[0] if _PLAIN_WORD.fullmatch(value) else f"{match[1]}: (value not shown)"

    return _QUOTED_VALUE.sub(shown, message)


def _named(unrecognized: Sequence[str]) -> str:
    """The unrecognized flags by name; their values, and words that are no flag, only
    counted: a mistyped flag before a URL must not print the URL's password."""
    flags: list[str] = []
    hidden = 0
    for word in unrecognized:
        name = _FLAG_NAME.match(word)
        if name is not None:
            flags.append(name.group())
        if name is None or name.end() < len(word):
            hidden += 1  # a bare word, or "--flag=value": a value either way
    named = " ".join(flags)
    if not hidden:
        return named
    values = f"{hidden} value{'s' if hidden > 1 else ''} not shown"
    return f"{named} ({values})" if named else values


def _shown(text: str) -> str:
    """Text from outside as written, or quoted with escapes when it holds a line break or a
    control character (which a terminal would act on)."""
    return text if text.isprintable() else repr(text)


def _fail(code: int, message: str) -> int:
    print(f"outbox-relay: error: {message}", file=sys.stderr)
    return code


# -- verbs ---------------------------------------------------------------------------------
async def _run_verb(settings: Settings) -> int:
    match settings:
        case MigrateSettings():
            return await _migrate(settings)
        case RedriveSettings():
            return await _redrive(settings)
        case GrantSettings():
            return await _grant(settings)
        case HealthReportSettings():
            return await _health_report(settings)
        case ServiceSettings():
            return await _serve(settings)


async def _migrate(settings: MigrateSettings) -> int:
    migrations = load_migrations()
    conn = await connect(settings.database_url)
    try:
        if settings.verify:
            state = await verify(conn, migrations)
            if state.up_to_date:
                print(f"migrations up to date ({len(state.applied)} applied)")
                return EXIT_OK
            names = ", ".join(m.file_name for m in state.pending)
            print(f"pending migrations: {names}")
            return EXIT_FAILURE
        applied = await apply(
            conn,
            migrations,
            progress=lambda m: print(f"applying {m.file_name}", flush=True),
        )
        target = describe_target(settings.database_url)
        print(f"applied {len(applied)} migration(s); database at {target} is up to date")
        return EXIT_OK
    finally:
        await conn.close()


async def _redrive(settings: RedriveSettings) -> int:
    conn = await connect(
        settings.database_url,
        **connection_options({}, transaction_pooler=settings.transaction_pooler),
    )
    try:
        await require_migrated(conn, load_migrations())
        if settings.dry_run:
            causes = await preview(conn, settings.selection)
            total = sum(cause.events for cause in causes)
            print(f"dry run: would return {total} quarantined event(s) to the relay")
            for cause in causes:
                # Any writer can set a row's last error class: never raw to the terminal.
                print(f"  {_shown(cause.cause)}: {cause.events} event(s) on {cause.keys} key(s)")
            return EXIT_OK
        count = await redrive(conn, settings.selection, progress=_redrive_progress)
    finally:
        await conn.close()
    print(f"returned {count} quarantined event(s) to the relay")
    return EXIT_OK


def _redrive_progress(returned: int, selected: int) -> None:
    # stderr: stdout keeps the one result line a script may read.
    print(f"redrive: returned {returned} of {selected}", file=sys.stderr, flush=True)


async def _grant(settings: GrantSettings) -> int:
    conn = await connect(
        settings.database_url,
        **connection_options({}, transaction_pooler=settings.transaction_pooler),
    )
    try:
        await require_migrated(conn, load_migrations())
        facts = await read_facts(conn, settings.role)
        plan = plan_grants(settings.role, settings.parts, facts, settings.routes)
        if (warning := schema_creators_warning(facts)) is not None:
            # stderr: stdout stays the script (--print) or the result lines.
            print(f"outbox-relay: warning: {warning}", file=sys.stderr)
        if settings.print_only:
            print(render_script(plan))
            return EXIT_OK
        await apply_plan(conn, plan)
        # What PUBLIC, another grantor or a membership still gives the role survives the
        # plan's REVOKE: say so, and where from, rather than claim "exactly".
        excess = render_excess(
            settings.role,
            plan.parts,
            await read_excess(conn, facts.schema, settings.role, plan.parts),
        )
    finally:
        await conn.close()
    parts = ", ".join(plan.parts)
    if not excess:
        print(
            f"role {shown(settings.role)} now holds exactly what {parts} needs "
            "on this database's objects"
        )
    for line in [*excess, *render_pending(plan)]:
        print(line)
    return EXIT_FAILURE if excess else EXIT_OK


async def _health_report(settings: HealthReportSettings) -> int:
    if not settings.table:
        text, code = await check(
            settings.database_url,
            settings.policy,
            receipt_retention_ms=settings.receipt_retention_ms,
            transaction_pooler=settings.transaction_pooler,
        )
        print(text)
        return code
    terminal = sys.stdout.isatty()
    # Colour only for a person at a terminal, and never against https://no-color.org.
    colour = terminal and not os.environ.get("NO_COLOR")
    while True:
        text, code = await status(
            settings.database_url,
            settings.policy,
            receipt_retention_ms=settings.receipt_retention_ms,
            transaction_pooler=settings.transaction_pooler,
            colour=colour,
            # Asked each time: the terminal may have been resized since (COLUMNS wins; 80
            # when stdout is no terminal).
            width=shutil.get_terminal_size((STATUS_WIDTH, 24)).columns,
        )
        if settings.watch_interval_ms is None:
            print(text)
            return code
        # On a terminal the table is redrawn in place; a pipe or file gets one block per
        # evaluation, separated by a blank line, so it stays readable as a log.
        print(f"{_CLEAR}{text}" if terminal else f"{text}\n", flush=True)
        await asyncio.sleep(settings.watch_interval_ms / 1000)


async def _serve(settings: ServiceSettings) -> int:
    # `run` starts without the database: the sidecar serves `unknown` and the relay waits
    # for it with capped back-off, so an orchestrator sees a live process that says what is
    # wrong instead of a crash loop. Only the demo needs the database first, to migrate it.
    if settings.demo is not None:
        conn = await connect(settings.database_url)
        try:
            await apply(conn, load_migrations())
        finally:
            await conn.close()
        host, port = settings.listen
        print(f"status page: http://{host}:{port}/  (Ctrl-C stops the demo)", flush=True)
    # Once per process, for the long-running verb only (outbox_relay/runtime.py).
    tune_allocator()
    provider = None
    if settings.tracing is not None:
        instance = settings.relay.instance_id if settings.relay else str(uuid.uuid4())
        provider = start_tracing(instance)
        log.info(
            "exporting spans with OTLP over HTTP", extra={"endpoint": settings.tracing.endpoint}
        )
    freeze_startup_heap()
    space_young_collections()
    try:
        return await run_service(settings)
    finally:
        if provider is not None:
            await asyncio.to_thread(stop_tracing, provider)
