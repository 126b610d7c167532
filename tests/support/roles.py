"""Login roles for tests that act as one of the parts, and what a role may do on every schema
object."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass
from urllib.parse import quote, urlsplit, urlunsplit

import asyncpg

from migrations.grants import WriterRoutes, apply_plan, plan_grants, read_facts

NONE = "—"
_COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
_TABLE_PRIVILEGES = ("DELETE", "TRUNCATE", "TRIGGER")
_ORDER = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN")


@dataclass(frozen=True)
class LoginRole:
    """A role created by a test, with its password and a URL that logs in as it."""

    name: str
    password: str = ""
    url: str = ""


def as_role(url: str, role: str, password: str) -> str:
    """``url`` with its user and password replaced."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{quote(role, safe='')}:{quote(password, safe='')}@{host}{port}"
    return urlunsplit(parts._replace(netloc=netloc))


async def create_login_role(admin: asyncpg.Connection, url: str, label: str) -> LoginRole:
    """A fresh login role with a random password; the caller drops it."""
    name = f"or_{label}_{uuid.uuid4().hex[:8]}"
    password = secrets.token_hex(16)
    # A hex password needs no quoting; CREATE ROLE takes no bound parameters.
    await admin.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
    return LoginRole(name, password, as_role(url, name, password))


async def drop_role(admin: asyncpg.Connection, name: str) -> None:
    """Revoke what the role holds in this database, then drop it from the cluster."""
    await admin.execute(f'DROP OWNED BY "{name}"')
    await admin.execute(f'DROP ROLE IF EXISTS "{name}"')


async def grant(url: str, role: str, *parts: str, routes: WriterRoutes | None = None) -> None:
    """``outbox-relay grant --to role --as part…`` through the same functions the verb calls
    (an event writer with ``routes``; without, every route, as ``--any-route`` gives)."""
    conn = await asyncpg.connect(url)
    try:
        await apply_plan(conn, plan_grants(role, parts, await read_facts(conn, role), routes))
    finally:
        await conn.close()


def _describe(whole: list[str], columns: dict[str, list[str]]) -> str:
    words = [p for p in _ORDER if p in whole]
    words += [f"{p}({', '.join(sorted(columns[p]))})" for p in _ORDER if columns.get(p)]
    return ", ".join(words) or NONE


_OBJECTS = """
SELECT c.oid, c.relname, c.relkind::text
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
ORDER BY c.relname
"""
_COLUMNS = """
SELECT attname FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped
"""
_FUNCTIONS = """
SELECT p.oid, p.proname || '(' || oidvectortypes(p.proargtypes) || ')'
FROM pg_proc p
WHERE p.pronamespace = 'public'::regnamespace
  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
"""


async def privilege_matrix(conn: asyncpg.Connection, role: str) -> dict[str, str]:
    """What ``role`` may do on every table, sequence and function of the schema, and the schema.

    Effective privileges (through PUBLIC and memberships too), in the notation of
    docs/security.md: whole-table privileges, then column-level ones as ``UPDATE(a, b)``.
    """
    version = int(await conn.fetchval("SHOW server_version_num"))
    table_only = (*_TABLE_PRIVILEGES, "MAINTAIN") if version >= 170000 else _TABLE_PRIVILEGES
    matrix: dict[str, str] = {}
    for oid, name, kind in await conn.fetch(_OBJECTS):
        if kind == "S":
            held = [
                p
                for p in ("USAGE", "SELECT", "UPDATE")
                if await conn.fetchval(
                    "SELECT has_sequence_privilege($1, $2::oid, $3)", role, oid, p
                )
            ]
            matrix[f"sequence {name}"] = ", ".join(held) or NONE
            continue
        whole = [
            p
            for p in (*_COLUMN_PRIVILEGES, *table_only)
            if await conn.fetchval("SELECT has_table_privilege($1, $2::oid, $3)", role, oid, p)
        ]
        columns: dict[str, list[str]] = {}
        for privilege in _COLUMN_PRIVILEGES:
            if privilege in whole:
                continue
            for (column,) in await conn.fetch(_COLUMNS, oid):
                if await conn.fetchval(
                    "SELECT has_column_privilege($1, $2::oid, $3, $4)", role, oid, column, privilege
                ):
                    columns.setdefault(privilege, []).append(column)
        matrix[name] = _describe(whole, columns)
    for oid, signature in await conn.fetch(_FUNCTIONS):
        can = await conn.fetchval(
            "SELECT has_function_privilege($1, $2::oid, 'EXECUTE')", role, oid
        )
        matrix[f"function {signature}"] = "EXECUTE" if can else NONE
    schema = [
        p
        for p in ("USAGE", "CREATE")
        if await conn.fetchval("SELECT has_schema_privilege($1, 'public', $2)", role, p)
    ]
    matrix["schema public"] = ", ".join(schema) or NONE
    return matrix
