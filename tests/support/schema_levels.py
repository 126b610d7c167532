"""The newest migration a part's statements read, found by PostgreSQL itself: every SQL
statement the part's modules define is prepared (parsed and analysed, never run) after each
migration in turn; the part's level is the first migration after which all of them prepare.

A statement is a module-level string of the package that starts with a statement keyword
and prepares on the fully migrated schema; fragments that are only ever part of a statement
(a ``WITH`` clause, a correlated sub-select) prepare nowhere and are left out.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass

import asyncpg

from migrations.runner import apply, load_migrations

_STATEMENT = re.compile(r"[\s(]*(WITH|SELECT|INSERT|UPDATE|DELETE)\b", re.IGNORECASE)


def statements_of(package: str) -> dict[str, str]:
    """Every module-level string of ``package`` (and its sub-packages) that starts like a
    statement, by ``module.NAME`` (a text imported into several modules counted once)."""
    root = importlib.import_module(package)
    by_text: dict[str, str] = {}
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, str) and _STATEMENT.match(value):
                by_text.setdefault(value, f"{info.name}.{name}")
    return {name: text for text, name in by_text.items()}


async def _prepares(conn: asyncpg.Connection, text: str) -> bool:
    try:
        await conn.prepare(text)
    except asyncpg.PostgresError:
        return False
    return True


@dataclass(frozen=True)
class Level:
    """A part's level: the migration, the statements that prepared, and every one found."""

    migration: int
    prepared: list[str]
    found: list[str]


async def level_read(database_url: str, package: str) -> Level:
    """On the empty database at ``database_url`` (which it migrates): ``package``'s level,
    the first migration after which every statement that prepares on the whole schema
    prepares."""
    statements = statements_of(package)
    conn = await asyncpg.connect(database_url)
    try:
        migrations = load_migrations()
        await apply(conn, migrations)
        names = [name for name, text in statements.items() if await _prepares(conn, text)]
        # Again from nothing, one migration at a time.
        await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        for count in range(1, len(migrations) + 1):
            await apply(conn, migrations[:count])
            if all([await _prepares(conn, statements[name]) for name in names]):
                return Level(migrations[count - 1].version, names, sorted(statements))
    finally:
        await conn.close()
    raise AssertionError("some statements prepare on no schema at all")
