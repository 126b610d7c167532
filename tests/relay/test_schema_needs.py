"""The relay's required migration (relay/schema.py) is the newest migration its statements
read, as PostgreSQL finds it: every statement prepares after that migration, and one does
not before it. A release whose statements read a newer migration must raise it (and one
that stops reading it may lower it)."""

from __future__ import annotations

from relay import schema
from tests.support.schema_levels import level_read


async def test_the_relays_level_is_the_newest_migration_its_statements_read(
    empty_database_url: str,
) -> None:
    level = await level_read(empty_database_url, "relay")
    # The fetch, the outcome statements, the lanes, housekeeping and redrive.
    assert len(level.prepared) >= 15, level.found
    assert level.migration == schema.STATEMENTS_READ, (
        f"the relay's statements read migration {level.migration:04d}: set relay/schema.py STATEMENTS_READ"
    )
