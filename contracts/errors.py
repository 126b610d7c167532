"""The root of the product's error tree, and the errors more than one part raises.

Every exception the product raises on purpose derives from :class:`OutboxRelayError`; each
part's own sit under a root of their own there (``relay.errors.RelayError``,
``health.errors.HealthError``, ``scoring.errors.ScoringWriteError``,
``migrations.grants.GrantError``).
"""

from __future__ import annotations


class OutboxRelayError(Exception):
    """Root of every error this product raises on purpose."""


class ConfigError(OutboxRelayError):
    """Bad flag, environment value, URL or policy: the operator must fix the input (exit 2)."""


class DatabaseUnavailable(OutboxRelayError):
    """PostgreSQL could not be reached or refused us; the message never carries the URL."""


class MigrationError(OutboxRelayError):
    """A migration file set or the database's migration record is inconsistent."""


class SchemaNotMigrated(OutboxRelayError):
    """The database lacks this build's migrations; ``outbox-relay migrate`` fixes it."""
