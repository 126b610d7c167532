"""``outbox-relay``: parse → configure logging → open resources → run → one-line errors.

Every flag also reads an environment variable; flags win. Exit codes: 0 success, 1 a
runtime failure, 2 usage or configuration error (including an unreachable database for
``migrate`` and ``redrive``); ``check`` and ``status`` use 0 within bounds, 2 stalled,
3 unknown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NoReturn

from contracts import __version__
from contracts.errors import ConfigError, DatabaseUnavailable, MigrationError, OutboxRelayError
from health.commands import check, status
from health.policy import load_policy
from migrations.runner import apply, load_migrations, verify
from outbox_relay.logs import configure_logging
from outbox_relay.service import run_service
from pgconnect import connect, describe_target, validate_database_url
from relay.config import DEFAULT_TOPIC_TEMPLATE, KafkaSecurity, RelayConfig
from relay.redrive import RedriveFilter, redrive

log = logging.getLogger("outbox_relay")

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"outbox-relay: error: {message}\n")


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _env_int(name: str, default: int) -> int:
    raw = _env(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer") from None


def default_listen() -> str:
    """HEALTH_LISTEN_ADDR, else PORT on all interfaces, else 127.0.0.1:8080."""
    explicit = _env("HEALTH_LISTEN_ADDR")
    if explicit:
        return explicit
    port = _env("PORT")
    return f"0.0.0.0:{port}" if port else "127.0.0.1:8080"


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (host, port)."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"--listen must be HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise ConfigError(f"--listen port must be 0-65535, got {port}")
    return host.strip("[]"), port


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="postgresql:// URL (DATABASE_URL; libpq PG* variables also work)",
    )
    parser.add_argument(
        "--log-level", default=None, help="debug|info|warning|error (OUTBOX_RELAY_LOG_LEVEL)"
    )
    parser.add_argument(
        "--log-format", default=None, choices=["json", "text"], help="(OUTBOX_RELAY_LOG_FORMAT)"
    )


def _kafka(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("kafka")
    group.add_argument(
        "--kafka-bootstrap", default=None, help="host:port[,…] (KAFKA_BOOTSTRAP_SERVERS)"
    )
    group.add_argument(
        "--kafka-security-protocol",
        default=None,
        help="PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL (KAFKA_SECURITY_PROTOCOL)",
    )
    group.add_argument(
        "--kafka-sasl-mechanism",
        default=None,
        help="PLAIN|SCRAM-SHA-256|SCRAM-SHA-512 (KAFKA_SASL_MECHANISM)",
    )
    group.add_argument("--kafka-sasl-username", default=None, help="(KAFKA_SASL_USERNAME)")
    group.add_argument(
        "--kafka-sasl-password-file",
        default=None,
        help="file holding the SASL password (KAFKA_SASL_PASSWORD_FILE; or KAFKA_SASL_PASSWORD)",
    )
    group.add_argument("--kafka-ssl-cafile", default=None, help="(KAFKA_SSL_CAFILE)")
    group.add_argument("--kafka-ssl-certfile", default=None, help="(KAFKA_SSL_CERTFILE)")
    group.add_argument("--kafka-ssl-keyfile", default=None, help="(KAFKA_SSL_KEYFILE)")


_TUNING: tuple[tuple[str, str, int], ...] = (
    ("batch_size", "OUTBOX_RELAY_BATCH_SIZE", 1000),
    ("max_in_flight_batches", "OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES", 4),
    ("poll_interval_ms", "OUTBOX_RELAY_POLL_INTERVAL_MS", 1000),
    ("max_attempts", "OUTBOX_RELAY_MAX_ATTEMPTS", 5),
    ("retry_base_ms", "OUTBOX_RELAY_RETRY_BASE_MS", 500),
    ("retry_cap_ms", "OUTBOX_RELAY_RETRY_CAP_MS", 60_000),
    ("lease_ttl_ms", "OUTBOX_RELAY_LEASE_TTL_MS", 10_000),
    ("lease_renew_ms", "OUTBOX_RELAY_LEASE_RENEW_MS", 2_000),
    ("send_timeout_ms", "OUTBOX_RELAY_SEND_TIMEOUT_MS", 5_000),
    ("receipt_retention_ms", "OUTBOX_RELAY_RECEIPT_RETENTION_MS", 7 * 24 * 3600 * 1000),
    ("prune_batch_size", "OUTBOX_RELAY_PRUNE_BATCH_SIZE", 5_000),
    ("drain_timeout_ms", "OUTBOX_RELAY_DRAIN_TIMEOUT_MS", 10_000),
    ("linger_ms", "OUTBOX_RELAY_LINGER_MS", 5),
    ("blocking_transaction_warn_ms", "OUTBOX_RELAY_BLOCKING_TRANSACTION_WARN_MS", 30_000),
)


def _relay_flags(parser: argparse.ArgumentParser) -> None:
    _kafka(parser)
    group = parser.add_argument_group("relay")
    group.add_argument(
        "--topic-template",
        default=None,
        help=f"default {DEFAULT_TOPIC_TEMPLATE} (OUTBOX_RELAY_TOPIC_TEMPLATE)",
    )
    group.add_argument(
        "--ce-source", default=None, help="CloudEvents source (OUTBOX_RELAY_CE_SOURCE)"
    )
    group.add_argument(
        "--instance-id",
        default=None,
        help="stable instance name (OUTBOX_RELAY_INSTANCE_ID; default random)",
    )
    group.add_argument(
        "--no-notify",
        action="store_true",
        default=None,
        help="poll only (OUTBOX_RELAY_NO_NOTIFY=1)",
    )
    group.add_argument(
        "--compression", default=None, help="gzip|snappy|lz4|zstd (OUTBOX_RELAY_COMPRESSION)"
    )
    for name, env, default in _TUNING:
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, type=int, default=None, help=f"({env}; default {default})")


def _health_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", default=None, help="health policy TOML (OUTBOX_RELAY_POLICY)")
    if not any(a.dest == "receipt_retention_ms" for a in parser._actions):
        parser.add_argument(
            "--receipt-retention-ms",
            type=int,
            default=None,
            help="how long receipts are kept (OUTBOX_RELAY_RECEIPT_RETENTION_MS)",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="outbox-relay", description="Relay committed outbox rows to Kafka; health sidecar."
    )
    parser.add_argument("--version", action="version", version=f"outbox-relay {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    migrate = verbs.add_parser("migrate", help="apply migrations (idempotent)")
    _common(migrate)
    migrate.add_argument(
        "--verify", action="store_true", help="only check; exit 1 when something is pending"
    )

    run = verbs.add_parser("run", help="relay + health sidecar in one process")
    _common(run)
    _relay_flags(run)
    _health_flags(run)
    run.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT (HEALTH_LISTEN_ADDR, else PORT, else 127.0.0.1:8080)",
    )
    run.add_argument("--no-relay", action="store_true", help="run the health sidecar alone")

    for name, text in (
        ("check", "one health evaluation as JSON"),
        ("status", "one health evaluation as a table"),
    ):
        sub = verbs.add_parser(name, help=text)
        _common(sub)
        _health_flags(sub)

    redrive = verbs.add_parser("redrive", help="return quarantined events to the relay")
    _common(redrive)
    redrive.add_argument("--id", action="append", default=None, help="event id (repeatable)")
    redrive.add_argument("--aggregatetype", default=None)
    redrive.add_argument("--type", default=None)
    redrive.add_argument("--error-class", default=None)
    redrive.add_argument("--all", action="store_true", help="every quarantined event")

    demo = verbs.add_parser("demo", help="the whole system with a synthetic scoring workload")
    _common(demo)
    _relay_flags(demo)
    _health_flags(demo)
    demo.add_argument(
        "--listen",
        default=None,
        help="HOST:PORT (HEALTH_LISTEN_ADDR, else PORT, else 127.0.0.1:8080)",
    )
    demo.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="scoring jobs to run (OUTBOX_RELAY_DEMO_JOBS; default 2000)",
    )
    demo.add_argument("--workers", type=int, default=None, help="scoring workers (default 4)")
    demo.add_argument(
        "--exit-when-done",
        action="store_true",
        help="stop once every job is terminal and every event published",
    )
    return parser


def database_url(args: argparse.Namespace) -> str | None:
    return validate_database_url(args.database_url or _env("DATABASE_URL"))


def relay_config(args: argparse.Namespace) -> RelayConfig:
    """Flags over environment over defaults; raises ConfigError naming the bad input."""
    password = _env("KAFKA_SASL_PASSWORD")
    password_file = args.kafka_sasl_password_file or _env("KAFKA_SASL_PASSWORD_FILE")
    if password_file:
        try:
            with open(password_file, encoding="utf-8") as handle:
                password = handle.read().strip()
        except OSError as exc:
            raise ConfigError("--kafka-sasl-password-file could not be read") from exc
    security = KafkaSecurity(
        protocol=(
            args.kafka_security_protocol
            or _env("KAFKA_SECURITY_PROTOCOL", "PLAINTEXT")
            or "PLAINTEXT"
        ).upper(),
        sasl_mechanism=args.kafka_sasl_mechanism or _env("KAFKA_SASL_MECHANISM"),
        sasl_username=args.kafka_sasl_username or _env("KAFKA_SASL_USERNAME"),
        sasl_password=password,
        ssl_cafile=args.kafka_ssl_cafile or _env("KAFKA_SSL_CAFILE"),
        ssl_certfile=args.kafka_ssl_certfile or _env("KAFKA_SSL_CERTFILE"),
        ssl_keyfile=args.kafka_ssl_keyfile or _env("KAFKA_SSL_KEYFILE"),
    )
    tuning = {}
    for name, env, default in _TUNING:
        flag_value = getattr(args, name, None)
        tuning[name] = flag_value if flag_value is not None else _env_int(env, default)
    no_notify = args.no_notify or _env("OUTBOX_RELAY_NO_NOTIFY") in ("1", "true", "yes")
    return RelayConfig(
        database_url=database_url(args),
        kafka_bootstrap=args.kafka_bootstrap or _env("KAFKA_BOOTSTRAP_SERVERS") or "",
        kafka_security=security,
        topic_template=args.topic_template
        or _env("OUTBOX_RELAY_TOPIC_TEMPLATE", DEFAULT_TOPIC_TEMPLATE)
        or DEFAULT_TOPIC_TEMPLATE,
        ce_source=args.ce_source
        or _env("OUTBOX_RELAY_CE_SOURCE", "urn:outbox-relay")
        or "urn:outbox-relay",
        instance_id=args.instance_id
        or _env("OUTBOX_RELAY_INSTANCE_ID")
        or f"relay-{uuid.uuid4().hex[:12]}",
        notify=not no_notify,
        compression=args.compression or _env("OUTBOX_RELAY_COMPRESSION"),
        **tuning,
    )


def receipt_retention_ms(args: argparse.Namespace) -> int:
    value = getattr(args, "receipt_retention_ms", None)
    if value is not None:
        return int(value)
    return _env_int("OUTBOX_RELAY_RECEIPT_RETENTION_MS", 7 * 24 * 3600 * 1000)


def policy_path(args: argparse.Namespace) -> str:
    path = args.policy or _env("OUTBOX_RELAY_POLICY")
    if not path:
        raise ConfigError(
            "--policy (OUTBOX_RELAY_POLICY) is required: there are no built-in health bounds"
        )
    return path


# -- verbs ---------------------------------------------------------------------------------
async def _migrate(args: argparse.Namespace) -> int:
    url = database_url(args)
    migrations = load_migrations()
    conn = await connect(url)
    try:
        if args.verify:
            status = await verify(conn, migrations)
            if status.up_to_date:
                print(f"migrations up to date ({len(status.applied)} applied)")
                return EXIT_OK
            names = ", ".join(m.file_name for m in status.pending)
            print(f"pending migrations: {names}")
            return EXIT_FAILURE
        applied = await apply(
            conn,
            migrations,
            progress=lambda m: print(f"applying {m.file_name}", flush=True),
        )
        print(
            f"applied {len(applied)} migration(s); database at {describe_target(url)} is up to date"
        )
        return EXIT_OK
    finally:
        await conn.close()


async def _redrive(args: argparse.Namespace) -> int:
    try:
        ids = [uuid.UUID(i) for i in args.id] if args.id else None
    except ValueError:
        raise ConfigError("--id must be an event id (a UUID)") from None
    selection = RedriveFilter(
        ids=ids,
        aggregatetype=args.aggregatetype,
        type=args.type,
        error_class=args.error_class,
        everything=args.all,
    )
    conn = await connect(database_url(args))
    try:
        count = await redrive(conn, selection)
    finally:
        await conn.close()
    print(f"returned {count} quarantined event(s) to the relay")
    return EXIT_OK


async def _health_report(args: argparse.Namespace, *, table: bool) -> int:
    policy = load_policy(policy_path(args))
    command = status if table else check
    text, code = await command(
        database_url(args), policy, receipt_retention_ms=receipt_retention_ms(args)
    )
    print(text)
    return code


async def _run(args: argparse.Namespace, *, demo: bool = False) -> int:
    listen = parse_listen(args.listen or default_listen())
    policy = load_policy(policy_path(args))
    config = None if getattr(args, "no_relay", False) else relay_config(args)
    url = database_url(args)
    # Fail fast when the database cannot be reached at all: the orchestrator restarts us.
    conn = await connect(url)
    await conn.close()
    demo_options = None
    if demo:
        conn = await connect(url)
        try:
            await apply(conn, load_migrations())
        finally:
            await conn.close()
        demo_options = {
            "jobs": args.jobs or _env_int("OUTBOX_RELAY_DEMO_JOBS", 2000),
            "workers": args.workers or 4,
            "exit_when_done": int(args.exit_when_done),
        }
        print(f"status page: http://{listen[0]}:{listen[1]}/  (Ctrl-C stops the demo)", flush=True)
    return await run_service(
        database_url=url,
        relay_config=config,
        policy=policy,
        listen=listen,
        receipt_retention_ms=config.receipt_retention_ms if config else receipt_retention_ms(args),
        demo=demo_options,
    )


_VERBS: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, int]]] = {
    "migrate": _migrate,
    "redrive": _redrive,
    "check": lambda a: _health_report(a, table=False),
    "status": lambda a: _health_report(a, table=True),
    "run": _run,
    "demo": lambda a: _run(a, demo=True),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        configure_logging(
            args.log_level or _env("OUTBOX_RELAY_LOG_LEVEL", "info") or "info",
            args.log_format or _env("OUTBOX_RELAY_LOG_FORMAT", "json") or "json",
        )
    except ValueError:  # logging's "Unknown level" would otherwise escape as a traceback
        return _fail(
            EXIT_USAGE, "--log-level (OUTBOX_RELAY_LOG_LEVEL) must be debug, info, warning or error"
        )
    unknown_exit = 3 if args.verb in ("check", "status") else EXIT_USAGE
    try:
        return asyncio.run(_VERBS[args.verb](args))
    except ConfigError as exc:
        return _fail(EXIT_USAGE, str(exc))
    except DatabaseUnavailable as exc:
        return _fail(unknown_exit, str(exc))
    except MigrationError as exc:
        return _fail(EXIT_FAILURE, str(exc))
    except OutboxRelayError as exc:
        return _fail(EXIT_FAILURE, str(exc))
    except KeyboardInterrupt:
        return 130


def _fail(code: int, message: str) -> int:
    print(f"outbox-relay: error: {message}", file=sys.stderr)
    return code
