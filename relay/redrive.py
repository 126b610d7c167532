"""Returning quarantined events to the relay, by id or by filter; or only saying what would move.

A redrive runs in batches in ``seq`` order, each its own transaction followed by a NOTIFY:
the relay starts on the first batch while later ones are still being returned, a lock is
never held on more than one batch of rows, and ``seq`` order means a key's earlier event is
always returned no later than its later ones (the relay keeps per-key order either way).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from contracts.errors import ConfigError, SchemaNotMigrated
from relay import sql

REDRIVE_BATCH = 1000
"""Events returned per transaction."""

# The filter every statement below shares: $1 ids, $2 aggregatetype, $3 type, $4 error
# class; NULL means "any". Reads outbox_quarantined_idx for the quarantined rows.
_SELECTED = """
    quarantined_at IS NOT NULL
    AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[]))
    AND ($2::text IS NULL OR aggregatetype = $2)
    AND ($3::text IS NULL OR type = $3)
    AND ($4::text IS NULL OR last_error_class = $4)
"""

# What a redrive would move, per cause: events and distinct keys (the keys whose later
# events are held behind them). Aggregates only; nothing is locked or changed.
PREVIEW = f"""
SELECT coalesce(last_error_class, '') AS cause,
       count(*) AS events,
       pg_catalog.count(DISTINCT aggregateid) AS keys
FROM outbox
WHERE {_SELECTED}
GROUP BY 1
ORDER BY 2 DESC, 1
"""

# One batch: the lowest-seq selected rows, skipping none (a row the relay holds locked
# waits, it is never left quarantined behind the caller's back).
REDRIVE_BATCH_SQL = f"""
WITH batch AS (
    SELECT seq FROM outbox
    WHERE {_SELECTED}
    ORDER BY seq
    LIMIT $5
    FOR UPDATE
), redriven AS (
    -- Due at once, but still a waiting row: its key's later rows stay held back until it
    -- is published. Were the hold lifted here, a relay pass whose cursor already stepped
    -- over some of them would read the key's rows after its cursor first.
    UPDATE outbox AS o
    SET quarantined_at = NULL, attempts = 0, next_attempt_at = clock_timestamp(),
        last_error_class = NULL
    FROM batch
    WHERE o.seq = batch.seq
    RETURNING 1
)
SELECT count(*) FROM redriven
"""

_NO_CAUSE = "(no error class)"


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

    def parameters(self) -> tuple[object, ...]:
        """The bound parameters of the shared filter, in order."""
        return (self.ids, self.aggregatetype, self.type, self.error_class)


@dataclass(frozen=True)
class Cause:
    """Quarantined events of one error class that a redrive selects."""

    cause: str
    events: int
    keys: int


Progress = Callable[[int, int], None]
"""Called after each batch with (returned so far, selected at the start)."""


def _schema_errors() -> tuple[type[Exception], ...]:
    return (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError)


def _not_migrated() -> SchemaNotMigrated:
    # The outbox is missing or older than this build: say the fix, not the driver text.
    return SchemaNotMigrated("the outbox table is missing or outdated; run `outbox-relay migrate`")


async def preview(conn: asyncpg.Connection, selection: RedriveFilter) -> list[Cause]:
    """What :func:`redrive` would return, per cause, without changing anything."""
    try:
        rows = await conn.fetch(PREVIEW, *selection.parameters())
    except _schema_errors() as exc:
        raise _not_migrated() from exc
    return [Cause(row["cause"] or _NO_CAUSE, row["events"], row["keys"]) for row in rows]


async def redrive(
    conn: asyncpg.Connection,
    selection: RedriveFilter,
    *,
    batch_size: int = REDRIVE_BATCH,
    progress: Progress | None = None,
) -> int:
    """Clear quarantine, attempts and backoff of the selected events, batch by batch, waking
    the relay after each; returns how many were returned."""
    if batch_size < 1:
        raise ConfigError("the redrive batch size must be positive")
    selected = sum(cause.events for cause in await preview(conn, selection))
    returned = 0
    try:
        while True:
            async with conn.transaction():
                count: int = await conn.fetchval(
                    REDRIVE_BATCH_SQL, *selection.parameters(), batch_size
                )
                if count:
                    await conn.execute(sql.NOTIFY)
            returned += count
            if count and progress is not None:
                progress(returned, max(selected, returned))
            if count < batch_size:
                return returned
    except _schema_errors() as exc:
        raise _not_migrated() from exc
