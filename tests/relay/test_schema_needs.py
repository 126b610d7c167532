"""The relay's required migration (relay/schema.py) is the newest migration its statements
read, as PostgreSQL finds it: every statement prepares after that migration, and one does
not before it. A release whose statements read a newer migration must raise it (and one
that stops reading it may lower it)."""

from __future__ import annotations

import asyncpg

from relay import schema
from tests.support.schema_levels import level_read, statements_of


async def test_the_relays_level_is_the_newest_migration_its_statements_read(
    empty_database_url: str,
) -> None:
    statements = statements_of("relay")
    conn = await asyncpg.connect(empty_database_url)
    try:
        level, prepared = await level_read(conn, statements)
    finally:
        await conn.close()
    # The fetch, the outcome statements, the lanes, housekeeping and redrive.
    assert len(prepared) >= 15, sorted(statements)
    assert level == schema.STATEMENTS_READ, (
        f"the relay's statements read migration {level:04d}: set relay/schema.py STATEMENTS_READ"
    )
