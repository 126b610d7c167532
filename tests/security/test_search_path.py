"""Names the schema's functions and its roles resolve cannot be taken over by a neighbour.

Real PostgreSQL (each server of the run). A role that may create objects in a schema on an
inserting session's search_path defines an operator that fits the NOTIFY trigger's call
better than PostgreSQL's own; it must never run. ``grant`` pins each part's role to the
relay's schema, and ``grant`` and ``check`` warn when others may create in that schema.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
import pytest_asyncio

from migrations.grants import (
    FUNCTIONS,
    PUBLIC_FUNCTIONS,
    SCORING_FUNCTIONS_OWNER,
    plan_grants,
    read_facts,
    render_script,
)
from migrations.runner import apply, load_migrations
from tests.security.conftest import MakeRole
from tests.security.process import POLICY_OUTBOX_ONLY, policy_file, run_cli
from tests.support.roles import create_login_role, drop_role, grant

# Raises with the identity it runs under: the test sees whose transaction it entered.
_SHADOW = """
CREATE FUNCTION {schema}.shadow_concat(bigint, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'shadowing operator called by %', current_user;
END
$$;
CREATE OPERATOR {schema}.|| (LEFTARG = bigint, RIGHTARG = text, FUNCTION = {schema}.shadow_concat);
"""


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@pytest_asyncio.fixture
async def listener(database_url: str) -> AsyncIterator[asyncio.Queue[str]]:
    """The relay's channel, heard on a connection of its own."""
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(database_url)
    await conn.add_listener("outbox_relay", lambda *args: heard.put_nowait(args[3]))
    try:
        yield heard
    finally:
        await conn.close()


@pytest.mark.parametrize("where", ["public", "a schema of its own"])
async def test_a_shadowing_operator_is_never_called_by_an_insert(
    db: asyncpg.Connection,
    database_url: str,
    make_role: MakeRole,
    listener: asyncio.Queue[str],
    where: str,
) -> None:
    attacker = await make_role("shadow")
    if where == "public":
        # PostgreSQL 14 and older let PUBLIC do this by default.
        schema = "public"
        await db.execute(f'GRANT CREATE ON SCHEMA public TO "{attacker.name}"')
        session_path = None
    else:
        schema = f"shadow_{uuid.uuid4().hex[:8]}"
        await db.execute(f'CREATE SCHEMA {schema} AUTHORIZATION "{attacker.name}"')
        session_path = f"{schema}, public"
    as_attacker = await asyncpg.connect(attacker.url)
    try:
        if where != "public":
            await as_attacker.execute(f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC")
        await as_attacker.execute(_SHADOW.format(schema=schema))
    finally:
        await as_attacker.close()

    writer, event_writer = await make_role("writer"), await make_role("evw")
    await grant(database_url, writer.name, "writer")
    await grant(database_url, event_writer.name, "event-writer")
    settings = {"search_path": session_path} if session_path else {}
    for n, url in enumerate((database_url, writer.url, event_writer.url)):
        conn = await asyncpg.connect(url, server_settings=settings)
        try:
            # The operator fits this session's own expressions: the shadow is in place.
            with pytest.raises(asyncpg.RaiseError, match="shadowing operator called"):
                await conn.fetchval("SELECT 1::bigint || 'x'")
            await conn.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type) "
                "VALUES ('order', $1, 'order.placed')",
                f"order-{n}",
            )
        finally:
            await conn.close()
        seq = await db.fetchval("SELECT seq FROM outbox WHERE aggregateid = $1", f"order-{n}")
        assert await asyncio.wait_for(listener.get(), timeout=10) == f"{seq},{seq}"


async def test_every_function_of_the_schema_pins_its_search_path(db: asyncpg.Connection) -> None:
    rows = await db.fetch(
        "SELECT p.proname, p.proconfig FROM pg_proc p "
        "WHERE p.pronamespace = 'public'::regnamespace "
        "AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')"
    )
    assert {r["proname"] for r in rows} >= {"outbox_relay_notify", "outbox_relay_guard_insert"}
    for row in rows:
        # pg_catalog first and pg_temp last; a function that reads the relay's tables names
        # their schema between the two (migration 0011), and no other
        assert {"search_path=pg_catalog, pg_temp", "search_path=pg_catalog, public, pg_temp"} & set(
            row["proconfig"] or []
        ), row["proname"]


async def _role_settings(conn: asyncpg.Connection, role: str) -> list[str]:
    settings = await conn.fetchval(
        "SELECT s.setconfig FROM pg_db_role_setting s "
        "JOIN pg_roles r ON r.oid = s.setrole "
        "JOIN pg_database d ON d.oid = s.setdatabase "
        "WHERE r.rolname = $1 AND d.datname = current_database()",
        role,
    )
    return list(settings or [])


@pytest.mark.parametrize("part", ["writer", "event-writer", "relay", "sidecar"])
async def test_grant_pins_the_roles_search_path_in_this_database(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, part: str
) -> None:
    role = await make_role(part.replace("-", ""))
    await grant(database_url, role.name, part)
    assert await _role_settings(db, role.name) == ["search_path=public"]
    conn = await asyncpg.connect(role.url)
    try:
        assert await conn.fetchval("SHOW search_path") == "public"
    finally:
        await conn.close()
    # Again: nothing to change, and the plan says so.
    plan = plan_grants(role.name, (part,), await read_facts(db, role.name))
    assert not any("search_path" in s for s in plan.statements)
    assert not any("search_path" in s for step in plan.privileged_steps for s in step.statements)


async def test_a_schema_not_public_is_the_only_one_on_the_roles_path(
    empty_database_url: str,
) -> None:
    # A schema whose name needs quoting; the relay's objects are there and nowhere else.
    schema = "Outbox App"
    database = _database(empty_database_url)
    admin = await asyncpg.connect(empty_database_url)
    role = await create_login_role(admin, empty_database_url, "app")
    try:
        await admin.execute(f'CREATE SCHEMA "{schema}"')
        await admin.execute(f'ALTER DATABASE "{database}" SET search_path = "{schema}"')
        migrating = await asyncpg.connect(empty_database_url)
        try:
            await apply(migrating, load_migrations())
        finally:
            await migrating.close()
        done = run_cli(
            "grant", "--database-url", empty_database_url, "--to", role.name, "--as", "writer"
        )
        assert done.returncode == 0, done.stderr
        assert await _role_settings(admin, role.name) == [f'search_path="{schema}"']
        # Without the database's default the role still finds the outbox, and only there.
        await admin.execute(f'ALTER DATABASE "{database}" RESET search_path')
        conn = await asyncpg.connect(role.url)
        try:
            assert await conn.fetchval("SHOW search_path") == f'"{schema}"'
            await conn.execute(
                "INSERT INTO outbox (aggregatetype, aggregateid, type) "
                "VALUES ('order', 'order-app', 'order.placed')"
            )
        finally:
            await conn.close()
        assert await admin.fetchval(f'SELECT count(*) FROM "{schema}".outbox') == 1
    finally:
        await drop_role(admin, role.name)
        await admin.close()


async def test_a_session_that_may_not_alter_the_role_leaves_that_step_to_one_who_may(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # Production: the schema owner runs grant, and it is neither a superuser nor CREATEROLE.
    owner = await make_role("owner")
    relay = await make_role("relay")
    await db.execute(f'GRANT CREATE ON DATABASE "{_database(database_url)}" TO "{owner.name}"')
    await db.execute(f'ALTER SCHEMA public OWNER TO "{owner.name}"')
    for (name,) in await db.fetch(
        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
        "AND relkind IN ('r', 'p')"
    ):
        await db.execute(f'ALTER TABLE {name} OWNER TO "{owner.name}"')
    for function in (*FUNCTIONS, *PUBLIC_FUNCTIONS):
        await db.execute(f'ALTER FUNCTION {function} OWNER TO "{owner.name}"')
    # The scoring functions stay with their own NOLOGIN owner; a schema owner that runs
    # migrate is a member of it (migration 0012 needs that, or a superuser).
    await db.execute(f'GRANT {SCORING_FUNCTIONS_OWNER} TO "{owner.name}"')

    conn = await asyncpg.connect(owner.url)
    try:
        plan = plan_grants(relay.name, ("relay",), await read_facts(conn, relay.name))
    finally:
        await conn.close()
    assert plan.owner_steps == ()
    statement = f'ALTER ROLE "{relay.name}" IN DATABASE "{_database(database_url)}" SET search_path = public'
    steps = [step for step in plan.privileged_steps if statement in step.statements]
    assert len(steps) == 1, plan.privileged_steps
    assert "CREATEROLE" in steps[0].reason and "search_path" in steps[0].reason
    assert statement not in plan.statements
    script = render_script(plan).splitlines()
    assert script.index(f"{statement};") > script.index("COMMIT;")

    done = run_cli("grant", "--database-url", owner.url, "--to", relay.name, "--as", "relay")
    assert done.returncode == 0, done.stderr
    assert f"  {statement};" in done.stdout.splitlines()
    assert await _role_settings(db, relay.name) == []
    await db.execute(statement)  # as a superuser, the step it printed
    assert await _role_settings(db, relay.name) == ["search_path=public"]
    # The schema goes back to its first owner: the scoring functions' owner has objects in
    # it, which dropping the test's owner role must not try to take with the schema.
    await db.execute("ALTER SCHEMA public OWNER TO pg_database_owner")


@pytest.mark.parametrize(
    ("createrole", "admin"), [(False, False), (True, False), (True, True), (False, True)]
)
async def test_whether_a_session_may_alter_the_role_is_what_the_server_says(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, createrole: bool, admin: bool
) -> None:
    # The rule differs by version (ADMIN on the role from PostgreSQL 16): grant must place
    # the statement where it runs, never in a transaction it would fail.
    session, target = await make_role("granter"), await make_role("target")
    if createrole:
        await db.execute(f'ALTER ROLE "{session.name}" CREATEROLE')
    if admin:
        await db.execute(f'GRANT "{target.name}" TO "{session.name}" WITH ADMIN OPTION')
    conn = await asyncpg.connect(session.url)
    try:
        facts = await read_facts(conn, target.name)
        try:
            async with conn.transaction():
                await conn.execute(
                    f'ALTER ROLE "{target.name}" IN DATABASE "{_database(database_url)}" '
                    "SET search_path = public"
                )
                raise _Undo
        except _Undo:
            allowed = True
        except asyncpg.InsufficientPrivilegeError:
            allowed = False
    finally:
        await conn.close()
    assert facts.may_alter_role is allowed
    # And a role may always set its own.
    conn = await asyncpg.connect(target.url)
    try:
        assert (await read_facts(conn, target.name)).may_alter_role
    finally:
        await conn.close()


class _Undo(Exception):
    pass


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "may create objects in schema" in line]


async def test_grant_and_check_warn_while_others_may_create_in_the_schema(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, tmp_path: Path
) -> None:
    role = await make_role("sidecar")
    other = await make_role("other")
    policy = policy_file(tmp_path, POLICY_OUTBOX_ONLY)

    def grant_cli() -> tuple[int, str]:
        done = run_cli(
            "grant", "--database-url", database_url, "--to", role.name, "--as", "sidecar"
        )
        return done.returncode, done.stderr

    def check_cli() -> tuple[int, str, str]:
        done = run_cli("check", "--database-url", database_url, "--policy", policy)
        return done.returncode, done.stdout, done.stderr

    # PostgreSQL 15's default: only the schema's owner creates in public.
    await db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    assert grant_cli() == (0, "")
    code, report, stderr = check_cli()
    assert (code, stderr) == (0, ""), report

    cases = [
        ("GRANT CREATE ON SCHEMA public TO PUBLIC", "PUBLIC"),
        (f'GRANT CREATE ON SCHEMA public TO "{other.name}"', other.name),
    ]
    for statement, named in cases:
        await db.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        await db.execute(f'REVOKE CREATE ON SCHEMA public FROM "{other.name}"')
        await db.execute(statement)
        code, stderr = grant_cli()
        assert code == 0, stderr
        (line,) = stderr.splitlines()
        assert line.startswith("outbox-relay: warning: ") and named in line, line
        assert "REVOKE CREATE ON SCHEMA public FROM" in line, line
        code, report, stderr = check_cli()
        assert code == 0, report  # a warning, not a failure
        json.loads(report)
        (line,) = stderr.splitlines()
        assert len(_warnings(line)) == 1, line
        # Aggregates only from the health side: how many, never who.
        assert other.name not in line, line


async def test_grant_print_piped_to_psql_runs_only_the_grant(
    db: asyncpg.Connection, database_url: str
) -> None:
    # A name may hold a line break; in a comment line it would end the comment. Role names
    # are short, so the shell command's marker goes in a short directory of its own.
    tag = uuid.uuid4().hex[:8]
    directory = tempfile.mkdtemp(prefix="or")
    marker = os.path.join(directory, "m")
    names = [
        f"or_sql_{tag}\nCREATE TABLE injected_{tag} (x int);--",
        f"or_sh_{tag}\n\\! touch {marker}",
    ]
    admin = await asyncpg.connect(database_url)
    try:
        for name in names:
            await admin.execute(f'CREATE ROLE "{name}"')
        for name in names:
            _print_grant_into_psql(database_url, name)
        assert await db.fetchval(f"SELECT to_regclass('injected_{tag}')") is None
        assert _created_and_removed(directory) == [], "psql ran the shell command"
        for name in names:
            assert await db.fetchval("SELECT has_table_privilege($1, 'outbox', 'DELETE')", name), (
                "the script did not grant"
            )
    finally:
        _created_and_removed(directory)
        for name in names:
            await drop_role(admin, name)
        await admin.close()


def _print_grant_into_psql(url: str, role: str) -> None:
    printed = run_cli("grant", "--database-url", url, "--to", role, "--as", "relay", "--print")
    assert printed.returncode == 0, printed.stderr
    ran = subprocess.run(
        ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url],
        input=printed.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr


def _created_and_removed(directory: str) -> list[str]:
    """What appeared in ``directory``; the directory is gone afterwards."""
    found = os.listdir(directory) if os.path.isdir(directory) else []
    shutil.rmtree(directory, ignore_errors=True)
    return found
