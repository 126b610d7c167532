"""A database that was never migrated (or is behind this build) is said so, in one line."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from contracts.errors import SchemaNotMigrated
from migrations.runner import apply, load_migrations, require_migrated, verify
from relay.redrive import RedriveFilter, redrive
from tests.support.cli import MIGRATIONS_DIR, SHIPPED, assert_one_clean_error_line, run_cli


@pytest_asyncio.fixture
async def empty_db(empty_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(empty_database_url)
    yield conn
    await conn.close()


def _first_two(tmp_path: Path) -> Path:
    target = tmp_path / "migrations"
    target.mkdir()
    for name in SHIPPED[:2]:
        shutil.copy(MIGRATIONS_DIR / name, target / name)
    return target


async def test_redrive_on_an_unmigrated_database_says_to_run_migrate(
    empty_database_url: str,
) -> None:
    result = await run_cli("redrive", "--all", "--database-url", empty_database_url)
    assert result.code == 2, result.output
    line = assert_one_clean_error_line(result)
    assert "outbox-relay migrate" in line
    assert result.stdout == ""


async def test_redrive_on_a_database_behind_this_build_says_to_run_migrate(
    empty_database_url: str, tmp_path: Path
) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply(conn, load_migrations(_first_two(tmp_path)))
    finally:
        await conn.close()
    result = await run_cli("redrive", "--all", "--database-url", empty_database_url)
    assert result.code == 2, result.output
    line = assert_one_clean_error_line(result)
    assert "outbox-relay migrate" in line
    assert SHIPPED[2] in line


async def test_require_migrated_refuses_an_empty_database(empty_db: asyncpg.Connection) -> None:
    with pytest.raises(SchemaNotMigrated, match="outbox-relay migrate"):
        await require_migrated(empty_db, load_migrations())
    # Only looked: nothing was created.
    assert await empty_db.fetchval("SELECT to_regclass('outbox_relay_migration')") is None


async def test_require_migrated_names_what_is_pending(
    empty_db: asyncpg.Connection, tmp_path: Path
) -> None:
    await apply(empty_db, load_migrations(_first_two(tmp_path)))
    with pytest.raises(SchemaNotMigrated, match=SHIPPED[2]):
        await require_migrated(empty_db, load_migrations())


_MIGRATION_RECORD = (
    "SELECT version, name, checksum, applied_at FROM outbox_relay_migration ORDER BY version"
)


async def test_require_migrated_accepts_a_migrated_database(db: asyncpg.Connection) -> None:
    shipped = load_migrations()
    before = [tuple(r) for r in await db.fetch(_MIGRATION_RECORD)]
    assert [r[0] for r in before] == [m.version for m in shipped]
    await require_migrated(db, shipped)
    # Only looked: the record is exactly as it was, and verify agrees nothing is pending.
    assert [tuple(r) for r in await db.fetch(_MIGRATION_RECORD)] == before
    status = await verify(db, shipped)
    assert status.up_to_date
    assert status.pending == ()
    assert status.applied == tuple(m.version for m in shipped)


async def test_redrive_itself_raises_the_typed_error_on_an_unmigrated_database(
    empty_db: asyncpg.Connection,
) -> None:
    with pytest.raises(SchemaNotMigrated, match="outbox-relay migrate"):
        await redrive(empty_db, RedriveFilter(everything=True))
