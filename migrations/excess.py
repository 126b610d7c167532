"""What a role can do on the relay's objects beyond what its parts need, once ``grant`` has
applied its plan, and where each excess comes from.

``grant`` revokes what the objects' owner gave the role. Three other sources survive that
``REVOKE``: a privilege given to PUBLIC, one given by another grantor (a role that holds it
``WITH GRANT OPTION``), and everything a role the role is a member of can do (inherited, or
taken with ``SET ROLE``). The server's own ``has_*_privilege`` functions say what the role
and each of those can do; this module compares that with the model
(:func:`migrations.grants.needed_privileges`) and names the source of every difference,
so that ``grant`` never claims "exactly" while one remains. ``CREATE`` on the schema is
left to :func:`migrations.grants.schema_creators_warning`.

Every call in the SQL below is qualified with ``pg_catalog``: ``grant`` runs as the schema
owner, with whatever ``search_path`` that session has.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import asyncpg

from migrations.grants import FUNCTIONS, SEQUENCES, TABLES, Privilege, needed_privileges, shown

PUBLIC = "public"
"""The name the ``has_*_privilege`` functions take for PUBLIC."""
_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
_MAINTAIN_FROM = 170000  # PostgreSQL 17 added MAINTAIN on tables
_COLUMN_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "REFERENCES")
_SEQUENCE_PRIVILEGES = ("USAGE", "SELECT", "UPDATE")
_ORDER = (
    "USAGE",
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
    "MAINTAIN",
    "EXECUTE",
)


@dataclass(frozen=True)
class Excess:
    """Privileges on one object that one source gives the role beyond its parts' needs."""

    target: str
    privileges: str  # the matrix notation of docs/security.md: SELECT, UPDATE(a, b)
    source: str  # "from PUBLIC", "granted by R", "through role R"


# The schema, the role, the server's version, and the roles whose privileges the role can
# use: those it inherits, and those it may SET ROLE to (from PostgreSQL 16 a membership
# says which; before, every membership allows SET ROLE, and 'SET' is no privilege name).
_ROLE = """
WITH server AS (
    SELECT pg_catalog.current_setting('server_version_num')::integer AS version
)
SELECT n.oid, r.oid, server.version,
       ARRAY(SELECT DISTINCT pg_catalog.pg_get_userbyid(m.roleid)::text
             FROM pg_catalog.pg_auth_members m
             WHERE m.member OPERATOR(pg_catalog.=) r.oid
               AND pg_catalog.pg_has_role(
                   r.oid, m.roleid,
                   CASE WHEN server.version OPERATOR(pg_catalog.>=) 160000
                        THEN 'USAGE, SET' ELSE 'USAGE, MEMBER' END)
             ORDER BY 1)
FROM server, pg_catalog.pg_namespace n, pg_catalog.pg_roles r
WHERE n.nspname OPERATOR(pg_catalog.=) $1::name AND r.rolname OPERATOR(pg_catalog.=) $2::name
"""

# What each grantee (a role name, or "public") can do on the model's objects, as the server
# decides it: whole-object privileges, then column privileges where the whole table's is
# not held. $1 schema, $2 grantees, $3 tables, $4 table privileges, $5 column privileges,
# $6 sequences, $7 sequence privileges, $8 functions (no arguments).
_HELD = """
SELECT g.name::text, 'table'::text, c.relname::text, p.privilege, ''::text
FROM pg_catalog.unnest($2::name[]) AS g(name)
CROSS JOIN pg_catalog.pg_class c
CROSS JOIN pg_catalog.unnest($4::text[]) AS p(privilege)
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($3::name[])
  AND pg_catalog.has_table_privilege(g.name, c.oid, p.privilege)
UNION ALL
SELECT g.name::text, 'table'::text, c.relname::text, p.privilege, a.attname::text
FROM pg_catalog.unnest($2::name[]) AS g(name)
CROSS JOIN pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) c.oid
CROSS JOIN pg_catalog.unnest($5::text[]) AS p(privilege)
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($3::name[])
  AND a.attnum OPERATOR(pg_catalog.>) 0::smallint AND NOT a.attisdropped
  AND NOT pg_catalog.has_table_privilege(g.name, c.oid, p.privilege)
  AND pg_catalog.has_column_privilege(g.name, c.oid, a.attnum, p.privilege)
UNION ALL
SELECT g.name::text, 'sequence'::text, c.relname::text, p.privilege, ''::text
FROM pg_catalog.unnest($2::name[]) AS g(name)
CROSS JOIN pg_catalog.pg_class c
CROSS JOIN pg_catalog.unnest($7::text[]) AS p(privilege)
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($6::name[])
  AND pg_catalog.has_sequence_privilege(g.name, c.oid, p.privilege)
UNION ALL
SELECT g.name::text, 'function'::text, f.proname::text, 'EXECUTE'::text, ''::text
FROM pg_catalog.unnest($2::name[]) AS g(name)
CROSS JOIN pg_catalog.pg_proc f
WHERE f.pronamespace OPERATOR(pg_catalog.=) $1::oid
  AND f.proname OPERATOR(pg_catalog.=) ANY ($8::name[])
  AND f.pronargs OPERATOR(pg_catalog.=) 0::smallint
  AND pg_catalog.has_function_privilege(g.name, f.oid, 'EXECUTE')
"""

# What was given to the role itself, and by whom ($1 schema, $2 the role's oid, $3 tables,
# $4 sequences, $5 functions): after grant's REVOKE, whatever is left was given by a
# grantor other than the owner.
_GIVEN = """
SELECT 'table'::text, c.relname::text, a.privilege_type, ''::text,
       pg_catalog.pg_get_userbyid(a.grantor)::text
FROM pg_catalog.pg_class c CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($3::name[])
  AND a.grantee OPERATOR(pg_catalog.=) $2::oid
UNION ALL
SELECT 'table'::text, c.relname::text, a.privilege_type, t.attname::text,
       pg_catalog.pg_get_userbyid(a.grantor)::text
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_attribute t ON t.attrelid OPERATOR(pg_catalog.=) c.oid
CROSS JOIN LATERAL pg_catalog.aclexplode(t.attacl) AS a
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($3::name[])
  AND a.grantee OPERATOR(pg_catalog.=) $2::oid
UNION ALL
SELECT 'sequence'::text, c.relname::text, a.privilege_type, ''::text,
       pg_catalog.pg_get_userbyid(a.grantor)::text
FROM pg_catalog.pg_class c CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS a
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::oid
  AND c.relname OPERATOR(pg_catalog.=) ANY ($4::name[])
  AND a.grantee OPERATOR(pg_catalog.=) $2::oid
UNION ALL
SELECT 'function'::text, f.proname::text, a.privilege_type, ''::text,
       pg_catalog.pg_get_userbyid(a.grantor)::text
FROM pg_catalog.pg_proc f CROSS JOIN LATERAL pg_catalog.aclexplode(f.proacl) AS a
WHERE f.pronamespace OPERATOR(pg_catalog.=) $1::oid
  AND f.proname OPERATOR(pg_catalog.=) ANY ($5::name[])
  AND f.pronargs OPERATOR(pg_catalog.=) 0::smallint
  AND a.grantee OPERATOR(pg_catalog.=) $2::oid
"""


def _privilege(kind: str, name: str, privilege: str, column: str) -> Privilege:
    target = {"table": name, "sequence": f"sequence {name}"}.get(
        kind, f"function {_SIGNATURES.get(name, name + '()')}"
    )
    return Privilege(target, privilege, column)


def _covered(item: Privilege, needed: frozenset[Privilege]) -> bool:
    # A column privilege is covered by the same privilege on the whole table.
    return item in needed or (
        bool(item.column) and Privilege(item.target, item.privilege) in needed
    )


def find_excess(
    role: str,
    needed: frozenset[Privilege],
    held: Mapping[str, frozenset[Privilege]],
    given: Mapping[Privilege, frozenset[str]],
) -> tuple[Excess, ...]:
    """The excess of ``role`` by object and source, in model order (pure).

    ``held`` is what each grantee can do: the role, ``public`` and each role whose
    privileges it can use; ``given`` is who granted the role itself each privilege it
    holds directly.
    """
    members = sorted(name for name in held if name not in (role, PUBLIC))
    usable = held.get(role, frozenset()).union(*(held[m] for m in members))
    found: dict[tuple[str, str], set[Privilege]] = defaultdict(set)
    for item in usable:
        if _covered(item, needed):
            continue
        sources = []
        if item in held.get(PUBLIC, frozenset()):
            sources.append("from PUBLIC")
        sources += [f"granted by {shown(grantor)}" for grantor in sorted(given.get(item, ()))]
        sources += [f"through role {shown(m)}" for m in members if item in held[m]]
        for source in sources or ["from a source grant cannot name"]:
            found[item.target, source].add(item)
    order = _target_order()
    return tuple(
        Excess(target, _describe(items), source)
        for (target, source), items in sorted(
            found.items(), key=lambda entry: (order.get(entry[0][0], len(order)), entry[0])
        )
    )


# A function's name → its signature in the model (the schema's functions are not overloaded).
_SIGNATURES: Final[Mapping[str, str]] = {
    signature.split("(", 1)[0]: signature for signature in FUNCTIONS
}


def _target_order() -> dict[str, int]:
    targets = [
        *TABLES,
        *(f"sequence {name}" for name in SEQUENCES),
        *(f"function {name}" for name in FUNCTIONS),
    ]
    return {target: index for index, target in enumerate(targets)}


def _describe(items: Iterable[Privilege]) -> str:
    whole = {item.privilege for item in items if not item.column}
    columns: dict[str, list[str]] = defaultdict(list)
    for item in items:
        if item.column:
            columns[item.privilege].append(item.column)
    words = [p for p in _ORDER if p in whole]
    words += [f"{p}({', '.join(sorted(columns[p]))})" for p in _ORDER if p in columns]
    return ", ".join(words)


def render_excess(role: str, parts: Iterable[str], excess: Iterable[Excess]) -> list[str]:
    """A heading and one line per object and source; nothing when there is no excess."""
    lines = [f"  {e.target}: {e.privileges} ({e.source})" for e in excess]
    if not lines:
        return []
    heading = (
        f"role {shown(role)} can do more than {', '.join(parts)} needs on this database's "
        "objects, from sources grant does not take away:"
    )
    return [heading, *lines]


async def read_excess(
    conn: asyncpg.Connection, schema: str, role: str, parts: Iterable[str]
) -> tuple[Excess, ...]:
    """What ``role`` can do on the relay's objects in ``schema`` beyond ``parts``' needs,
    by source, as the server decides it now."""
    tables = list(TABLES)
    sequences = list(SEQUENCES)
    functions = list(_SIGNATURES)
    row = await conn.fetchrow(_ROLE, schema, role)
    if row is None:
        return ()
    namespace, role_oid, version, members = row
    table_privileges = [*_TABLE_PRIVILEGES, *(["MAINTAIN"] if version >= _MAINTAIN_FROM else [])]
    held: dict[str, set[Privilege]] = {name: set() for name in (role, PUBLIC, *members)}
    for grantee, *item in await conn.fetch(
        _HELD,
        namespace,
        list(held),
        tables,
        table_privileges,
        list(_COLUMN_PRIVILEGES),
        sequences,
        list(_SEQUENCE_PRIVILEGES),
        functions,
    ):
        held[grantee].add(_privilege(*item))
    given: dict[Privilege, set[str]] = defaultdict(set)
    for *item, grantor in await conn.fetch(
        _GIVEN, namespace, role_oid, tables, sequences, functions
    ):
        given[_privilege(*item)].add(grantor)
    return find_excess(
        role,
        needed_privileges(parts),
        {name: frozenset(items) for name, items in held.items()},
        {item: frozenset(grantors) for item, grantors in given.items()},
    )
