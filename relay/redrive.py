"""Returning quarantined events to the relay, by id or by filter."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from contracts.errors import ConfigError, SchemaNotMigrated
from relay import sql


@dataclass(frozen=True)
class RedriveFilter:
    """Which quarantined events to return; at least one criterion or ``everything``."""

    ids: list[uuid.UUID] | None = None
    aggregatetype: str | None = None
    type: str | None = None
    error_class: str | None = None
    everything: bool = False

    def __post_init__(self) -> None:
        narrowed = any((self.ids, self.aggregatetype, self.type, self.error_class))
        if not narrowed and not self.everything:
            raise ConfigError("redrive needs --id, --aggregatetype, --type, --error-class or --all")


async def redrive(conn: asyncpg.Connection, selection: RedriveFilter) -> int:
    """Clear quarantine, attempts and backoff of the selected events and wake the relay."""
    try:
        async with conn.transaction():
            count: int = await conn.fetchval(
                sql.REDRIVE,
                selection.ids,
                selection.aggregatetype,
                selection.type,
                selection.error_class,
            )
            if count:
                await conn.execute(sql.NOTIFY)
    except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as exc:
        # The outbox is missing or older than this build: say the fix, not the driver text.
        raise SchemaNotMigrated(
            "the outbox table is missing or outdated; run `outbox-relay migrate`"
        ) from exc
    return count
