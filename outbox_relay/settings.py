"""What each verb runs with: one frozen value per verb, resolved once from flags and environment.

``outbox_relay.options`` builds these; the verbs, the service and the demo only read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts.errors import ConfigError
from contracts.policy import Policy
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


@dataclass(frozen=True)
class GrantSettings:
    """``grant``: where, which role, which parts, and whether only to print the SQL."""

    database_url: str | None = field(repr=False)
    role: str
    parts: tuple[str, ...]
    print_only: bool


@dataclass(frozen=True)
class HealthReportSettings:
    """``check`` and ``status``: one evaluation, as JSON or as a table."""

    database_url: str | None = field(repr=False)
    policy: Policy
    receipt_retention_ms: int
    table: bool

    def __post_init__(self) -> None:
        _check_receipt_retention(self.receipt_retention_ms)


@dataclass(frozen=True)
class DemoOptions:
    """The synthetic scoring workload of ``demo``."""

    jobs: int
    workers: int
    exit_when_done: bool

    def __post_init__(self) -> None:
        # Zero workers would leave every job queued and the demo waiting for ever.
        for flag, value in (("--jobs", self.jobs), ("--workers", self.workers)):
            if value <= 0:
                raise ConfigError(f"{flag} must be a positive integer, got {value}")


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
    demo: DemoOptions | None = None

    def __post_init__(self) -> None:
        _check_receipt_retention(self.receipt_retention_ms)
        relay = self.relay
        if relay is not None and (
            relay.database_url != self.database_url
            or relay.receipt_retention_ms != self.receipt_retention_ms
        ):
            raise ConfigError(
                "the relay and the health sidecar must share the database and the receipt retention"
            )


def _check_receipt_retention(value: int) -> None:
    # The sidecar alone (`run --no-relay`, `check`) has no relay configuration to refuse it.
    if value <= 0:
        raise ConfigError(f"--receipt-retention-ms must be a positive integer, got {value}")


Settings = (
    MigrateSettings | RedriveSettings | GrantSettings | HealthReportSettings | ServiceSettings
)
