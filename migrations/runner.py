"""Numbered plain-SQL migrations: in order, once, under an advisory lock, checksummed.

A file whose first line is ``-- migrate: no-transaction`` runs statement by statement
outside a transaction (for ``CREATE INDEX CONCURRENTLY``); every other file runs in one
transaction together with its record in ``outbox_relay_migration``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from contracts.errors import MigrationError, SchemaNotMigrated

_FILE_NAME = re.compile(r"(\d{4})_([a-z0-9_]+)\.sql")
_NO_TRANSACTION = "-- migrate: no-transaction"
# An index a no-transaction migration builds, and the table it builds it on.
_CONCURRENT_INDEX = re.compile(
    r"CREATE\s+INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+([a-z0-9_]+)\s+ON\s+([a-z0-9_]+)",
    re.IGNORECASE,
)
# A fixed advisory-lock key: "outbox-relay migrate" spelled as a 63-bit integer.
MIGRATION_LOCK_KEY = 0x6F7574626F786D67
_LOCK_POLL_SECONDS = 0.2

# The statements below call pg_catalog's exact signatures (casts on constants and parameters,
# pg_catalog.format, pg_catalog.unnest): migrate runs as the schema owner, with whatever
# search_path its session has (tests/security/test_exact_calls.py).
_CREATE_RECORD = """
CREATE TABLE IF NOT EXISTS outbox_relay_migration (
    version    integer     NOT NULL PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
_READ_RECORD = "SELECT version, name, checksum FROM outbox_relay_migration ORDER BY version"
_RECORD_EXISTS = "SELECT to_regclass('outbox_relay_migration') IS NOT NULL"
_INSERT_RECORD = "INSERT INTO outbox_relay_migration (version, name, checksum) VALUES ($1, $2, $3)"
_TRY_LOCK = "SELECT pg_try_advisory_lock($1::bigint)"
_UNLOCK = "SELECT pg_advisory_unlock($1::bigint)"
# Leftovers of this migration's own builds only: an index of that name on the very table
# the unqualified CREATE INDEX resolves to (so in the schema it migrates), never a
# namesake elsewhere on the search path. format() quotes the name for the DROP.
_INVALID_OWN_INDEXES = """
SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) AS qualified
FROM unnest($1::text[], $2::text[]) AS own (index_name, table_name)
JOIN pg_class c ON c.relname = own.index_name
JOIN pg_index i ON i.indexrelid = c.oid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT i.indisvalid AND i.indrelid = to_regclass(own.table_name)::oid
"""
# Building an index needs ownership of its table (or membership in the owning role). A
# table that does not exist yet will be created by an earlier migration, as ours.
_TABLES_NOT_OWNED = """
SELECT c.relname AS table_name, pg_get_userbyid(c.relowner) AS owner
FROM pg_catalog.unnest($1::text[]) AS own (table_name)
JOIN pg_class c ON c.oid = to_regclass(own.table_name)::oid
WHERE NOT pg_has_role(c.relowner, 'USAGE')
ORDER BY c.relname
"""


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    sql: str
    checksum: str

    @property
    def transactional(self) -> bool:
        return not self.sql.lstrip().startswith(_NO_TRANSACTION)

    @property
    def file_name(self) -> str:
        return f"{self.version:04d}_{self.name}.sql"


@dataclass(frozen=True)
class MigrationStatus:
    """What ``migrate --verify`` found."""

    applied: tuple[int, ...]
    pending: tuple[Migration, ...]

    @property
    def up_to_date(self) -> bool:
        return not self.pending


def load_migrations(directory: Path | None = None) -> list[Migration]:
    """Read ``NNNN_name.sql`` files in order; refuse odd names and duplicate prefixes."""
    files: Iterable[tuple[str, str]]
    if directory is None:
        root = resources.files("migrations")
        files = [(p.name, p.read_text("utf-8")) for p in root.iterdir() if p.name.endswith(".sql")]
    else:
        files = [(p.name, p.read_text("utf-8")) for p in directory.glob("*.sql")]
    by_version: dict[int, Migration] = {}
    for name, sql in sorted(files):
        match = _FILE_NAME.fullmatch(name)
        if match is None:
            raise MigrationError(f"migration file {name!r} is not named NNNN_name.sql")
        version = int(match.group(1))
        if version in by_version:
            raise MigrationError(
                f"two migration files share the prefix {version:04d}: "
                f"{by_version[version].file_name} and {name}"
            )
        checksum = hashlib.sha256(sql.encode("utf-8")).hexdigest()
        by_version[version] = Migration(version, match.group(2), sql, checksum)
    return [by_version[v] for v in sorted(by_version)]


_DOLLAR_TAG = re.compile(r"\$[A-Za-z_][A-Za-z0-9_]*\$|\$\$")
# A character that continues a word. An E opens an escape string only where it begins a
# token (time'…' is a typed literal), and a dollar inside a word belongs to an identifier
# (a$b$), not to a dollar quote.
_WORD = re.compile(r"[A-Za-z0-9_$]")


def _in_word(sql: str, i: int) -> bool:
    return i > 0 and _WORD.match(sql[i - 1]) is not None


def _quoted_end(sql: str, start: int, quote: str, backslash_escapes: bool) -> int:
    """Index just past the closing quote of the text opened at ``start`` (or the end)."""
    end, n = start + 1, len(sql)
    while end < n:
        ch = sql[end]
        if backslash_escapes and ch == "\\":
            end += 2  # the escaped character, a quote included
            continue
        if ch == quote:
            if sql.startswith(quote * 2, end):
                end += 2  # a doubled quote is the quote character itself
                continue
            return end + 1
        end += 1
    return n


def _block_comment_end(sql: str, start: int) -> int:
    """Index just past the ``*/`` that closes the comment opened at ``start``; they nest."""
    depth, i, n = 0, start, len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return n


def split_statements(sql: str) -> list[str]:
    """Split a no-transaction file on top-level semicolons.

    Line and block comments (nested ones too), single-quoted text (``E'…'`` with its
    backslash escapes), double-quoted names and dollar-quoted bodies are kept whole, so a
    semicolon inside any of them does not end a statement.
    """
    statements: list[str] = []
    current: list[str] = []
    i, n = 0, len(sql)
    while i < n:
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end == -1 else end + 1
            current.append("\n")
            continue
        if sql.startswith("/*", i):
            i = _block_comment_end(sql, i)
            current.append(" ")
            continue
        ch = sql[i]
        if ch in "'\"":
            escapes = ch == "'" and i > 0 and sql[i - 1] in "eE" and not _in_word(sql, i - 1)
            end = _quoted_end(sql, i, ch, escapes)
            current.append(sql[i:end])
            i = end
            continue
        if ch == "$" and not _in_word(sql, i) and (tag := _DOLLAR_TAG.match(sql, i)) is not None:
            close = sql.find(tag.group(0), tag.end())
            end = n if close == -1 else close + len(tag.group(0))
            current.append(sql[i:end])
            i = end
            continue
        if ch == ";":
            statement = "".join(current).strip()
            if statement:
                statements.append(statement)
            current = []
        else:
            current.append(ch)
        i += 1
    tail = "".join(current).strip()
    if tail:
        statements.append(tail)
    return statements


async def _acquire_lock(conn: asyncpg.Connection, timeout: float) -> None:
    # Poll instead of blocking in pg_advisory_lock: a waiting statement keeps a
    # transaction open, and CREATE INDEX CONCURRENTLY in the lock holder would wait
    # for it — a deadlock between two migrate processes.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await conn.fetchval(_TRY_LOCK, MIGRATION_LOCK_KEY):
        if loop.time() > deadline:
            raise MigrationError("another migrate run holds the migration lock; gave up waiting")
        await asyncio.sleep(_LOCK_POLL_SECONDS)


_MIGRATE_AS_OWNER = "run migrate as the schema owner"


async def _applied(
    conn: asyncpg.Connection, refused_advice: str = _MIGRATE_AS_OWNER
) -> dict[int, tuple[str, str]]:
    if not await conn.fetchval(_RECORD_EXISTS):
        return {}
    try:
        rows = await conn.fetch(_READ_RECORD)
    except asyncpg.InsufficientPrivilegeError:
        # Only the schema owner and the relay read the migration record (docs/security.md).
        raise MigrationError(
            f"permission denied on outbox_relay_migration: {refused_advice}"
        ) from None
    return {r["version"]: (r["name"], r["checksum"]) for r in rows}


def _check_history(
    migrations: list[Migration], applied: dict[int, tuple[str, str]]
) -> list[Migration]:
    known = {m.version: m for m in migrations}
    for version, (name, checksum) in sorted(applied.items()):
        migration = known.get(version)
        if migration is None:
            raise MigrationError(
                f"the database has migration {version:04d}_{name} that this build does not ship"
            )
        if migration.checksum != checksum:
            raise MigrationError(
                f"migration {migration.file_name} changed after it was applied "
                "(checksum differs); restore the applied file and add a new migration instead"
            )
    return [m for m in migrations if m.version not in applied]


async def verify(
    conn: asyncpg.Connection,
    migrations: list[Migration],
    *,
    refused_advice: str = _MIGRATE_AS_OWNER,
) -> MigrationStatus:
    """Compare files with the database's record without changing anything."""
    applied = await _applied(conn, refused_advice)
    pending = _check_history(migrations, applied)
    return MigrationStatus(applied=tuple(sorted(applied)), pending=tuple(pending))


async def require_migrated(conn: asyncpg.Connection, migrations: list[Migration]) -> None:
    """Raise :class:`SchemaNotMigrated` unless every migration of this build is applied; reads only."""
    # The verbs that check this (redrive, grant) run as the relay's role or the owner.
    state = await verify(
        conn,
        migrations,
        refused_advice="this role may not read it: give it the relay part "
        "(`outbox-relay grant --to ROLE --as relay`) or run as the schema owner",
    )
    if state.up_to_date:
        return
    if not state.applied:
        raise SchemaNotMigrated("the database was never migrated; run `outbox-relay migrate`")
    names = ", ".join(m.file_name for m in state.pending)
    raise SchemaNotMigrated(f"the database lacks migration(s) {names}; run `outbox-relay migrate`")


async def _run_without_transaction(conn: asyncpg.Connection, migration: Migration) -> None:
    # An interrupted CREATE INDEX CONCURRENTLY leaves an INVALID index that IF NOT
    # EXISTS would then keep forever: drop such leftovers first.
    indexes, tables = _index_builds(migration)
    for row in await conn.fetch(_INVALID_OWN_INDEXES, indexes, tables):
        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {row['qualified']}")
    for statement in split_statements(migration.sql):
        await conn.execute(statement)
    await conn.execute(_INSERT_RECORD, migration.version, migration.name, migration.checksum)


def _index_builds(migration: Migration) -> tuple[list[str], list[str]]:
    """The (index, table) pairs a migration builds concurrently, as two parallel lists."""
    pairs = _CONCURRENT_INDEX.findall(migration.sql)
    return [index for index, _ in pairs], [table for _, table in pairs]


async def _require_ownership(conn: asyncpg.Connection, pending: list[Migration]) -> None:
    # Checked before the first pending migration runs, so a missing privilege leaves the
    # database as it was instead of half migrated.
    for migration in pending:
        _, tables = _index_builds(migration)
        for row in await conn.fetch(_TABLES_NOT_OWNED, sorted(set(tables))):
            raise MigrationError(
                f"migration {migration.file_name} needs ownership of table "
                f"{row['table_name']} to build its indexes; run migrate as role "
                f"{row['owner']} or a member of it"
            )


async def apply(
    conn: asyncpg.Connection,
    migrations: list[Migration],
    *,
    lock_timeout: float = 300.0,
    progress: Callable[[Migration], None] | None = None,
) -> list[Migration]:
    """Apply pending migrations in order; returns the ones applied (empty on a second run)."""
    await _acquire_lock(conn, lock_timeout)
    try:
        try:
            await conn.execute(_CREATE_RECORD)
            pending = _check_history(migrations, await _applied(conn))
            await _require_ownership(conn, pending)
        except asyncpg.PostgresError as exc:
            # Before any migration ran; the server's message names schema objects only.
            raise MigrationError(
                f"migrate could not start: {exc.message} ({exc.sqlstate}); {_MIGRATE_AS_OWNER}"
            ) from exc
        for migration in pending:
            if progress is not None:
                progress(migration)
            try:
                if migration.transactional:
                    async with conn.transaction():
                        await conn.execute(migration.sql)
                        await conn.execute(
                            _INSERT_RECORD, migration.version, migration.name, migration.checksum
                        )
                else:
                    await _run_without_transaction(conn, migration)
            except asyncpg.PostgresError as exc:
                # The server's message names schema objects, never connection secrets.
                raise MigrationError(
                    f"migration {migration.file_name} failed: {exc.sqlstate} {exc.message}"
                ) from exc
        return pending
    finally:
        await conn.execute(_UNLOCK, MIGRATION_LOCK_KEY)
