"""Databases at an older migration level: rows stored before a migration, then the rest."""

from __future__ import annotations

import asyncpg

from migrations.runner import apply, load_migrations

BEFORE_THE_DOOR = 8
"""The last migration before rows were measured and checked at INSERT (0009)."""


async def migrate_up_to(conn: asyncpg.Connection, version: int) -> None:
    """Apply the shipped migrations up to ``version``, and no further."""
    await apply(conn, [m for m in load_migrations() if m.version <= version])


async def migrate_the_rest(conn: asyncpg.Connection) -> None:
    """Apply every shipped migration not applied yet."""
    await apply(conn, load_migrations())
