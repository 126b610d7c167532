"""The sidecar's required migration (health/schema.py) is the newest migration its statements
read, as PostgreSQL finds it: every statement prepares after that migration, and one does
not before it. A release whose statements read a newer migration must raise it (and one
that stops reading it may lower it)."""

from __future__ import annotations

import asyncpg

from health import schema
from tests.support.schema_levels import level_read, statements_of


async def test_the_sidecars_level_is_the_newest_migration_its_statements_read(
    empty_database_url: str,
) -> None:
    statements = statements_of("health")
    conn = await asyncpg.connect(empty_database_url)
    try:
        level, prepared = await level_read(conn, statements)
    finally:
        await conn.close()
    # Each family's probe and the completion check's statements.
    assert len(prepared) >= 6, sorted(statements)
    assert level == schema.STATEMENTS_READ, (
        f"the sidecar's probes read migration {level:04d}: set health/schema.py STATEMENTS_READ"
    )
