"""The health sidecar's configuration: one frozen value, as the relay's is
:class:`relay.config.RelayConfig`.

The field defaults and ranges here are the sidecar's only ones: the command line reads them
from these fields for its flags (outbox_relay/options.py) and docs/cli.md's configuration
table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contracts.policy import Policy
from contracts.ranges import NotNegative, Positive, check_ranges


@dataclass(frozen=True)
class SidecarConfig:
    """Everything the sidecar runs with; durations in milliseconds."""

    database_url: str | None = field(repr=False)  # may carry a password
    policy: Policy
    listen: tuple[str, int]
    receipt_retention_ms: Positive | None = None
    """How long the relays keep receipts: the completion check's look-back may not exceed
    it (None: not known, and that family is unknown)."""
    transaction_pooler: bool = False
    """Behind a transaction pooler session settings do not stick (pgconnect)."""
    runbook_url: str = ""
    """Where the status page links each family's runbook section."""
    http_max_connections: Positive = 256
    """Open HTTP connections kept; beyond it, answered ones still draining input are closed
    first, then idle ones."""
    database_retry_max_ms: Positive = 30_000
    """The longest wait between attempts while the database is unreachable or not migrated
    (zero would be a retry loop without a pause)."""
    completion_recheck_period_ms: NotNegative = 21_600_000
    """The completion check's rolling re-check overtakes the whole look-back once per this
    period, six hours (docs/health.md, "How the completion check scales", weighs its cost
    against its bound); 0: the whole look-back is read again at every evaluation."""
    http_io_timeout_ms: int = 2_000
    """How long the HTTP server waits on one connection's input or output (no flag)."""

    def __post_init__(self) -> None:
        check_ranges(self)
