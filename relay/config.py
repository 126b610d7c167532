"""The relay's configuration: one frozen value built from flags and environment.

The field defaults and ranges here are the relay's only ones: the command line reads them
from these fields for its flags, its help and docs/cli.md's configuration table.
"""

from __future__ import annotations

import re
import ssl
import uuid
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import ConfigError
from contracts.ranges import NotNegative, Positive, PositiveInt4, check_ranges

DEFAULT_TOPIC_TEMPLATE = "outbox.event.{aggregatetype}"
_TEMPLATE_FIELDS = re.compile(r"\{([^{}]*)\}")
# Kafka's topic name rule (as relay.records checks each name): what the template adds
# around {aggregatetype} must keep to it, or no event could ever be published.
_TOPIC_CHARACTERS = re.compile(r"[A-Za-z0-9._-]*")  # fullmatch: "$" would allow a final "\n"
_MAX_TOPIC_LENGTH = 249
_SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})


def new_instance_id() -> str:
    """A random instance name, for a relay started without ``--instance-id``."""
    return f"relay-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class KafkaSecurity:
    """TLS and SASL settings for the producer; the password is never printed."""

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        require_utf8(
            ("--kafka-sasl-username", self.sasl_username),
            ("the SASL password", self.sasl_password),
        )
        if self.protocol not in _SECURITY_PROTOCOLS:
            raise ConfigError(
                f"--kafka-security-protocol must be one of {', '.join(sorted(_SECURITY_PROTOCOLS))}"
            )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ConfigError("--kafka-ssl-keyfile needs --kafka-ssl-certfile, the certificate")
        self.ssl_context()  # files that cannot be loaded are refused now, not at each connect
        if self.protocol.startswith("SASL"):
            if self.sasl_mechanism not in _SASL_MECHANISMS:
                raise ConfigError(
                    f"--kafka-sasl-mechanism must be one of {', '.join(sorted(_SASL_MECHANISMS))}"
                )
            if not self.sasl_username or not self.sasl_password:
                raise ConfigError(
                    "SASL needs --kafka-sasl-username and a password "
                    "(KAFKA_SASL_PASSWORD or --kafka-sasl-password-file)"
                )
            if self.sasl_mechanism == "PLAIN" and not self.tls:
                # PLAIN sends the password itself: without TLS, to anyone on the path.
                raise ConfigError(
                    "--kafka-sasl-mechanism PLAIN sends the password in the clear over "
                    "SASL_PLAINTEXT: use SASL_SSL, or SCRAM-SHA-256/SCRAM-SHA-512"
                )

    @property
    def tls(self) -> bool:
        """True when connections to the brokers use TLS (which always verifies them)."""
        return self.protocol.endswith("SSL")

    def client_options(self) -> dict[str, Any]:
        """The security keywords every aiokafka client of the relay takes (producer, admin)."""
        return {
            "security_protocol": self.protocol,
            "ssl_context": self.ssl_context(),
            "sasl_mechanism": self.sasl_mechanism or "PLAIN",
            "sasl_plain_username": self.sasl_username,
            "sasl_plain_password": self.sasl_password,
        }

    def ssl_context(self) -> ssl.SSLContext | None:
        """A verifying TLS context when the protocol uses TLS."""
        if not self.tls:
            return None
        try:
            context = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"Kafka TLS files could not be loaded ({type(exc).__name__})"
            ) from exc
        return context


@dataclass(frozen=True)
class RelayConfig:
    """Everything the relay loop needs; durations in milliseconds."""

    database_url: str | None = field(repr=False)  # may carry a password
    kafka_bootstrap: str
    kafka_security: KafkaSecurity = field(default_factory=KafkaSecurity)
    topic_template: str = DEFAULT_TOPIC_TEMPLATE
    # A regular expression every topic must match as a whole (the row's own and the
    # template's); a row routed elsewhere is quarantined as topic_not_allowed.
    allowed_topics: str | None = None
    ce_source: str = "urn:outbox-relay"
    instance_id: str = field(default_factory=new_instance_id)
    batch_size: Positive = 1000
    # A fetch transfers at most this many bytes of rows (plus one row): with the batches in
    # flight it bounds the relay's memory whatever the rows hold (docs/relay.md, "Sizes").
    fetch_max_bytes: Positive = 8 * 1024 * 1024
    max_in_flight_batches: Positive = 4
    poll_interval_ms: Positive = 1000
    notify: bool = True
    # Retry delays and the attempt budget are bound as PostgreSQL integers.
    max_attempts: PositiveInt4 = 5
    retry_base_ms: PositiveInt4 = 500
    retry_cap_ms: PositiveInt4 = 60_000
    lease_ttl_ms: Positive = 10_000
    lease_renew_ms: Positive = 2_000
    send_timeout_ms: Positive = 5_000
    # Every statement of the relay's pool ends by then (PostgreSQL's statement_timeout): a
    # fetch that meets it is narrowed to the row that caused it (relay/narrowing.py).
    statement_timeout_ms: PositiveInt4 = 5_000
    receipt_retention_ms: Positive = 7 * 24 * 3600 * 1000
    prune_batch_size: Positive = 5_000
    prune_interval_ms: int = 10_000
    drain_timeout_ms: Positive = 10_000
    blocking_transaction_warn_ms: NotNegative = 30_000
    # The relay hands the producer complete batches (one fetch, split by partition):
    # nothing joins a batch while it lingers, so any linger is pure latency. Batches
    # grow with load instead: a fetch takes every row that is ready, up to --batch-size.
    linger_ms: NotNegative = 0
    compression: str | None = None
    # A direct (session) connection for LISTEN; behind a transaction pooler it is the only
    # way to get NOTIFY wake-ups (relay/wakeups.py, listen_plan).
    listen_database_url: str | None = field(default=None, repr=False)
    transaction_pooler: bool = False

    def __post_init__(self) -> None:
        require_utf8(
            ("--kafka-bootstrap", self.kafka_bootstrap),
            ("--ce-source", self.ce_source),
            ("--instance-id", self.instance_id),
        )
        validate_topic_template(self.topic_template)
        self.allowed_topics_pattern()  # a pattern that does not compile is refused now
        if not self.kafka_bootstrap:
            raise ConfigError("--kafka-bootstrap (KAFKA_BOOTSTRAP_SERVERS) is required")
        validate_bootstrap(self.kafka_bootstrap)
        check_ranges(self)
        if self.retry_cap_ms < self.retry_base_ms:
            raise ConfigError("--retry-cap-ms must be at least --retry-base-ms")
        # A lane is only published while its lease outlives the slowest send by a margin;
        # otherwise a new owner could publish the same key while our batch is in flight.
        if self.lease_renew_ms * 2 + self.send_timeout_ms >= self.lease_ttl_ms:
            raise ConfigError(
                "--lease-ttl-ms must exceed 2 x --lease-renew-ms + --send-timeout-ms "
                f"({self.lease_renew_ms * 2 + self.send_timeout_ms} ms)"
            )
        if self.compression not in (None, "gzip", "snappy", "lz4", "zstd"):
            raise ConfigError("--compression must be one of gzip, snappy, lz4, zstd")

    def allowed_topics_pattern(self) -> re.Pattern[str] | None:
        """``allowed_topics`` compiled (None: every topic is allowed)."""
        if self.allowed_topics is None:
            return None
        try:
            return re.compile(self.allowed_topics)
        except re.error as exc:
            raise ConfigError(f"--allowed-topics is not a regular expression: {exc.msg}") from None


def require_utf8(*settings: tuple[str, str | None]) -> None:
    """Refuse text that is not UTF-8 (argv or environment bytes Python kept as surrogates):
    it is sent to PostgreSQL, to the broker or in every record, and could not be encoded."""
    for name, value in settings:
        if value is not None and not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ConfigError(f"{name} is not UTF-8 text") from None


def validate_bootstrap(servers: str) -> None:
    """``host:port[,host:port…]`` (``[v6]:port`` too), every port 1-65535."""
    for server in servers.split(","):
        host, separator, port = server.strip().rpartition(":")
        if not separator or not host.strip("[]") or not (port.isascii() and port.isdigit()):
            raise ConfigError(
                "--kafka-bootstrap must be host:port[,host:port…], "
                f"got {server.strip() or 'an empty entry'!r}"
            )
        if not 0 < int(port) < 65536:
            raise ConfigError(f"--kafka-bootstrap has a port outside 1-65535: {int(port)}")


def validate_topic_template(template: str) -> None:
    """Only ``{aggregatetype}`` may be substituted into the topic template."""
    fields = _TEMPLATE_FIELDS.findall(template)
    if any(f != "aggregatetype" for f in fields):
        raise ConfigError("--topic-template may only use the field {aggregatetype}")
    if not template.replace("{aggregatetype}", "x").strip():
        raise ConfigError("--topic-template is empty")
    fixed = template.replace("{aggregatetype}", "")
    if not _TOPIC_CHARACTERS.fullmatch(fixed) or len(fixed) >= _MAX_TOPIC_LENGTH:
        raise ConfigError(
            "--topic-template may hold only letters, digits, '.', '_' and '-' around "
            f"{{aggregatetype}}, and fewer than {_MAX_TOPIC_LENGTH} of them"
        )
