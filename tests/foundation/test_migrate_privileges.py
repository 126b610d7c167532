"""``migrate`` touches only its own objects, and says which privilege it lacks before it starts."""

from __future__ import annotations

import secrets
from urllib.parse import quote, urlsplit

import asyncpg
import pytest

from migrations.grants import SCORING_FUNCTIONS_OWNER
from tests.support.cli import (
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
            assert refused.code == 1, refused.output  # docs/cli.md: a failed migration is exit 1
            line = assert_one_clean_error_line(refused, password)
            assert "ownership of table scoring_job_state" in line, line
            assert scoring_owner in line, line  # whose role to run as, or be a member of
            assert SHIPPED[2] in line, line
            # Refused before anything changed: no half-migrated database.
            assert await admin.fetchval("SELECT to_regclass('outbox')") is None
            assert "applying" not in refused.stdout

            # A member of the owning role has the privilege; then it goes through, up to the
            # scoring functions, whose NOLOGIN owner a superuser lets it hand them to.
            await admin.execute(f'GRANT "{scoring_owner}" TO "{migrator}"')
            stopped = await run_cli("migrate", "--database-url", url)
            assert stopped.code == 1, stopped.output
            line = assert_one_clean_error_line(stopped, password)
            assert "0012_scoring_functions.sql" in line, line
            assert f"GRANT {SCORING_FUNCTIONS_OWNER} TO {migrator}" in line, line
            applied_before = SHIPPED.index("0012_scoring_functions.sql")
            assert (
                await admin.fetchval("SELECT count(*) FROM outbox_relay_migration")
                == applied_before
            )

            # The one-time step docs/operations.md gives a superuser, and migrate completes.
            if not await admin.fetchval(
                "SELECT count(*) FROM pg_roles WHERE rolname = $1", SCORING_FUNCTIONS_OWNER
            ):
                await admin.execute(f"CREATE ROLE {SCORING_FUNCTIONS_OWNER} NOLOGIN")
            await admin.execute(f'GRANT {SCORING_FUNCTIONS_OWNER} TO "{migrator}"')
            await admin.execute(f"GRANT CREATE ON SCHEMA public TO {SCORING_FUNCTIONS_OWNER}")
            applied = await run_cli("migrate", "--database-url", url)
            assert applied.code == 0, applied.output
            assert "applied 1 migration(s)" in applied.stdout
            owners = await admin.fetch(
                "SELECT DISTINCT pg_get_userbyid(proowner) AS owner FROM pg_proc"
                " WHERE proname LIKE 'outbox_relay_%' AND prosecdef"
                " AND proname <> 'outbox_relay_writer_routes'"  # 0011's, the schema owner's
            )
            assert [r["owner"] for r in owners] == [SCORING_FUNCTIONS_OWNER]
        finally:
            await admin.close()


async def test_migrate_as_a_role_that_may_not_create_in_the_schema_fails_in_one_line(
    empty_database_url: str,
) -> None:
    # A plain login role (PostgreSQL 15 and later: no CREATE on public). The record of
    # migrations is the first thing migrate creates, before any migration file runs.
    password = secrets.token_hex(12)
    async with login_role(empty_database_url, password) as migrator:
        admin = await asyncpg.connect(empty_database_url)
        try:
            await admin.execute(f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{migrator}"')
            url = with_login(empty_database_url, migrator, quote(password, safe=""))
            refused = await run_cli("migrate", "--database-url", url)
            assert refused.code == 1, refused.output  # docs/cli.md: lacks a privilege → 1
            line = assert_one_clean_error_line(refused, password)
            assert "permission denied for schema public (42501)" in line, line
            assert "schema owner" in line, line  # what to do about it
            assert await admin.fetchval("SELECT to_regclass('outbox_relay_migration')") is None
            # Already migrated by the owner: the role still may not run migrate.
            assert (await run_cli("migrate", "--database-url", empty_database_url)).code == 0
            again = await run_cli("migrate", "--database-url", url)
            assert again.code == 1, again.output
            assert "(42501)" in assert_one_clean_error_line(again, password)
        finally:
            await admin.close()
