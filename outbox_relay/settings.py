"""What each verb runs with: one frozen value per verb, resolved once from flags and environment.

``outbox_relay.options`` builds these; the verbs, the service and the demo only read them.
An integer setting's field declares its range (contracts/ranges.py): the flag that fills
it takes the same values, and the value refuses the rest with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from contracts.errors import ConfigError
from contracts.policy import Policy
from contracts.ranges import Positive, check_ranges
from health.config import SidecarConfig
from migrations.grants import WriterRoutes
from outbox_relay.tracing import TracingExport
from outbox_relay.transport import UnverifiedPath
from relay.config import RelayConfig
from relay.redrive import RedriveFilter


@dataclass(frozen=True)
class LogSettings:
    """Level and format of the process's log lines."""

    level: str
    format: str


@dataclass(frozen=True)
class MigrateSettings:
    """``migrate``: where, and whether only to check."""

    database_url: str | None = field(repr=False)  # may carry a password
    verify: bool


@dataclass(frozen=True)
class RedriveSettings:
    """``redrive``: where, and which quarantined events to return."""

    database_url: str | None = field(repr=False)
    selection: RedriveFilter
    dry_run: bool
    transaction_pooler: bool = False


@dataclass(frozen=True)
class GrantSettings:
    """``grant``: where, which role, which parts, and whether only to print the SQL."""

    database_url: str | None = field(repr=False)
    role: str
    parts: tuple[str, ...]
    print_only: bool
    transaction_pooler: bool = False
    routes: WriterRoutes | None = None  # an event writer's; None: every route


@dataclass(frozen=True)
class HealthReportSettings:
    """``check`` and ``status``: one evaluation, as JSON or as a table."""

    database_url: str | None = field(repr=False)
    policy: Policy
    receipt_retention_ms: Positive
    table: bool
    watch_interval_ms: Positive | None
    """``status --watch``: evaluate again after this long, until interrupted; None: once."""
    transaction_pooler: bool = False

    def __post_init__(self) -> None:
        check_ranges(self, {"watch_interval_ms": "--interval-ms"})


@dataclass(frozen=True)
class DemoOptions:
    """The synthetic scoring workload of ``demo``."""

    jobs: Positive
    workers: Positive
    """Zero would leave every job queued, and the demo waiting."""
    exit_when_done: bool
    rate: Positive = 10
    """Jobs enqueued per second by the steady workload once the first ``jobs`` are queued."""
    story_hold_ms: Positive = 20_000
    """How long each staged failure is left on show once health reports it."""

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class ServiceSettings:
    """``run`` and ``demo``: the relay (unless ``--no-relay``), the sidecar and the demo.

    The database URL, the receipt retention and whether a transaction pooler is in between
    are resolved once, into the sidecar's configuration (the process always runs its
    sidecar); the relay's configuration is built from these same values, so the relay, the
    sidecar and the demo cannot disagree about where the outbox is or how long receipts
    are kept.
    """

    sidecar: SidecarConfig
    relay: RelayConfig | None
    demo: DemoOptions | None = None
    unverified_transport: tuple[UnverifiedPath, ...] = ()
    """The network paths used without verifying the other end (outbox_relay/transport.py)."""
    relay_only: bool = False
    """``run --relay-only``: the relay evaluates no family and reads no database-wide state."""
    refuse_open_schema: bool = False
    """``run --refuse-open-schema``: exit 2, instead of warning, while a role besides the
    schema's owner may create objects in it (outbox_relay/open_schema.py)."""
    tracing: TracingExport | None = None
    """Where the process exports its spans, when the ``OTEL_*`` variables ask for it."""

    @property
    def database_url(self) -> str | None:
        """Where the outbox is (may carry a password)."""
        return self.sidecar.database_url

    @property
    def policy(self) -> Policy:
        """The health policy the sidecar evaluates."""
        return self.sidecar.policy

    @property
    def listen(self) -> tuple[str, int]:
        """The health sidecar's address."""
        return self.sidecar.listen

    @property
    def receipt_retention_ms(self) -> int | None:
        """How long the relay keeps receipts."""
        return self.sidecar.receipt_retention_ms

    @property
    def transaction_pooler(self) -> bool:
        """A transaction pooler is between the process and PostgreSQL."""
        return self.sidecar.transaction_pooler

    @property
    def runbook_url(self) -> str:
        """Where the status page links each family's runbook section."""
        return self.sidecar.runbook_url

    def __post_init__(self) -> None:
        # The sidecar alone (`run --no-relay`) has no relay configuration to refuse it.
        if self.relay_only and (self.relay is None or self.policy.enabled_families()):
            raise ConfigError("a relay-only process runs the relay and evaluates no family")
        # The page links here: an http(s) address or a path, never a script or data URL.
        if urlsplit(self.runbook_url).scheme not in ("", "http", "https"):
            raise ConfigError("--runbook-url must be an http(s) address or a path")
        relay = self.relay
        if relay is not None and (
            relay.database_url != self.database_url
            or relay.receipt_retention_ms != self.receipt_retention_ms
            or relay.transaction_pooler != self.transaction_pooler
        ):
            raise ConfigError(
                "the relay and the health sidecar must share the database, the pooler and the "
                "receipt retention"
            )


Settings = (
    MigrateSettings | RedriveSettings | GrantSettings | HealthReportSettings | ServiceSettings
)
