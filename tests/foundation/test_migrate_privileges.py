"""``migrate`` touches only its own objects, and says which privilege it lacks before it starts."""

from __future__ import annotations

import hashlib
import secrets
import shutil
from pathlib import Path
from urllib.parse import quote, urlsplit

import asyncpg
import pytest

from contracts.errors import MigrationError
from migrations.runner import apply, load_migrations, require_migrated, verify
from tests.foundation.support import (
    MIGRATIONS_DIR,
    SHIPPED,
    assert_one_clean_error_line,
    login_role,
    run_cli,
    with_login,
)

_INDEX_OF_0003 = "scoring_job_state_active_created_idx"


async def test_migrate_leaves_an_invalid_index_of_another_schema_alone(
    empty_database_url: str,
) -> None:
    conn = await asyncpg.connect(empty_database_url)
    try:
        # Another application's schema, on the search path, holds an invalid index that
        # happens to carry the name of one of ours.
        await conn.execute("CREATE SCHEMA other_app")
        await conn.execute("CREATE TABLE other_app.t (x integer)")
        await conn.execute("INSERT INTO other_app.t VALUES (1), (1)")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                f"CREATE UNIQUE INDEX CONCURRENTLY {_INDEX_OF_0003} ON other_app.t (x)"
            )
        database = urlsplit(empty_database_url).path.lstrip("/")
        await conn.execute(f'ALTER DATABASE "{database}" SET search_path = public, other_app')
    finally:
        await conn.close()

    result = await run_cli("migrate", "--database-url", empty_database_url)
    assert result.code == 0, result.output

    conn = await asyncpg.connect(empty_database_url)
    try:
        rows = await conn.fetch(
            "SELECT n.nspname, i.indisvalid FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relname = $1 ORDER BY n.nspname",
            _INDEX_OF_0003,
        )
    finally:
        await conn.close()
    # Theirs is untouched (still invalid: it is not ours to repair); ours was built.
    assert [(r["nspname"], r["indisvalid"]) for r in rows] == [
        ("other_app", False),
        ("public", True),
    ]


async def test_migrate_without_ownership_of_scoring_job_state_fails_in_one_line_first(
    empty_database_url: str,
) -> None:
    password = secrets.token_hex(12)
    async with (
        login_role(empty_database_url, secrets.token_hex(12)) as scoring_owner,
        login_role(empty_database_url, password) as migrator,
    ):
        admin = await asyncpg.connect(empty_database_url)
        try:
            # The scoring service created and owns its table, as in production.
            await admin.execute((MIGRATIONS_DIR / SHIPPED[1]).read_text())
            await admin.execute(f'ALTER TABLE scoring_job_state OWNER TO "{scoring_owner}"')
            # Everything else migrate needs: create in the schema, and every privilege on
            # the table short of owning it.
            await admin.execute(f'GRANT CREATE ON SCHEMA public TO "{migrator}"')
            await admin.execute(f'GRANT ALL ON TABLE scoring_job_state TO "{migrator}"')

            url = with_login(empty_database_url, migrator, quote(password, safe=""))
            refused = await run_cli("migrate", "--database-url", url)
            assert refused.code == 1, refused.output  # README: a failed migration is exit 1
            line = assert_one_clean_error_line(refused, password)
            assert "ownership of table scoring_job_state" in line, line
            assert scoring_owner in line, line  # whose role to run as, or be a member of
            assert SHIPPED[2] in line, line
            # Refused before anything changed: no half-migrated database.
            assert await admin.fetchval("SELECT to_regclass('outbox')") is None
            assert "applying" not in refused.stdout

            # A member of the owning role has the privilege; then it goes through.
            await admin.execute(f'GRANT "{scoring_owner}" TO "{migrator}"')
            applied = await run_cli("migrate", "--database-url", url)
            assert applied.code == 0, applied.output
            assert "applied 3 migration(s)" in applied.stdout
        finally:
            await admin.close()


# -- 0003 says what it needs ------------------------------------------------------------------
# The note 0003's header comment gained; the file was shipped and applied without it.
OWNERSHIP_NOTE = """--
-- Building an index needs ownership of its table: where the scoring service created
-- scoring_job_state, run migrate as its owner or as a member of the owning role.
-- migrate checks this before it applies anything and names the owner when it is missing.
"""
# The checksum every database migrated before the note recorded for 0003.
EARLIER_0003_CHECKSUM = "7097fb24543e19b2a7ee4921e1a17de0e1fc2e71a870dbb421db319d1ebb53b7"


def _earlier_0003() -> str:
    return (MIGRATIONS_DIR / SHIPPED[2]).read_text().replace(OWNERSHIP_NOTE, "", 1)


def test_0003_documents_the_ownership_it_needs() -> None:
    header = (MIGRATIONS_DIR / SHIPPED[2]).read_text().split("\n\n", 1)[0]
    assert OWNERSHIP_NOTE in header + "\n"
    # Without the note, it is byte for byte the file databases recorded.
    assert hashlib.sha256(_earlier_0003().encode()).hexdigest() == EARLIER_0003_CHECKSUM


async def test_a_database_migrated_before_the_note_stays_up_to_date(
    empty_database_url: str, tmp_path: Path
) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in SHIPPED[:2]:
        shutil.copy(MIGRATIONS_DIR / name, earlier / name)
    (earlier / SHIPPED[2]).write_text(_earlier_0003())
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply(conn, load_migrations(earlier))
        assert (
            await conn.fetchval("SELECT checksum FROM outbox_relay_migration WHERE version = 3")
            == EARLIER_0003_CHECKSUM
        )
        assert (await verify(conn, load_migrations())).up_to_date
        assert await apply(conn, load_migrations()) == []
        await require_migrated(conn, load_migrations())
    finally:
        await conn.close()


async def test_a_statement_change_behind_the_earlier_checksum_is_still_refused(
    empty_database_url: str, tmp_path: Path
) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    for name in SHIPPED[:2]:
        shutil.copy(MIGRATIONS_DIR / name, earlier / name)
    (earlier / SHIPPED[2]).write_text(_earlier_0003())
    edited = tmp_path / "edited"
    shutil.copytree(earlier, edited)
    index_file = edited / SHIPPED[2]
    index_file.write_text(
        (MIGRATIONS_DIR / SHIPPED[2]).read_text().replace("(created_at)", "(updated_at)", 1)
    )
    conn = await asyncpg.connect(empty_database_url)
    try:
        await apply(conn, load_migrations(earlier))
        with pytest.raises(MigrationError, match=r"0003_scoring_job_health_indexes\.sql changed"):
            await verify(conn, load_migrations(edited))
    finally:
        await conn.close()
