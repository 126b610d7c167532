"""Every function and operator the product's SQL calls resolves to ``pg_catalog``, whatever the
session's ``search_path`` holds (docs/security.md, "Names a neighbour cannot take over").

Real PostgreSQL (each server of the run). A role that may create objects in a schema on
another role's path can define a function or operator whose argument types match a call
exactly where pg_catalog's own candidate needs an implicit cast, or is polymorphic or
variadic, or meets an unknown-typed literal or parameter; PostgreSQL then calls it, with the
caller's privileges. So the statements must call nothing but exact pg_catalog signatures
(``0::bigint``, ``OPERATOR(pg_catalog.=)``, ``pg_catalog.unnest(…)``).

How the test sees it (tests/support/exact_calls.py): every SQL text of the product is found
(module constants, and every SQL-looking literal in the source, which must be a statement,
part of one, or listed below as one that calls nothing). Each statement is prepared as the
driver prepares it, and its parse tree (``debug_print_parse``) read for the OIDs its calls
resolved to. Shadows are planted in a schema of their own, after the relay's on the path as
a planted schema would be, generated from the catalog and from the statements' own calls;
each raises when called. A statement passes when, prepared with the shadows on its path,
its tree names none of them.

The method the issue first proposed (prepare with the shadows on the path, force a generic
plan, then ``EXPLAIN (VERBOSE) EXECUTE`` with a path without them, so that a resolved
shadow prints qualified) cannot see a shadow: PostgreSQL analyses a prepared statement again
when ``search_path`` has changed since it was prepared, so the plan explained is the one
resolved without them.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
import pytest_asyncio

from migrations.grants import PARTS, SchemaFacts, WriterRoutes, plan_grants, render_script
from migrations.runner import apply, load_migrations
from pgconnect import ARRAY_TYPES, connect, create_pool, pool_options
from tests.security.conftest import MakeRole
from tests.support.exact_calls import (
    BOUND_TO,
    SHADOW_SCHEMA,
    STORED_EXPRESSIONS,
    Catalog,
    Literal,
    ParseTrees,
    Planted,
    covered_by,
    plant_shadows,
    product_sql,
    shadow_hits,
    source_literals,
)
from tests.support.node_trees import read_tree, resolved_oids
from tests.support.roles import grant
from tests.support.services import (
    PostgresServer,
    drop_database,
    scratch_database,
    with_database,
)

SHADOWED_PATH = f"public, {SHADOW_SCHEMA}"

# Statements that cannot be prepared, and why no shadow can take a call in them: each is
# also run with the shadows on its path (test_utility_statements_run_under_the_shadows).
UTILITY: dict[str, str] = {
    "relay.sql.ASYNC_COMMIT": "SET LOCAL of a setting to a literal: no expression",
    "pgconnect._CATALOG_ONLY": "SET LOCAL of a setting to a literal: no expression",
    "health.probing._SAVEPOINT": "a savepoint, by name: no expression",
    "health.probing._RELEASE": "a savepoint, by name: no expression",
    "health.probing._ROLLBACK": "a savepoint, by name: no expression",
    "health.families.completion_tracker.GENERIC_PLAN_TRANSACTION": (
        "BEGIN, and SET LOCAL of a setting to a literal: no expression"
    ),
    "migrations.runner._CREATE_RECORD": (
        "CREATE TABLE IF NOT EXISTS: its one call, clock_timestamp() in a default, takes no "
        "argument, and no signature is more exact than no arguments"
    ),
}

# Literals that read as SQL but that no database runs.
NOT_RUN: dict[tuple[str, str], str] = {
    ("migrations/grants.py", "{} may create objects in schema"): (
        "grant's warning, which quotes the REVOKE an operator may run"
    ),
    ("migrations/grants.py", "INSERT({})"): "the privilege notation of docs/security.md",
    ("migrations/grants.py", "UPDATE({})"): "the privilege notation of docs/security.md",
    ("migrations/runner.py", "CREATE\\s+INDEX"): (
        "a regular expression that finds a migration file's index builds"
    ),
}


def built_statements() -> dict[str, str]:
    """What the product's statement builders produce, with why they call nothing: grant's
    privilege statements (they name objects, roles and privileges; nothing in them is
    resolved as a function or an operator, and the trigger functions they name are
    qualified and take no argument) and the runner's cleanup of an interrupted index build
    (it names one index)."""
    facts = SchemaFacts(
        schema="public",
        grantable=frozenset(),  # every object left to its owner: each statement is there
        owners={},
        role_has_schema_usage=False,
        role_reads_all_stats=False,
        database="app",
        role_settings=(),
        may_alter_role=False,
        schema_creators=(),
    )
    script = render_script(plan_grants("app_role", PARTS, facts))
    routed = render_script(
        plan_grants("app_role", PARTS, facts, WriterRoutes(("order",), ("orders.",)))
    )
    return {
        "migrations.grants.render_script": script,
        "migrations.grants.render_script (an event writer's routes)": routed,
        "migrations.runner._run_without_transaction": (
            "DROP INDEX CONCURRENTLY IF EXISTS public.outbox_pending_key_seq_idx"
        ),
    }


@dataclass
class Inventory:
    """Every SQL text of the product, what each is, and what each statement resolved."""

    server: str
    constants: dict[str, str]
    literals: list[Literal]
    statements: dict[str, str] = field(default_factory=dict)  # prepared, by name
    not_prepared: dict[str, str] = field(default_factory=dict)  # name: why
    hits: dict[str, list[str]] = field(default_factory=dict)  # name: shadows resolved
    introspected: list[str] = field(default_factory=list)  # the driver asked about a type
    # on a connection of the product's pools, and on one of pgconnect.connect
    planted: Planted = field(default_factory=Planted)
    planted_lines: list[str] = field(default_factory=list)

    def module_of(self, name: str) -> str:
        return _module_of(name)

    def report(self, names: list[str]) -> str:
        lines = [f"on {self.server}:"]
        for name in names:
            found = self.hits.get(name, [])
            lines.append(f"  {name}: {'; '.join(found) if found else 'exact'}")
        lines.append(f"planted in {SHADOW_SCHEMA} ({len(self.planted.shadows)} objects):")
        lines += [f"  {line}" for line in self.planted_lines]
        return "\n".join(lines)


async def _inventory(url: str, server: str) -> Inventory:
    inventory = Inventory(server, product_sql(), source_literals())
    plain = await asyncpg.connect(url, statement_cache_size=0)
    shadowed = await asyncpg.connect(
        url, statement_cache_size=0, server_settings={"search_path": SHADOWED_PATH}
    )
    # As the product opens its connections (pgconnect), with the shadows on the path.
    settings = {"search_path": SHADOWED_PATH}
    pool = await create_pool(
        url, min_size=1, max_size=1, **pool_options(settings, transaction_pooler=False)
    )
    single = await connect(url, server_settings=settings)
    try:
        reader = ParseTrees(plain)
        trees: dict[str, Any] = {}
        for name, text in sorted(inventory.constants.items()):
            try:
                trees[name] = await reader.tree(text)
            except asyncpg.PostgresError as exc:
                inventory.not_prepared[name] = f"{exc.sqlstate} {exc}"
                continue
            inventory.statements[name] = text
        known = set(inventory.constants.values())
        for literal in inventory.literals:
            if literal.template or literal.text in known:
                continue
            try:
                trees[literal.where] = await reader.tree(literal.text)
            except asyncpg.PostgresError:
                continue  # a fragment or a utility statement: covered or listed, or it fails
            inventory.statements[literal.where] = literal.text
        catalog = await Catalog.read(plain)
        inventory.planted = await plant_shadows(plain, trees.values(), catalog)
        inventory.planted_lines = inventory.planted.summary(catalog)
        resolver = ParseTrees(shadowed)
        for name, text in inventory.statements.items():
            try:
                tree = await resolver.tree(text)
            except asyncpg.PostgresError as exc:
                # It prepared without them: a shadow changed what a call resolves to.
                inventory.hits[name] = [f"no longer prepares: {exc.sqlstate} {exc}"]
                continue
            inventory.hits[name] = shadow_hits(tree, inventory.planted)
        async with pool.acquire() as pooled:
            for driven in (ParseTrees(pooled), ParseTrees(single)):
                for name, text in inventory.statements.items():
                    if await driven.driver_queries(text):
                        inventory.introspected.append(name)
                driven.stop()
        # The scoring writer runs on its caller's connections, which learnt nothing of ours.
        caller = ParseTrees(shadowed)
        for name, text in inventory.statements.items():
            if name.startswith("scoring.") and await caller.driver_queries(text):
                inventory.introspected.append(f"{name} (on a caller's connection)")
    finally:
        await single.close()
        await pool.close()
        await shadowed.close()
        await plain.close()
    return inventory


@pytest_asyncio.fixture(scope="module")
async def inventory(pg_server: PostgresServer, template_database: str) -> AsyncIterator[Inventory]:
    """The product's SQL on this server, resolved with and without the shadows (once per
    module: planting takes a second)."""
    name = await scratch_database(pg_server.url, template_database)
    try:
        yield await _inventory(with_database(pg_server.url, name), pg_server.name)
    finally:
        await drop_database(pg_server.url, name)


def _module_of(name: str) -> str:
    """The module of a statement's name: ``module.NAME``, or ``path:line`` of a literal."""
    if ":" in name:
        return name.split(":")[0].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return name.rsplit(".", 1)[0]


def _modules() -> list[str]:
    """The product's modules that hold SQL, for one test case each."""
    names = {_module_of(name) for name in product_sql()}
    return sorted(names | {_module_of(literal.where) for literal in source_literals()})


def test_every_sql_text_of_the_product_is_a_statement_a_part_of_one_or_listed(
    inventory: Inventory,
) -> None:
    statements = list(inventory.statements.values())
    built = built_statements()
    utility = {name: inventory.constants[name] for name in UTILITY if name in inventory.constants}
    assert utility.keys() == UTILITY.keys(), (
        f"listed as utility but no such statement: {sorted(UTILITY.keys() - utility.keys())}"
    )
    uncovered = [
        f"{name}: does not prepare ({inventory.not_prepared[name]}) and is part of no statement"
        for name, text in sorted(inventory.constants.items())
        if name in inventory.not_prepared
        and name not in UTILITY
        and not covered_by(text, statements)
    ]
    not_run_seen: set[tuple[str, str]] = set()
    for literal in inventory.literals:
        path = literal.where.split(":")[0]
        listed = [key for key in NOT_RUN if key[0] == path and literal.text.startswith(key[1])]
        if listed:
            not_run_seen.update(listed)
            continue
        if literal.where in inventory.statements:
            continue
        if not covered_by(literal.text, [*statements, *utility.values(), *built.values()]):
            uncovered.append(f"{literal.where}: {literal.text[:80]!r} is part of no statement")
    assert not uncovered, "\n".join(uncovered)
    assert not_run_seen == NOT_RUN.keys(), f"stale: {sorted(NOT_RUN.keys() - not_run_seen)}"
    # Each builder's output is made of the product's literals (it is what they build).
    for name, text in built.items():
        assert any(
            literal.template and covered_by(literal.text, [text]) for literal in inventory.literals
        ), name


@pytest.mark.parametrize("module", _modules())
def test_statements_resolve_every_call_to_pg_catalog(inventory: Inventory, module: str) -> None:
    names = sorted(n for n in inventory.statements if inventory.module_of(n) == module)
    if not names:
        pytest.skip(f"{module} holds parts of statements only; they are checked in those")
    offending = [name for name in names if inventory.hits[name]]
    assert not offending, (
        f"{len(offending)} statement(s) of {module} call what a shadow takes:\n"
        + inventory.report(names)
    )


def test_no_statement_has_the_driver_look_up_a_type(inventory: Inventory) -> None:
    # asyncpg asks PostgreSQL about a type it has no codec for (an array, a composite, a
    # domain, an enum) with a query of its own, on the same connection and path, whose calls
    # are not exact: a shadow of <>(oid, integer) runs in it. The product's connections
    # learn the array types its statements use first, with pg_catalog alone on the path
    # (pgconnect.learn_types), so that query never runs on a path another role can reach.
    assert inventory.introspected == [], (
        f"the driver looks up a type for these statements: {sorted(set(inventory.introspected))}; "
        f"pgconnect.ARRAY_TYPES ({', '.join(ARRAY_TYPES)}) lacks one they use"
    )


async def test_a_cast_on_the_constant_is_what_makes_the_call_exact(
    pg_server: PostgresServer, template_database: str
) -> None:
    name = await scratch_database(pg_server.url, template_database)
    url = with_database(pg_server.url, name)
    try:
        conn = await asyncpg.connect(url, statement_cache_size=0)
        try:
            reader = ParseTrees(conn)
            texts = [
                "SELECT hashtextextended($1::text, 0)",
                "SELECT hashtextextended($1::text, 0::bigint)",
            ]
            trees = [await reader.tree(text) for text in texts]
            planted = await plant_shadows(conn, trees, await Catalog.read(conn))
            await conn.execute(f"SET search_path = {SHADOWED_PATH}")
            loose, exact = [shadow_hits(await reader.tree(text), planted) for text in texts]
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server.url, name)
    assert loose == ["hashtextextended(text, integer)"]
    assert exact == []


async def test_utility_statements_run_under_the_shadows(
    pg_server: PostgresServer, template_database: str
) -> None:
    name = await scratch_database(pg_server.url, template_database)
    url = with_database(pg_server.url, name)
    constants = product_sql()
    try:
        conn = await asyncpg.connect(url, statement_cache_size=0)
        try:
            reader = ParseTrees(conn)
            # Shadows for every name the product calls, as the inventory plants them.
            trees = []
            for text in constants.values():
                with contextlib.suppress(asyncpg.PostgresError):  # fragments and utilities
                    trees.append(await reader.tree(text))
            planted = await plant_shadows(conn, trees, await Catalog.read(conn))
            await conn.execute(
                f"CREATE SCHEMA exact_record; SET search_path = exact_record, {SHADOWED_PATH}"
            )
            # The runner's record, made afresh in a schema of its own: its default depends
            # on pg_catalog alone.
            await conn.execute(constants["migrations.runner._CREATE_RECORD"])
            bound = await conn.fetch(BOUND_TO, list(planted.labels))
            assert bound == []
            await conn.execute(
                constants["health.families.completion_tracker.GENERIC_PLAN_TRANSACTION"]
            )
            for statement in ("_SAVEPOINT", "_ROLLBACK", "_RELEASE"):
                await conn.execute(constants[f"health.probing.{statement}"])
            await conn.execute(constants["relay.sql.ASYNC_COMMIT"])
            await conn.execute(constants["pgconnect._CATALOG_ONLY"])
            await conn.execute("ROLLBACK")
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server.url, name)


# -- the review's own shadows ------------------------------------------------------------------------
# What the second security review planted (N6) in public, as a role with CREATE there, and
# the statements it caught with them, with the part whose role ran each.
_REVIEW_SHADOWS = """
CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint
    IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted code ran as %', current_user; END $$;
CREATE FUNCTION public.planted_divide(integer, numeric) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted code ran as %', current_user; END $$;
CREATE OPERATOR public./ (LEFTARG = integer, RIGHTARG = numeric, FUNCTION = public.planted_divide);
CREATE FUNCTION public.planted_multiply(numeric, integer) RETURNS numeric LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'planted code ran as %', current_user; END $$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.planted_multiply);
"""
_REVIEW_CAUGHT = {
    "relay.sql.FETCH_READY": "relay",
    "relay.sql.RECORD_FAILED": "relay",
    "health.families.relay.RELAY_PROBE": "sidecar",
    "scoring.sql.CLAIM_NEXT_DUE_SQL": "writer",
}
_PLANTED_NAMES = re.compile(r"\b(hashtextextended|planted_divide|planted_multiply)\b")


@pytest.mark.parametrize("statement", sorted(_REVIEW_CAUGHT))
async def test_the_statements_the_review_caught_miss_its_shadows(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, statement: str
) -> None:
    attacker = await make_role("planter")
    await db.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker.name}"')
    conn = await asyncpg.connect(attacker.url)
    try:
        await conn.execute(_REVIEW_SHADOWS)
    finally:
        await conn.close()
    part = _REVIEW_CAUGHT[statement]
    role = await make_role(part)
    await grant(database_url, role.name, part)
    planted = {
        row[0]: row[1]
        for row in await db.fetch(
            "SELECT p.oid, p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = 'public'::regnamespace AND p.proowner = $1::regrole "
            "UNION ALL SELECT o.oid, o.oid::regoperator::text FROM pg_operator o "
            "WHERE o.oprnamespace = 'public'::regnamespace",
            attacker.name,
        )
    }
    assert len(planted) == 5  # three functions, two operators
    # As the part's role, on the search_path grant gave it (the schema the shadows are in).
    conn = await asyncpg.connect(role.url, statement_cache_size=0)
    try:
        assert await conn.fetchval("SHOW search_path") == "public"
        tree = await ParseTrees(conn).tree(product_sql()[statement])
    finally:
        await conn.close()
    resolved = sorted(planted[oid] for oid in resolved_oids(tree) if oid in planted)
    assert resolved == [], f"{statement}, as the {part}'s role, resolves {resolved}"


# -- the migrations ----------------------------------------------------------------------------------
# Applied migrations cannot change, and three of their expressions need a conversion: migrating
# a database while a shadow of them is on the migrating session's path stores the shadow in
# the schema (docs/security.md says when that can happen, and what stops it). Every other
# stored expression, and every one a new migration adds, must bind to pg_catalog.
MIGRATION_RESIDUE: dict[str, set[str]] = {
    # 0001: jsonb_path_exists(headers, '$.* ? …'), the path an unknown literal
    "constraint outbox_headers_check on table outbox": {
        "jsonb_path_exists(target jsonb, path text, vars jsonb, silent boolean)"
    },
    # 0007: hashtextextended(aggregateid, 0)
    "index outbox_pending_key_seq_idx": {"hashtextextended(text, integer)"},
}
# 0005 before PostgreSQL 18: the UUIDv7 default of built-ins (from 18 it is uuidv7()).
MIGRATION_RESIDUE_BEFORE_18: dict[str, set[str]] = {
    "default value for column id of table outbox": {
        "operator * (numeric, integer)",
        "set_bit(bytea, integer, integer)",
    },
}


async def test_migrations_store_expressions_that_call_pg_catalog(
    pg_server: PostgresServer, template_database: str
) -> None:
    # What the migrated schema stores, read from a migrated database.
    template = await asyncpg.connect(with_database(pg_server.url, template_database))
    try:
        stored = await template.fetch(STORED_EXPRESSIONS, "public")
    finally:
        await template.close()
    trees = [read_tree(row[1]) for row in stored]
    assert len(trees) >= 10, stored
    # A new database, the shadows of those calls planted, then migrated with them on its path.
    name = await scratch_database(pg_server.url, "template0")
    url = with_database(pg_server.url, name)
    try:
        conn = await asyncpg.connect(url)
        try:
            catalog = await Catalog.read(conn)
            planted = await plant_shadows(conn, trees, catalog, immutable=True)
        finally:
            await conn.close()
        conn = await asyncpg.connect(url, server_settings={"search_path": SHADOWED_PATH})
        try:
            await apply(conn, load_migrations())
            version = int(await conn.fetchval("SHOW server_version_num"))
            bound: dict[str, set[str]] = {}
            for what, shadow in await conn.fetch(BOUND_TO, list(planted.labels)):
                bound.setdefault(what, set()).add(planted.labels[shadow])
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server.url, name)
    expected = MIGRATION_RESIDUE | (MIGRATION_RESIDUE_BEFORE_18 if version < 180000 else {})
    assert bound == expected, "\n".join(
        [f"{what}: {'; '.join(sorted(shadows))}" for what, shadows in sorted(bound.items())]
        + ["planted:", *planted.summary(catalog)]
    )
