"""Every ``outbox-relay`` flag, declared once, and the settings each verb resolves from them.

:data:`OPTIONS` names, for every flag, the verbs that take it, its environment variable, its
default and its help; the command line is generated from it and ``tests/unit`` holds
docs/cli.md's configuration table to it. How a flag is read (a flag before its variable,
ranges from the settings field it fills) is outbox_relay/flags.py. The relay's defaults are
:class:`~relay.config.RelayConfig`'s own fields, read here rather than written again.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections.abc import Callable
from dataclasses import MISSING, fields
from functools import partial
from typing import Any

from contracts.errors import ConfigError
from contracts.limits import MAX_AGGREGATETYPE_BYTES
from contracts.policy import Policy
from health.config import SidecarConfig
from health.policy import load_policy
from migrations.grants import EVENT_WRITER, WriterRoutes, parse_parts
from outbox_relay.flags import Environ, Integer, Option, Repeated, Switch, Text, dest_of
from outbox_relay.settings import (
    DemoOptions,
    GrantSettings,
    HealthReportSettings,
    LogSettings,
    MigrateSettings,
    RedriveSettings,
    ServiceSettings,
    Settings,
)
from outbox_relay.tracing import tracing_export
from outbox_relay.transport import UnverifiedPath, refusal, unverified_kafka, unverified_postgres
from pgconnect import POOLERS, TRANSACTION_POOLER, check_driver_settings, validate_database_url
from relay.config import KafkaSecurity, RelayConfig, new_instance_id
from relay.records import TOPIC_PREFIX
from relay.redrive import RedriveFilter

MIGRATE, RUN, CHECK, STATUS, REDRIVE, DEMO = "migrate", "run", "check", "status", "redrive", "demo"
GRANT = "grant"

# Each verb and its one-line help, in the order ``outbox-relay --help`` lists them.
VERBS: tuple[tuple[str, str], ...] = (
    (MIGRATE, "apply migrations (idempotent)"),
    (RUN, "relay + health sidecar in one process"),
    (CHECK, "one health evaluation as JSON"),
    (STATUS, "one health evaluation as a table"),
    (REDRIVE, "return quarantined events to the relay"),
    (GRANT, "give a database role exactly what a part needs"),
    (DEMO, "the whole system with a synthetic scoring workload"),
)
EVERY_VERB = frozenset(name for name, _ in VERBS)
RELAY_VERBS = frozenset({RUN, DEMO})
# The verbs that run the health sidecar (run --no-relay included).
SIDECAR_VERBS = frozenset({RUN, DEMO})
HEALTH_VERBS = frozenset({RUN, CHECK, STATUS, DEMO})


def _defaults_of(config_type: type[Any]) -> dict[str, Any]:
    return {f.name: f.default for f in fields(config_type) if f.default is not MISSING}


_RELAY = _defaults_of(RelayConfig)
_SECURITY = _defaults_of(KafkaSecurity)
_SIDECAR = _defaults_of(SidecarConfig)


# The flags of the relay's two help sections, taken by the verbs that run the relay.
_kafka = partial(Text, verbs=RELAY_VERBS, group="kafka")
_relay_text = partial(Text, verbs=RELAY_VERBS, group="relay")
_relay_switch = partial(Switch, verbs=RELAY_VERBS, group="relay")


def _relay_int(flag: str, env: str, help: str) -> Integer:
    """A relay tuning flag whose default and range are RelayConfig's for the field of the
    same name."""
    return Integer(
        flag=flag,
        env=env,
        help=help,
        verbs=RELAY_VERBS,
        group="relay",
        default=_RELAY[dest_of(flag)],
        fills=(RelayConfig, dest_of(flag)),
    )


# -- the declaration ---------------------------------------------------------------------------
DATABASE_URL = Text(
    flag="--database-url",
    env="DATABASE_URL",
    verbs=EVERY_VERB,
    help="postgresql:// URL; without one, libpq PG* variables apply",
)
DATABASE_POOLER = Text(
    flag="--database-pooler",
    env="OUTBOX_RELAY_DATABASE_POOLER",
    choices=POOLERS,
    verbs=EVERY_VERB,
    help="none, or transaction: --database-url reaches PostgreSQL through a transaction "
    "pooler (PgBouncer pool_mode=transaction): no prepared statements, no session state",
)
LISTEN_DATABASE_URL = Text(
    flag="--listen-database-url",
    env="OUTBOX_RELAY_LISTEN_DATABASE_URL",
    verbs=RELAY_VERBS | {MIGRATE},
    default_text="--database-url",
    help="direct postgresql:// URL (no pooler) for the relay's LISTEN connection, and for "
    "migrate behind a transaction pooler",
)
LOG_LEVEL = Text(
    flag="--log-level",
    env="OUTBOX_RELAY_LOG_LEVEL",
    default="info",
    verbs=EVERY_VERB,
    help="debug|info|warning|error",
)
LOG_FORMAT = Text(
    flag="--log-format",
    env="OUTBOX_RELAY_LOG_FORMAT",
    default="json",
    choices=("json", "text"),
    verbs=EVERY_VERB,
    help="one JSON object per line, or text for people",
)
VERIFY = Switch(
    flag="--verify", verbs=frozenset({MIGRATE}), help="only check; exit 1 when something is pending"
)
KAFKA_BOOTSTRAP = _kafka(
    flag="--kafka-bootstrap", env="KAFKA_BOOTSTRAP_SERVERS", help="host:port[,…]"
)
KAFKA_SECURITY_PROTOCOL = _kafka(
    flag="--kafka-security-protocol",
    env="KAFKA_SECURITY_PROTOCOL",
    default=_SECURITY["protocol"],
    help="PLAINTEXT|SSL|SASL_PLAINTEXT|SASL_SSL",
)
KAFKA_SASL_MECHANISM = _kafka(
    flag="--kafka-sasl-mechanism",
    env="KAFKA_SASL_MECHANISM",
    help="PLAIN|SCRAM-SHA-256|SCRAM-SHA-512",
)
KAFKA_SASL_USERNAME = _kafka(
    flag="--kafka-sasl-username", env="KAFKA_SASL_USERNAME", help="SASL user name"
)
KAFKA_SASL_PASSWORD_FILE = _kafka(
    flag="--kafka-sasl-password-file",
    env="KAFKA_SASL_PASSWORD_FILE",
    # Without a file, the password itself may come from this variable.
    fallback_env="KAFKA_SASL_PASSWORD",
    help="file holding the SASL password",
)
KAFKA_SSL_CAFILE = _kafka(
    flag="--kafka-ssl-cafile",
    env="KAFKA_SSL_CAFILE",
    default_text="system CAs",
    help="CA bundle that verifies the brokers",
)
KAFKA_SSL_CERTFILE = _kafka(
    flag="--kafka-ssl-certfile", env="KAFKA_SSL_CERTFILE", help="client certificate"
)
KAFKA_SSL_KEYFILE = _kafka(
    flag="--kafka-ssl-keyfile", env="KAFKA_SSL_KEYFILE", help="client certificate's key"
)
TOPIC_TEMPLATE = _relay_text(
    flag="--topic-template",
    env="OUTBOX_RELAY_TOPIC_TEMPLATE",
    default=_RELAY["topic_template"],
    help="topic of each event; {aggregatetype} is substituted",
)
ALLOWED_TOPICS = _relay_text(
    flag="--allowed-topics",
    env="OUTBOX_RELAY_ALLOWED_TOPICS",
    default_text="every topic",
    help="a regular expression every topic must match whole; a row routed elsewhere is "
    "quarantined as topic_not_allowed",
)
CE_SOURCE = _relay_text(
    flag="--ce-source",
    env="OUTBOX_RELAY_CE_SOURCE",
    default=_RELAY["ce_source"],
    help="CloudEvents source",
)
INSTANCE_ID = _relay_text(
    flag="--instance-id",
    env="OUTBOX_RELAY_INSTANCE_ID",
    default_text="random per process",
    help="stable instance name",
)
NO_NOTIFY = _relay_switch(
    flag="--no-notify",
    env="OUTBOX_RELAY_NO_NOTIFY",
    default_text="NOTIFY on",
    help="poll only, without LISTEN/NOTIFY",
)
COMPRESSION = _relay_text(
    flag="--compression", env="OUTBOX_RELAY_COMPRESSION", help="gzip|snappy|lz4|zstd"
)
RELAY_TUNING: tuple[Integer, ...] = (
    _relay_int("--batch-size", "OUTBOX_RELAY_BATCH_SIZE", "rows claimed per batch"),
    _relay_int(
        "--fetch-max-bytes",
        "OUTBOX_RELAY_FETCH_MAX_BYTES",
        "bytes of rows one fetch transfers, plus one row (bounds the relay's memory)",
    ),
    _relay_int(
        "--max-in-flight-batches", "OUTBOX_RELAY_MAX_IN_FLIGHT_BATCHES", "batches sent at once"
    ),
    _relay_int("--poll-interval-ms", "OUTBOX_RELAY_POLL_INTERVAL_MS", "poll without NOTIFY"),
    _relay_int(
        "--max-attempts", "OUTBOX_RELAY_MAX_ATTEMPTS", "permanent failures before quarantine"
    ),
    _relay_int("--retry-base-ms", "OUTBOX_RELAY_RETRY_BASE_MS", "first retry delay"),
    _relay_int("--retry-cap-ms", "OUTBOX_RELAY_RETRY_CAP_MS", "longest retry delay"),
    _relay_int("--lease-ttl-ms", "OUTBOX_RELAY_LEASE_TTL_MS", "lane lease lifetime"),
    _relay_int("--lease-renew-ms", "OUTBOX_RELAY_LEASE_RENEW_MS", "lane lease renewal"),
    _relay_int("--send-timeout-ms", "OUTBOX_RELAY_SEND_TIMEOUT_MS", "Kafka acknowledgement wait"),
    _relay_int(
        "--statement-timeout-ms",
        "OUTBOX_RELAY_STATEMENT_TIMEOUT_MS",
        "longest any relay statement runs (a fetch that meets it is narrowed to its row)",
    ),
    _relay_int("--prune-batch-size", "OUTBOX_RELAY_PRUNE_BATCH_SIZE", "receipts pruned at once"),
    _relay_int("--drain-timeout-ms", "OUTBOX_RELAY_DRAIN_TIMEOUT_MS", "in-flight wait on shutdown"),
    _relay_int("--linger-ms", "OUTBOX_RELAY_LINGER_MS", "producer batching delay"),
    _relay_int(
        "--blocking-transaction-warn-ms",
        "OUTBOX_RELAY_BLOCKING_TRANSACTION_WARN_MS",
        "log an open outbox writer older than this",
    ),
)
POLICY = Text(
    flag="--policy",
    env="OUTBOX_RELAY_POLICY",
    verbs=HEALTH_VERBS,
    required_because="there are no built-in health bounds",
    help="health policy TOML",
)
RECEIPT_RETENTION = Integer(
    flag="--receipt-retention-ms",
    env="OUTBOX_RELAY_RECEIPT_RETENTION_MS",
    default=_RELAY["receipt_retention_ms"],
    fills=(RelayConfig, "receipt_retention_ms"),
    verbs=HEALTH_VERBS,
    help="how long receipts are kept",
)
LISTEN = Text(
    flag="--listen",
    env="HEALTH_LISTEN_ADDR",
    # PORT alone means that port on all interfaces (the platform convention).
    fallback_env="PORT",
    default="127.0.0.1:8080",
    verbs=RELAY_VERBS,
    help="HOST:PORT of the health sidecar",
)
HTTP_MAX_CONNECTIONS_OPTION = Integer(
    flag="--http-max-connections",
    fills=(SidecarConfig, "http_max_connections"),
    env="OUTBOX_RELAY_HTTP_MAX_CONNECTIONS",
    default=_SIDECAR["http_max_connections"],
    verbs=SIDECAR_VERBS,
    help=(
        "open HTTP connections the health server keeps; beyond it, answered ones still"
        " draining input are closed first, then idle ones"
    ),
)
DATABASE_RETRY_MAX = Integer(
    flag="--database-retry-max-ms",
    fills=(SidecarConfig, "database_retry_max_ms"),
    env="OUTBOX_RELAY_DATABASE_RETRY_MAX_MS",
    default=_SIDECAR["database_retry_max_ms"],
    verbs=SIDECAR_VERBS,
    help="longest wait between the health sidecar's attempts while the database is "
    "unreachable or not migrated",
)
COMPLETION_RECHECK_PERIOD = Integer(
    flag="--completion-recheck-period-ms",
    fills=(SidecarConfig, "completion_recheck_period_ms"),
    env="OUTBOX_RELAY_COMPLETION_RECHECK_PERIOD_MS",
    default=_SIDECAR["completion_recheck_period_ms"],
    verbs=SIDECAR_VERBS,
    help="the running sidecar re-reads its whole completion look-back once per this period "
    "(0: every evaluation)",
)
RUNBOOK_URL = Text(
    flag="--runbook-url",
    env="OUTBOX_RELAY_RUNBOOK_URL",
    default="docs/operations.md",
    verbs=RELAY_VERBS,
    help="where the status page links for each family (#family-<name> is appended)",
)
REQUIRE_VERIFIED_TRANSPORT = Switch(
    flag="--require-verified-transport",
    env="OUTBOX_RELAY_REQUIRE_VERIFIED_TRANSPORT",
    verbs=SIDECAR_VERBS,
    default_text="warn only",
    help="refuse to start when PostgreSQL is reached over TCP without sslmode verify-ca or "
    "verify-full, or Kafka without TLS (a Unix socket and loopback addresses excepted)",
)
REFUSE_OPEN_SCHEMA = Switch(
    flag="--refuse-open-schema",
    env="OUTBOX_RELAY_REFUSE_OPEN_SCHEMA",
    verbs=frozenset({RUN}),
    default_text="warn only",
    help="refuse to start (exit 2) while a role besides the schema's owner, PUBLIC included, "
    "may create objects in the relay's schema",
)
NO_RELAY = Switch(flag="--no-relay", verbs=frozenset({RUN}), help="run the health sidecar alone")
RELAY_ONLY = Switch(
    flag="--relay-only",
    verbs=frozenset({RUN}),
    help="run the relay alone: evaluate no health family and read no database-wide state "
    "(the shape for several relays next to one run --no-relay); no --policy",
)
EVENT_ID = Repeated(flag="--id", verbs=frozenset({REDRIVE}), help="event id (repeatable)")
AGGREGATETYPE = Text(
    flag="--aggregatetype", verbs=frozenset({REDRIVE}), help="events of this aggregate type"
)
EVENT_TYPE = Text(flag="--type", verbs=frozenset({REDRIVE}), help="events of this type")
ERROR_CLASS = Text(
    flag="--error-class", verbs=frozenset({REDRIVE}), help="events quarantined with this class"
)
EVERYTHING = Switch(flag="--all", verbs=frozenset({REDRIVE}), help="every quarantined event")
DRY_RUN = Switch(
    flag="--dry-run",
    verbs=frozenset({REDRIVE}),
    help="only show what would be returned, per cause; change nothing",
)
WATCH = Switch(
    flag="--watch", verbs=frozenset({STATUS}), help="evaluate again and again until Ctrl-C"
)
WATCH_INTERVAL = Integer(
    flag="--interval-ms",
    fills=(HealthReportSettings, "watch_interval_ms"),
    default=2000,
    verbs=frozenset({STATUS}),
    help="time between evaluations with --watch",
)
GRANT_TO = Text(
    flag="--to",
    verbs=frozenset({GRANT}),
    help="existing database role",
)
GRANT_AS = Repeated(
    flag="--as",
    verbs=frozenset({GRANT}),
    help="writer|scoring-worker|event-writer|relay|sidecar: the part the role runs (repeatable)",
)
GRANT_AGGREGATETYPE = Repeated(
    flag="--route-aggregatetype",
    verbs=frozenset({GRANT}),
    help="with --as event-writer: an aggregatetype the role writes, routed by the relay's "
    "template (repeatable)",
)
GRANT_TOPIC_PREFIX = Repeated(
    flag="--route-topic-prefix",
    verbs=frozenset({GRANT}),
    help="with --as event-writer: how the role's own topics start (repeatable)",
)
GRANT_ANY_ROUTE = Switch(
    flag="--any-route",
    verbs=frozenset({GRANT}),
    help="with --as event-writer: the role may route to any topic the relay allows",
)
PRINT_ONLY = Switch(
    flag="--print", verbs=frozenset({GRANT}), help="print the SQL instead of running it"
)
DEMO_JOBS = Integer(
    flag="--jobs",
    fills=(DemoOptions, "jobs"),
    env="OUTBOX_RELAY_DEMO_JOBS",
    default=2000,
    verbs=frozenset({DEMO}),
    help="scoring jobs queued at the start",
)
DEMO_WORKERS = Integer(
    flag="--workers",
    fills=(DemoOptions, "workers"),
    default=4,
    verbs=frozenset({DEMO}),
    help="scoring workers",
)
EXIT_WHEN_DONE = Switch(
    flag="--exit-when-done",
    verbs=frozenset({DEMO}),
    help="stage the three failure stories once, then stop once every job is terminal and "
    "every event published",
)
DEMO_RATE = Integer(
    flag="--rate",
    fills=(DemoOptions, "rate"),
    default=10,
    verbs=frozenset({DEMO}),
    help="jobs the steady workload enqueues per second after the first --jobs",
)
STORY_HOLD = Integer(
    flag="--story-hold-ms",
    fills=(DemoOptions, "story_hold_ms"),
    default=20_000,
    verbs=frozenset({DEMO}),
    help="how long each staged failure stays on show once health reports it",
)

OPTIONS: tuple[Option, ...] = (
    DATABASE_URL,
    DATABASE_POOLER,
    LISTEN_DATABASE_URL,
    LOG_LEVEL,
    LOG_FORMAT,
    VERIFY,
    KAFKA_BOOTSTRAP,
    KAFKA_SECURITY_PROTOCOL,
    KAFKA_SASL_MECHANISM,
    KAFKA_SASL_USERNAME,
    KAFKA_SASL_PASSWORD_FILE,
    KAFKA_SSL_CAFILE,
    KAFKA_SSL_CERTFILE,
    KAFKA_SSL_KEYFILE,
    TOPIC_TEMPLATE,
    ALLOWED_TOPICS,
    CE_SOURCE,
    INSTANCE_ID,
    NO_NOTIFY,
    COMPRESSION,
    *RELAY_TUNING,
    POLICY,
    RECEIPT_RETENTION,
    LISTEN,
    HTTP_MAX_CONNECTIONS_OPTION,
    DATABASE_RETRY_MAX,
    COMPLETION_RECHECK_PERIOD,
    RUNBOOK_URL,
    REQUIRE_VERIFIED_TRANSPORT,
    REFUSE_OPEN_SCHEMA,
    NO_RELAY,
    RELAY_ONLY,
    EVENT_ID,
    AGGREGATETYPE,
    EVENT_TYPE,
    ERROR_CLASS,
    EVERYTHING,
    DRY_RUN,
    WATCH,
    WATCH_INTERVAL,
    GRANT_TO,
    GRANT_AS,
    GRANT_AGGREGATETYPE,
    GRANT_TOPIC_PREFIX,
    GRANT_ANY_ROUTE,
    PRINT_ONLY,
    DEMO_JOBS,
    DEMO_WORKERS,
    EXIT_WHEN_DONE,
    DEMO_RATE,
    STORY_HOLD,
)


def add_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """Add every flag ``verb`` takes, in declaration order, grouped as declared."""
    groups: dict[str, Any] = {}
    for option in OPTIONS:
        if verb not in option.verbs:
            continue
        container: Any = parser
        if option.group is not None:
            if option.group not in groups:
                groups[option.group] = parser.add_argument_group(option.group)
            container = groups[option.group]
        option.add_to(container)


# -- resolution --------------------------------------------------------------------------------
def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` → (host, port)."""
    host, sep, port_text = value.rpartition(":")
    # isascii: str.isdigit also holds for digits int() refuses, such as "²".
    if not sep or not host or not (port_text.isascii() and port_text.isdigit()):
        raise ConfigError(f"--listen must be HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise ConfigError(f"--listen port must be 0-65535, got {port}")
    return host.strip("[]"), port


def listen_address(args: argparse.Namespace, environ: Environ = os.environ) -> str:
    """--listen, else HEALTH_LISTEN_ADDR, else PORT on all interfaces, else 127.0.0.1:8080."""
    explicit = LISTEN.explicit(args, environ)
    if explicit:
        return explicit
    port = LISTEN.fallback(environ)
    return f"0.0.0.0:{port}" if port else LISTEN.required(args, environ)


def resolve_logging(args: argparse.Namespace, environ: Environ = os.environ) -> LogSettings:
    """Log level and format; every verb has them."""
    return LogSettings(
        level=LOG_LEVEL.required(args, environ), format=LOG_FORMAT.required(args, environ)
    )


def resolve(args: argparse.Namespace, environ: Environ = os.environ) -> Settings:
    """The parsed verb's one settings value (reading the policy and password files it names).

    Raises :class:`ConfigError` naming the bad input.
    """
    for option in OPTIONS:
        # A switch's variable is read whether or not this invocation uses it: a value that
        # is wrong is refused, never ignored (run --no-relay and OUTBOX_RELAY_NO_NOTIFY).
        if isinstance(option, Switch) and option.env and args.verb in option.verbs:
            option.value(args, environ)
    resolver: Callable[[argparse.Namespace, Environ], Settings] = _RESOLVERS[args.verb]
    return resolver(args, environ)


def _database_url(args: argparse.Namespace, environ: Environ) -> str | None:
    url = validate_database_url(DATABASE_URL.value(args, environ))
    check_driver_settings(url, environ)
    return url


def _transaction_pooler(args: argparse.Namespace, environ: Environ) -> bool:
    # The flag's choices and the variable's alike are checked by Text.explicit.
    return DATABASE_POOLER.value(args, environ) == TRANSACTION_POOLER


def _listen_database_url(args: argparse.Namespace, environ: Environ) -> str | None:
    url = LISTEN_DATABASE_URL.value(args, environ)
    if url is None:
        return None
    try:
        valid = validate_database_url(url)
        check_driver_settings(valid, environ)
    except ConfigError as exc:  # its message names --database-url
        raise ConfigError(str(exc).replace("--database-url", "--listen-database-url")) from None
    return valid


def _session_database_url(args: argparse.Namespace, environ: Environ) -> str | None:
    """The URL of a verb that needs a session of its own (migrate's advisory lock): behind a
    transaction pooler, the direct one."""
    if not _transaction_pooler(args, environ):
        return _database_url(args, environ)
    direct = _listen_database_url(args, environ)
    if direct is None:
        raise ConfigError(
            "migrate needs a session, which a transaction pooler does not keep: give "
            "--listen-database-url (OUTBOX_RELAY_LISTEN_DATABASE_URL) a direct URL"
        )
    return direct


def _migrate(args: argparse.Namespace, environ: Environ) -> MigrateSettings:
    return MigrateSettings(
        database_url=_session_database_url(args, environ), verify=VERIFY.value(args, environ)
    )


def _redrive(args: argparse.Namespace, environ: Environ) -> RedriveSettings:
    try:
        ids = [uuid.UUID(text) for text in EVENT_ID.values(args)] or None
    except ValueError:
        raise ConfigError("--id must be an event id (a UUID)") from None
    selection = RedriveFilter(
        ids=ids,
        aggregatetype=AGGREGATETYPE.value(args, environ),
        type=EVENT_TYPE.value(args, environ),
        error_class=ERROR_CLASS.value(args, environ),
        everything=EVERYTHING.value(args, environ),
    )
    return RedriveSettings(
        database_url=_database_url(args, environ),
        selection=selection,
        transaction_pooler=_transaction_pooler(args, environ),
        dry_run=DRY_RUN.value(args, environ),
    )


def _grant(args: argparse.Namespace, environ: Environ) -> GrantSettings:
    role = GRANT_TO.value(args, environ)
    if role is None:  # --to has no variable: Text.required would name one
        raise ConfigError("--to is required: the existing role to give privileges to")
    parts = parse_parts(GRANT_AS.values(args))
    return GrantSettings(
        database_url=_database_url(args, environ),
        role=role,
        parts=parts,
        print_only=PRINT_ONLY.value(args, environ),
        transaction_pooler=_transaction_pooler(args, environ),
        routes=_writer_routes(args, environ, parts),
    )


def _writer_routes(
    args: argparse.Namespace, environ: Environ, parts: tuple[str, ...]
) -> WriterRoutes | None:
    """An event writer's routes; None for every route (said with --any-route)."""
    types, prefixes = GRANT_AGGREGATETYPE.values(args), GRANT_TOPIC_PREFIX.values(args)
    any_route = GRANT_ANY_ROUTE.value(args, environ)
    if EVENT_WRITER not in parts:
        if types or prefixes or any_route:
            raise ConfigError(
                "--route-aggregatetype, --route-topic-prefix and --any-route go with --as event-writer"
            )
        return None
    if any_route:
        if types or prefixes:
            raise ConfigError("--any-route takes no --route-aggregatetype or --route-topic-prefix")
        return None
    if not types and not prefixes:
        raise ConfigError(
            "--as event-writer needs the role's routes: --route-aggregatetype (the "
            "aggregatetypes it writes) and/or --route-topic-prefix (how its own topics start), "
            "or --any-route"
        )
    for value in types:
        if not value or len(value.encode()) > MAX_AGGREGATETYPE_BYTES:
            raise ConfigError(f"--aggregatetype must be 1 to {MAX_AGGREGATETYPE_BYTES} bytes")
    for value in prefixes:
        if not TOPIC_PREFIX.fullmatch(value):
            raise ConfigError(
                "--route-topic-prefix must be 1 to 249 of the characters a Kafka topic name takes "
                "(letters, digits, '.', '_', '-')"
            )
    return WriterRoutes(tuple(dict.fromkeys(types)), tuple(dict.fromkeys(prefixes)))


def _health_report(args: argparse.Namespace, environ: Environ) -> HealthReportSettings:
    # Checked even without --watch: a value that is wrong is refused, never ignored.
    interval_ms = WATCH_INTERVAL.value(args, environ) if args.verb == STATUS else None
    return HealthReportSettings(
        policy=load_policy(POLICY.required(args, environ)),
        database_url=_database_url(args, environ),
        receipt_retention_ms=RECEIPT_RETENTION.value(args, environ),
        table=args.verb == STATUS,
        transaction_pooler=_transaction_pooler(args, environ),
        watch_interval_ms=interval_ms
        if args.verb == STATUS and WATCH.value(args, environ)
        else None,
    )


# What a relay-only process evaluates: nothing (its readiness is its relay's).
_NO_FAMILY = Policy(outbox=None, scoring_jobs=None, completion_outbox=None, relay=None)


def _service(args: argparse.Namespace, environ: Environ) -> ServiceSettings:
    listen = parse_listen(listen_address(args, environ))
    sidecar_alone = args.verb == RUN and NO_RELAY.value(args, environ)
    relay_only = args.verb == RUN and RELAY_ONLY.value(args, environ)
    if relay_only and sidecar_alone:
        raise ConfigError("--relay-only and --no-relay exclude each other")
    if relay_only and POLICY.value(args, environ) is not None:
        # Refused, not ignored: the operator would expect the bounds to gate something.
        raise ConfigError(
            "--relay-only evaluates no health family: give --policy (OUTBOX_RELAY_POLICY) "
            "to the sidecar (run --no-relay), not to the relays"
        )
    policy = _NO_FAMILY if relay_only else load_policy(POLICY.required(args, environ))
    # Where the outbox is, how long receipts are kept and whether a pooler is in between:
    # resolved once here, the same values given to the relay's config and the sidecar's.
    database_url = _database_url(args, environ)
    retention = RECEIPT_RETENTION.value(args, environ)
    pooler = _transaction_pooler(args, environ)
    if sidecar_alone:
        # Unused without the relay, but a value that is wrong is refused, never ignored.
        for option in RELAY_TUNING:
            option.value(args, environ)
    demo = None
    if args.verb == DEMO:
        if pooler:
            # It migrates and runs its workload on plain connections: a local tool.
            raise ConfigError(
                "demo connects to PostgreSQL directly: run it without --database-pooler"
            )
        demo = DemoOptions(
            jobs=DEMO_JOBS.value(args, environ),
            workers=DEMO_WORKERS.value(args, environ),
            exit_when_done=EXIT_WHEN_DONE.value(args, environ),
            rate=DEMO_RATE.value(args, environ),
            story_hold_ms=STORY_HOLD.value(args, environ),
        )
    relay = (
        None
        if sidecar_alone
        else relay_config(
            args,
            environ,
            database_url=database_url,
            receipt_retention_ms=retention,
            transaction_pooler=pooler,
        )
    )
    unverified = _unverified_transport(database_url, relay, environ)
    if unverified and REQUIRE_VERIFIED_TRANSPORT.value(args, environ):
        raise ConfigError(refusal(unverified))
    sidecar = SidecarConfig(
        database_url=database_url,
        listen=listen,
        policy=policy,
        receipt_retention_ms=retention,
        transaction_pooler=pooler,
        http_max_connections=HTTP_MAX_CONNECTIONS_OPTION.value(args, environ),
        database_retry_max_ms=DATABASE_RETRY_MAX.value(args, environ),
        completion_recheck_period_ms=COMPLETION_RECHECK_PERIOD.value(args, environ),
        runbook_url=RUNBOOK_URL.required(args, environ),
    )
    return ServiceSettings(
        sidecar=sidecar,
        relay=relay,
        unverified_transport=unverified,
        demo=demo,
        relay_only=relay_only,
        refuse_open_schema=args.verb == RUN and REFUSE_OPEN_SCHEMA.value(args, environ),
        tracing=tracing_export(environ),
    )


def _unverified_transport(
    database_url: str | None, relay: RelayConfig | None, environ: Environ
) -> tuple[UnverifiedPath, ...]:
    """The service's network paths that are not verified by certificate."""
    urls = {"--database-url": database_url}
    if relay is not None and relay.listen_database_url is not None:
        urls["--listen-database-url"] = relay.listen_database_url
    found = [unverified_postgres(urls, environ)]
    if relay is not None:
        found.append(unverified_kafka(relay.kafka_bootstrap, relay.kafka_security))
    return tuple(path for path in found if path is not None)


_RESOLVERS: dict[str, Callable[[argparse.Namespace, Environ], Settings]] = {
    MIGRATE: _migrate,
    REDRIVE: _redrive,
    GRANT: _grant,
    CHECK: _health_report,
    STATUS: _health_report,
    RUN: _service,
    DEMO: _service,
}


def relay_config(
    args: argparse.Namespace,
    environ: Environ,
    *,
    database_url: str | None,
    receipt_retention_ms: int,
    transaction_pooler: bool,
) -> RelayConfig:
    """The relay's configuration around the values it shares with the sidecar, already
    resolved: the database URL, the receipt retention and the pooler."""
    security = KafkaSecurity(
        protocol=KAFKA_SECURITY_PROTOCOL.required(args, environ).upper(),
        sasl_mechanism=KAFKA_SASL_MECHANISM.value(args, environ),
        sasl_username=KAFKA_SASL_USERNAME.value(args, environ),
        sasl_password=_sasl_password(args, environ),
        ssl_cafile=KAFKA_SSL_CAFILE.value(args, environ),
        ssl_certfile=KAFKA_SSL_CERTFILE.value(args, environ),
        ssl_keyfile=KAFKA_SSL_KEYFILE.value(args, environ),
    )
    tuning = {option.dest: option.value(args, environ) for option in RELAY_TUNING}
    return RelayConfig(
        database_url=database_url,
        kafka_bootstrap=KAFKA_BOOTSTRAP.required(args, environ),
        kafka_security=security,
        topic_template=TOPIC_TEMPLATE.required(args, environ),
        allowed_topics=ALLOWED_TOPICS.value(args, environ),
        ce_source=CE_SOURCE.required(args, environ),
        instance_id=INSTANCE_ID.value(args, environ) or new_instance_id(),
        notify=not NO_NOTIFY.value(args, environ),
        compression=COMPRESSION.value(args, environ),
        receipt_retention_ms=receipt_retention_ms,
        listen_database_url=_listen_database_url(args, environ),
        transaction_pooler=transaction_pooler,
        **tuning,
    )


def _sasl_password(args: argparse.Namespace, environ: Environ) -> str | None:
    """Read from the password file when one is named, else from KAFKA_SASL_PASSWORD."""
    path = KAFKA_SASL_PASSWORD_FILE.value(args, environ)
    if not path:
        return KAFKA_SASL_PASSWORD_FILE.fallback(environ)
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError as exc:
        raise ConfigError("--kafka-sasl-password-file could not be read") from exc
    except UnicodeDecodeError:
        raise ConfigError("--kafka-sasl-password-file is not UTF-8 text") from None
