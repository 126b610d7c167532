"""Names the schema's functions resolve cannot be taken over by a neighbour.

Real PostgreSQL (each server of the run). A role that may create objects in a schema on an
inserting session's search_path defines an operator that fits the NOTIFY trigger's call
better than PostgreSQL's own; it must never run.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from tests.security.conftest import MakeRole
from tests.security.roles import grant

# Raises with the identity it runs under: the test sees whose transaction it entered.
_SHADOW = """
CREATE FUNCTION {schema}.shadow_concat(bigint, text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'shadowing operator called by %', current_user;
END
$$;
CREATE OPERATOR {schema}.|| (LEFTARG = bigint, RIGHTARG = text, FUNCTION = {schema}.shadow_concat);
"""


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

    writer = await make_role("writer")
    await grant(database_url, writer.name, "writer")
    settings = {"search_path": session_path} if session_path else {}
    for n, url in enumerate((database_url, writer.url)):
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
        assert "search_path=pg_catalog, pg_temp" in (row["proconfig"] or []), row["proname"]
