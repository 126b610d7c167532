"""The migration runner against a real PostgreSQL: order, checksums, refusals, concurrency."""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from contracts.errors import MigrationError
from migrations.runner import (
    MIGRATION_LOCK_KEY,
    Migration,
    apply,
    load_migrations,
    split_statements,
    verify,
)
from tests.support.cli import MIGRATIONS_DIR, SHIPPED, run_cli

VERSIONS = [int(name[:4]) for name in SHIPPED]
HEALTH_INDEXES = (
    "scoring_job_state_active_created_idx",
    "scoring_job_state_quarantined_created_idx",
    "scoring_job_state_leased_expiry_idx",
    "scoring_job_state_terminal_updated_idx",
    "scoring_job_state_claimable_idx",
)


@pytest_asyncio.fixture
async def empty_db(empty_database_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(empty_database_url)
    yield conn
    await conn.close()


@pytest.fixture
def migration_dir(tmp_path: Path) -> Path:
    """A private copy of the shipped migrations that a test may edit."""
    target = tmp_path / "migrations"
    target.mkdir()
    for name in SHIPPED:
        shutil.copy(MIGRATIONS_DIR / name, target / name)
    return target


async def _record(conn: asyncpg.Connection) -> list[tuple[int, str, str]]:
    rows = await conn.fetch(
        "SELECT version, name, checksum FROM outbox_relay_migration ORDER BY applied_at, version"
    )
    return [(r["version"], r["name"], r["checksum"]) for r in rows]


# -- loading ----------------------------------------------------------------------------------
def test_shipped_files_load_in_numeric_order_with_sha256_checksums() -> None:
    loaded = load_migrations()
    assert [m.file_name for m in loaded] == list(SHIPPED)
    assert [m.version for m in loaded] == VERSIONS
    for migration in loaded:
        raw = (MIGRATIONS_DIR / migration.file_name).read_bytes()
        assert migration.checksum == hashlib.sha256(raw).hexdigest()
    # Only the files that build indexes CONCURRENTLY (or validate a constraint without
    # blocking writers) run outside a transaction.
    assert [m.file_name for m in loaded if not m.transactional] == [
        SHIPPED[2],
        SHIPPED[6],
        SHIPPED[7],
        SHIPPED[9],
    ]


def test_loading_from_a_directory_sorts_by_prefix_not_by_creation(tmp_path: Path) -> None:
    for name in ("0010_late.sql", "0002_b.sql", "0001_a.sql"):
        (tmp_path / name).write_text("SELECT 1;\n")
    (tmp_path / "README.md").write_text("not a migration")
    assert [m.file_name for m in load_migrations(tmp_path)] == [
        "0001_a.sql",
        "0002_b.sql",
        "0010_late.sql",
    ]


def test_duplicate_numeric_prefix_is_refused_naming_both_files(tmp_path: Path) -> None:
    (tmp_path / "0001_first.sql").write_text("SELECT 1;")
    (tmp_path / "0001_second.sql").write_text("SELECT 2;")
    with pytest.raises(MigrationError) as caught:
        load_migrations(tmp_path)
    message = str(caught.value)
    assert "0001_first.sql" in message
    assert "0001_second.sql" in message


@pytest.mark.parametrize(
    "name", ["1_short.sql", "0001-dash.sql", "0001_Upper.sql", "00001_five.sql", "0001_.sql"]
)
def test_badly_named_file_is_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=re.escape(name)):
        load_migrations(tmp_path)


# -- split_statements -------------------------------------------------------------------------
def test_split_on_top_level_semicolons() -> None:
    assert split_statements("SELECT 1; SELECT 2;\n\nSELECT 3") == [
        "SELECT 1",
        "SELECT 2",
        "SELECT 3",
    ]


def test_split_keeps_semicolons_inside_quotes_and_doubled_quotes() -> None:
    sql = "COMMENT ON TABLE t IS 'a;b';\nSELECT 'it''s; fine', 'x';"
    assert split_statements(sql) == ["COMMENT ON TABLE t IS 'a;b'", "SELECT 'it''s; fine', 'x'"]


def test_split_ignores_semicolons_and_quotes_in_line_comments() -> None:
    sql = "-- migrate: no-transaction\n-- don't split; here\nSELECT 1; -- trailing; note\nSELECT 2;"
    assert split_statements(sql) == ["SELECT 1", "SELECT 2"]


def test_split_keeps_comment_markers_inside_quotes() -> None:
    assert split_statements("SELECT '--; not a comment'; SELECT 2") == [
        "SELECT '--; not a comment'",
        "SELECT 2",
    ]


def test_split_drops_empty_statements() -> None:
    assert split_statements(";;\n -- only a comment\n;") == []


def test_split_keeps_escaped_quotes_of_escape_strings_whole() -> None:
    # In E'...' a backslash escapes the quote; in a plain string it is an ordinary character.
    sql = "SELECT E'it\\'s; fine'; SELECT e'\\\\'; SELECT 'a\\'; SELECT 2"
    assert split_statements(sql) == [
        "SELECT E'it\\'s; fine'",
        "SELECT e'\\\\'",
        "SELECT 'a\\'",
        "SELECT 2",
    ]


def test_an_identifier_ending_in_e_does_not_start_an_escape_string() -> None:
    # time'...' is a typed literal: a plain string after a word that happens to end in e.
    sql = "SELECT time'04:05\\'; SELECT 2"
    assert split_statements(sql) == ["SELECT time'04:05\\'", "SELECT 2"]


def test_split_skips_nested_block_comments_whole() -> None:
    sql = "/* outer /* inner; */ still a comment; 'x */ SELECT 1; SELECT /* a /* b */ ; */ 2;"
    assert split_statements(sql) == ["SELECT 1", "SELECT   2"]


def test_a_dollar_inside_an_identifier_does_not_open_a_dollar_quote() -> None:
    assert split_statements("SELECT 1 AS a$b$; SELECT 2; SELECT $b$;$b$") == [
        "SELECT 1 AS a$b$",
        "SELECT 2",
        "SELECT $b$;$b$",
    ]


async def test_a_no_transaction_file_with_escape_strings_and_nested_comments_applies(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    (migration_dir / "0900_splitter_cases.sql").write_text(
        "-- migrate: no-transaction\n"
        "/* a comment /* nested; */ that goes on; */\n"
        "COMMENT ON TABLE outbox IS E'the relay\\'s; outbox';\n"
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_splitter_idx ON outbox (type);\n"
    )
    applied = await apply(empty_db, load_migrations(migration_dir))
    assert applied[-1].file_name == "0900_splitter_cases.sql"
    assert (
        await empty_db.fetchval("SELECT obj_description('outbox'::regclass, 'pg_class')")
        == "the relay's; outbox"
    )
    assert await empty_db.fetchval("SELECT to_regclass('outbox_splitter_idx') IS NOT NULL")


def test_split_of_the_shipped_index_file_is_five_concurrent_index_builds() -> None:
    statements = split_statements((MIGRATIONS_DIR / SHIPPED[2]).read_text())
    assert len(statements) == len(HEALTH_INDEXES)
    for statement, index in zip(statements, HEALTH_INDEXES, strict=True):
        assert statement.startswith("CREATE INDEX CONCURRENTLY IF NOT EXISTS " + index)


# -- applying ---------------------------------------------------------------------------------
async def test_apply_on_empty_database_applies_every_file_in_order(
    empty_db: asyncpg.Connection,
) -> None:
    migrations = load_migrations()
    seen: list[str] = []
    applied = await apply(empty_db, migrations, progress=lambda m: seen.append(m.file_name))
    assert [m.file_name for m in applied] == list(SHIPPED)
    assert seen == list(SHIPPED)
    assert await _record(empty_db) == [(m.version, m.name, m.checksum) for m in migrations]
    for table in ("outbox", "outbox_receipt", "relay_lane", "relay_instance", "scoring_job_state"):
        assert await empty_db.fetchval("SELECT to_regclass($1) IS NOT NULL", table), table
    assert await empty_db.fetchval("SELECT count(*) FROM relay_lane") == 64
    # The advisory lock is released afterwards.
    assert (
        await empty_db.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        == 0
    )


async def test_second_apply_is_a_no_op(empty_db: asyncpg.Connection) -> None:
    migrations = load_migrations()
    await apply(empty_db, migrations)
    before = await empty_db.fetch("SELECT version, applied_at FROM outbox_relay_migration")
    assert await apply(empty_db, migrations) == []
    after = await empty_db.fetch("SELECT version, applied_at FROM outbox_relay_migration")
    assert sorted(map(tuple, after)) == sorted(map(tuple, before))


async def test_verify_reports_pending_then_up_to_date(empty_db: asyncpg.Connection) -> None:
    migrations = load_migrations()
    status = await verify(empty_db, migrations)
    assert not status.up_to_date
    assert status.applied == ()
    assert [m.file_name for m in status.pending] == list(SHIPPED)
    # verify changes nothing, not even the record table.
    assert await empty_db.fetchval("SELECT to_regclass('outbox_relay_migration')") is None
    await apply(empty_db, migrations)
    status = await verify(empty_db, migrations)
    assert status.up_to_date
    assert status.applied == tuple(VERSIONS)


async def test_a_changed_applied_file_is_refused_naming_it(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    await apply(empty_db, load_migrations(migration_dir))
    edited = migration_dir / "0002_scoring_job_state.sql"
    edited.write_text(edited.read_text() + "\n-- an innocent-looking edit\n")
    changed = load_migrations(migration_dir)
    with pytest.raises(MigrationError, match=r"0002_scoring_job_state\.sql changed"):
        await apply(empty_db, changed)
    with pytest.raises(MigrationError, match=r"0002_scoring_job_state\.sql"):
        await verify(empty_db, changed)
    # A refused run releases the lock, so the next (fixed) run is not blocked.
    assert await empty_db.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY)
    await empty_db.fetchval("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def test_a_new_file_is_applied_after_the_shipped_ones(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    await apply(empty_db, load_migrations(migration_dir))
    (migration_dir / "0900_extra.sql").write_text("CREATE TABLE extra_table (x int);\n")
    applied = await apply(empty_db, load_migrations(migration_dir))
    assert [m.file_name for m in applied] == ["0900_extra.sql"]
    assert [v for v, _, _ in await _record(empty_db)] == [*VERSIONS, 900]


async def test_a_migration_the_files_do_not_know_is_refused(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    await apply(empty_db, load_migrations(migration_dir))
    (migration_dir / SHIPPED[2]).unlink()
    older_build = load_migrations(migration_dir)
    with pytest.raises(MigrationError, match="0003_scoring_job_health_indexes"):
        await apply(empty_db, older_build)
    with pytest.raises(MigrationError, match="does not ship"):
        await verify(empty_db, older_build)


async def test_a_failing_transactional_migration_leaves_nothing_behind(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    await apply(empty_db, load_migrations(migration_dir))
    (migration_dir / "0900_broken.sql").write_text(
        "CREATE TABLE half_done (x int);\nSELECT 1 / 0;\n"
    )
    with pytest.raises(MigrationError, match=r"0900_broken\.sql failed: 22012"):
        await apply(empty_db, load_migrations(migration_dir))
    assert await empty_db.fetchval("SELECT to_regclass('half_done')") is None
    assert [v for v, _, _ in await _record(empty_db)] == VERSIONS


async def test_apply_gives_up_while_another_run_holds_the_lock(
    empty_database_url: str, empty_db: asyncpg.Connection
) -> None:
    holder = await asyncpg.connect(empty_database_url)
    try:
        assert await holder.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATION_LOCK_KEY)
        with pytest.raises(MigrationError, match="holds the migration lock"):
            await apply(empty_db, load_migrations(), lock_timeout=0.5)
        assert await empty_db.fetchval("SELECT to_regclass('outbox')") is None
    finally:
        await holder.close()
    assert len(await apply(empty_db, load_migrations())) == len(SHIPPED)


async def test_the_writer_guard_gives_up_quickly_behind_an_open_writer(
    empty_database_url: str, empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    # Creating a trigger waits for open writers, and new writers queue behind it: the
    # migration must give up within its lock_timeout instead of holding them up.
    guard = migration_dir / SHIPPED[5]
    guard_sql = guard.read_text()
    for later in SHIPPED[5:]:  # the guard is the newest migration here
        (migration_dir / later).unlink()
    await apply(empty_db, load_migrations(migration_dir))
    guard.write_text(guard_sql)
    open_writer = await asyncpg.connect(empty_database_url)
    queued_writer = await asyncpg.connect(empty_database_url)
    insert = "INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', $1, 't')"
    try:
        transaction = open_writer.transaction()
        await transaction.start()
        await open_writer.execute(insert, "open")
        loop = asyncio.get_running_loop()
        started = loop.time()
        migrating = asyncio.create_task(apply(empty_db, load_migrations(migration_dir)))
        await asyncio.sleep(0.5)  # the migration now waits for the lock
        await queued_writer.execute(insert, "queued")  # waits behind it, for a while only
        with pytest.raises(MigrationError, match="55P03"):
            await migrating
        assert loop.time() - started < 10
        assert [v for v, _, _ in await _record(empty_db)] == VERSIONS[:5]
        await transaction.commit()
    finally:
        await open_writer.close()
        await queued_writer.close()
    applied = await apply(empty_db, load_migrations(migration_dir))
    assert [m.file_name for m in applied] == [SHIPPED[5]]
    assert await empty_db.fetchval("SELECT count(*) FROM outbox") == 2


async def test_an_invalid_leftover_index_from_an_interrupted_build_is_rebuilt(
    empty_db: asyncpg.Connection, migration_dir: Path
) -> None:
    index_file = migration_dir / SHIPPED[2]
    index_sql = index_file.read_text()
    index_file.unlink()
    await apply(empty_db, load_migrations(migration_dir))
    # A failed CREATE INDEX CONCURRENTLY leaves an INVALID index behind under the name the
    # migration uses; IF NOT EXISTS alone would keep it forever.
    for ref in ("job-a", "job-b"):
        await empty_db.execute(
            "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,"
            " max_attempts) VALUES ($1, 'req-same', 'queued', 3)",
            ref,
        )
    with pytest.raises(asyncpg.UniqueViolationError):
        await empty_db.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY scoring_job_state_leased_expiry_idx"
            " ON scoring_job_state (scoring_request_ref)"
        )
    assert (
        await empty_db.fetchval(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = 'scoring_job_state_leased_expiry_idx'"
        )
        is False
    )
    index_file.write_text(index_sql)
    applied = await apply(empty_db, load_migrations(migration_dir))
    assert [m.file_name for m in applied] == [SHIPPED[2]]
    row = await empty_db.fetchrow(
        "SELECT i.indisvalid, i.indisunique, pg_get_indexdef(i.indexrelid) AS def"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE c.relname = 'scoring_job_state_leased_expiry_idx'"
    )
    assert row["indisvalid"] is True
    assert row["indisunique"] is False
    assert "active_lease_expires_at_unix_ms" in row["def"]
    assert "WHERE" in row["def"]


async def test_health_indexes_exist_partial_and_valid(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        "SELECT c.relname, i.indisvalid, i.indisready, x.indexdef"
        " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " JOIN pg_indexes x ON x.indexname = c.relname"
        " WHERE i.indrelid = 'scoring_job_state'::regclass AND c.relname = ANY($1::text[])",
        list(HEALTH_INDEXES),
    )
    by_name = {r["relname"]: r for r in rows}
    assert set(by_name) == set(HEALTH_INDEXES)
    for name, row in by_name.items():
        assert row["indisvalid"] is True, name
        assert row["indisready"] is True, name
        assert " WHERE " in row["indexdef"], row["indexdef"]
    assert "'leased'" in by_name["scoring_job_state_leased_expiry_idx"]["indexdef"]
    assert "'quarantined'" in by_name["scoring_job_state_quarantined_created_idx"]["indexdef"]
    assert "'completed'" not in by_name["scoring_job_state_active_created_idx"]["indexdef"]


# -- an existing scoring_job_state ------------------------------------------------------------
_SCORING_SERVICE_TABLE = """
CREATE TABLE scoring_job_state (
    scoring_job_ref                 text        NOT NULL PRIMARY KEY,
    scoring_request_ref             text        NOT NULL,
    scoring_state                   text        NOT NULL,
    attempt_count                   integer     NOT NULL DEFAULT 0,
    max_attempts                    integer     NOT NULL,
    next_attempt_at_unix_ms         bigint,
    last_failure_code               text,
    active_worker_ref               text,
    active_lease_ref                text,
    active_fencing_token            bigint,
    active_lease_expires_at_unix_ms bigint,
    result_ref                      text,
    completed_fencing_token         bigint,
    created_at                      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at                      timestamptz NOT NULL DEFAULT clock_timestamp(),
    scoring_service_only            text        DEFAULT 'theirs',
    CONSTRAINT theirs_state_check CHECK (scoring_state <> 'bogus')
);
COMMENT ON TABLE scoring_job_state IS 'owned by the scoring service';
INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state, max_attempts)
VALUES ('job-theirs', 'req-theirs', 'queued', 7);
"""

_SHAPE = """
SELECT
  (SELECT array_agg(attname::text || ':' || format_type(atttypid, atttypmod) ORDER BY attnum)
     FROM pg_attribute WHERE attrelid = 'scoring_job_state'::regclass
      AND attnum > 0 AND NOT attisdropped) AS columns,
  (SELECT array_agg(conname::text || ':' || pg_get_constraintdef(oid) ORDER BY conname)
     FROM pg_constraint WHERE conrelid = 'scoring_job_state'::regclass
      AND contype <> 'n') AS constraints,  -- PostgreSQL 18 also lists NOT NULL here
  obj_description('scoring_job_state'::regclass, 'pg_class') AS comment
"""


async def test_an_existing_scoring_job_state_is_left_untouched(
    empty_db: asyncpg.Connection,
) -> None:
    await empty_db.execute(_SCORING_SERVICE_TABLE)
    before = await empty_db.fetchrow(_SHAPE)
    rows_before = await empty_db.fetch("SELECT * FROM scoring_job_state")
    assert len(await apply(empty_db, load_migrations())) == len(SHIPPED)
    after = await empty_db.fetchrow(_SHAPE)
    assert after["columns"] == before["columns"]
    assert "scoring_service_only:text" in after["columns"]
    # None of our shape constraints was added to their table.
    assert after["constraints"] == before["constraints"]
    assert len(after["constraints"]) == 2
    assert after["comment"] == "owned by the scoring service"
    assert [dict(r) for r in await empty_db.fetch("SELECT * FROM scoring_job_state")] == [
        dict(r) for r in rows_before
    ]
    # The health indexes are added next to it.
    count = await empty_db.fetchval(
        "SELECT count(*) FROM pg_index WHERE indrelid = 'scoring_job_state'::regclass"
        " AND indisvalid AND NOT indisprimary"
    )
    assert count == len(HEALTH_INDEXES)


# -- the CLI verb -----------------------------------------------------------------------------
def _applied_count(stdout: str) -> int:
    match = re.search(r"applied (\d+) migration\(s\)", stdout)
    assert match is not None, stdout
    return int(match.group(1))


async def test_two_concurrent_migrate_processes_are_safe(empty_database_url: str) -> None:
    first, second = await asyncio.gather(
        run_cli("migrate", "--database-url", empty_database_url),
        run_cli("migrate", "--database-url", empty_database_url),
    )
    assert (first.code, second.code) == (0, 0), (first.stderr, second.stderr)
    # Exactly one of them did the work; the other found it done.
    assert sorted([_applied_count(first.stdout), _applied_count(second.stdout)]) == [
        0,
        len(SHIPPED),
    ]
    conn = await asyncpg.connect(empty_database_url)
    try:
        rows = await conn.fetch(
            "SELECT version, count(*) AS n FROM outbox_relay_migration GROUP BY version"
        )
        assert sorted((r["version"], r["n"]) for r in rows) == [(v, 1) for v in VERSIONS]
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE c.relname = ANY($1::text[]) AND i.indisvalid",
            list(HEALTH_INDEXES),
        ) == len(HEALTH_INDEXES)
    finally:
        await conn.close()


async def test_migrate_verify_exit_codes(empty_database_url: str) -> None:
    pending = await run_cli("migrate", "--verify", "--database-url", empty_database_url)
    assert pending.code == 1
    for name in SHIPPED:
        assert name in pending.stdout
    assert "Traceback" not in pending.output
    applied = await run_cli("migrate", "--database-url", empty_database_url)
    assert applied.code == 0, applied.stderr
    for name in SHIPPED:
        assert f"applying {name}" in applied.stdout
    done = await run_cli("migrate", "--verify", "--database-url", empty_database_url)
    assert done.code == 0
    assert f"up to date ({len(SHIPPED)} applied)" in done.stdout


def test_migration_dataclass_names_its_file() -> None:
    migration = Migration(version=7, name="x_y", sql="SELECT 1", checksum="0" * 64)
    assert migration.file_name == "0007_x_y.sql"
    assert migration.transactional
    assert not Migration(3, "i", "\n-- migrate: no-transaction\nSELECT 1", "").transactional
