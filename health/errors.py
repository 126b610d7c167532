"""The health package's exceptions; all derive from :class:`HealthError`."""

from __future__ import annotations

from contracts.errors import ConfigError, OutboxRelayError


class HealthError(OutboxRelayError):
    """Root of every error the health package raises on purpose."""


class ProbeFailure(HealthError):
    """A probe could not produce evidence; ``reason`` is safe to show (no driver text, no URL)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ListenError(HealthError, ConfigError):
    """The HTTP listen address could not be bound; the message names the address and cause."""


class HealthSettingError(HealthError, ConfigError):
    """A health setting given by the operator is out of range; the message names it."""
