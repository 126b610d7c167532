"""The package's exceptions; every one derives from :class:`OutboxRelayError`."""

from __future__ import annotations


class OutboxRelayError(Exception):
    """Root of every error this product raises on purpose."""


class ConfigError(OutboxRelayError):
    """Bad flag, environment value, URL or policy: the operator must fix the input (exit 2)."""


class DatabaseUnavailable(OutboxRelayError):
    """PostgreSQL could not be reached or refused us; the message never carries the URL."""


class MigrationError(OutboxRelayError):
    """A migration file set or the database's migration record is inconsistent."""


class BrokerUnavailable(OutboxRelayError):
    """Kafka could not be reached; the message never carries credentials."""


class SchemaNotMigrated(OutboxRelayError):
    """The database lacks this build's migrations; ``outbox-relay migrate`` fixes it."""
