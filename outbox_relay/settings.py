"""What each verb runs with: one frozen value per verb, resolved once from flags and environment.

``outbox_relay.options`` builds these; the verbs, the service and the demo only read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from contracts.errors import ConfigError
from contracts.policy import Policy
from health.families.completion_tracker import RECHECK_PERIOD_MS
from health.sidecar import DATABASE_RETRY_MAX_MS, HTTP_MAX_CONNECTIONS
from outbox_relay.transport import UnverifiedPath
from relay.config import MAX_SETTING, RANGES, RelayConfig, check_range
from relay.redrive import RedriveFilter

# The (least, greatest) value of each integer flag these settings hold outside the relay's
# (RelayConfig's are relay.config.RANGES), by flag. The command line declares these flags
# with them (outbox_relay/options.py): a flag and the settings it fills refuse the same
# values with the same words.
FLAG_RANGES: Final[Mapping[str, tuple[int, int]]] = {
    "--interval-ms": (1, MAX_SETTING),
    "--jobs": (1, MAX_SETTING),
    "--workers": (1, MAX_SETTING),  # zero would leave every job queued, the demo waiting
    "--rate": (1, MAX_SETTING),
    "--story-hold-ms": (1, MAX_SETTING),
    "--http-max-connections": (1, MAX_SETTING),
    "--database-retry-max-ms": (1, MAX_SETTING),  # zero: a retry loop without a pause
    "--completion-recheck-period-ms": (0, MAX_SETTING),  # 0: every evaluation
}


def _check_ranges(*settings: tuple[str, int]) -> None:
    for flag, value in settings:
        check_range(flag, value, *FLAG_RANGES[flag])


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


@dataclass(frozen=True)
class HealthReportSettings:
    """``check`` and ``status``: one evaluation, as JSON or as a table."""

    database_url: str | None = field(repr=False)
    policy: Policy
    receipt_retention_ms: int
    table: bool
    watch_interval_ms: int | None
    """``status --watch``: evaluate again after this long, until interrupted; None: once."""
    transaction_pooler: bool = False

    def __post_init__(self) -> None:
        if self.watch_interval_ms is not None:
            _check_ranges(("--interval-ms", self.watch_interval_ms))
        _check_receipt_retention(self.receipt_retention_ms)


@dataclass(frozen=True)
class DemoOptions:
    """The synthetic scoring workload of ``demo``."""

    jobs: int
    workers: int
    exit_when_done: bool
    rate: int = 10
    """Jobs enqueued per second by the steady workload once the first ``jobs`` are queued."""
    story_hold_ms: int = 20_000
    """How long each staged failure is left on show once health reports it."""

    def __post_init__(self) -> None:
        _check_ranges(
            ("--jobs", self.jobs),
            ("--workers", self.workers),
            ("--rate", self.rate),
            ("--story-hold-ms", self.story_hold_ms),
        )


@dataclass(frozen=True)
class SidecarOptions:
    """The health sidecar's own limits (its HTTP server, its database back-off, its
    completion re-check)."""

    http_max_connections: int = HTTP_MAX_CONNECTIONS
    database_retry_max_ms: int = DATABASE_RETRY_MAX_MS
    completion_recheck_period_ms: int = RECHECK_PERIOD_MS

    def __post_init__(self) -> None:
        _check_ranges(
            ("--http-max-connections", self.http_max_connections),
            ("--database-retry-max-ms", self.database_retry_max_ms),
            ("--completion-recheck-period-ms", self.completion_recheck_period_ms),
        )


@dataclass(frozen=True)
class ServiceSettings:
    """``run`` and ``demo``: the relay (unless ``--no-relay``), the sidecar and the demo.

    The database URL and the receipt retention are resolved once and live here; the relay's
    configuration is built from these same values, so the relay, the sidecar and the demo
    cannot disagree about where the outbox is or how long receipts are kept.
    """

    database_url: str | None = field(repr=False)
    listen: tuple[str, int]
    policy: Policy
    receipt_retention_ms: int
    relay: RelayConfig | None
    runbook_url: str
    """Where the status page links each family's runbook section."""
    demo: DemoOptions | None = None
    transaction_pooler: bool = False
    sidecar: SidecarOptions = field(default_factory=SidecarOptions)
    unverified_transport: tuple[UnverifiedPath, ...] = ()
    """The network paths used without verifying the other end (outbox_relay/transport.py)."""
    relay_only: bool = False
    """``run --relay-only``: the relay evaluates no family and reads no database-wide state."""

    def __post_init__(self) -> None:
        _check_receipt_retention(self.receipt_retention_ms)
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
                "the relay and the health sidecar must share the database and the receipt retention"
            )


def _check_receipt_retention(value: int) -> None:
    # The sidecar alone (`run --no-relay`, `check`) has no relay configuration to refuse it.
    check_range("--receipt-retention-ms", value, *RANGES["receipt_retention_ms"])


Settings = (
    MigrateSettings | RedriveSettings | GrantSettings | HealthReportSettings | ServiceSettings
)
