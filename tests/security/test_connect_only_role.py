"""A role that can only connect (no part granted): what it can and cannot do to the relay's
objects. Its notifications are tests/relay/test_neighbours.py's; its hold on the
cluster's NOTIFY queue is tests/health/test_notify_queue.py's. Real PostgreSQL, each server."""

from __future__ import annotations

import asyncio

import asyncpg

from migrations.grants import PUBLIC_FUNCTIONS
from tests.security.conftest import MakeRole
from tests.support import expected_privileges
from tests.support.roles import NONE, grant, privilege_matrix

INSERT = (
    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('a', $1, 't', '{}')"
)


async def test_it_holds_nothing_on_the_relays_objects(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # grant runs after every migrate; it also takes EXECUTE on the trigger functions from
    # PUBLIC. What is left to a role nobody granted anything: the schema's USAGE, which
    # PUBLIC holds on `public`.
    nobody, relay = await make_role("nobody"), await make_role("relay")
    await grant(database_url, relay.name, "relay")
    # (and EXECUTE on the function through which the door reads an inserting role's routes)
    public = {"schema public": "USAGE", **{f"function {f}": "EXECUTE" for f in PUBLIC_FUNCTIONS}}
    assert await privilege_matrix(db, nobody.name) == {
        name: public.get(name, NONE) for name in expected_privileges.RELAY
    }
    conn = await asyncpg.connect(nobody.url)
    try:
        for statement in (
            "SELECT count(*) FROM outbox",
            "SELECT count(*) FROM outbox_receipt",
            "SELECT count(*) FROM scoring_job_state",
            "DELETE FROM outbox",
        ):
            try:
                await conn.execute(statement)
            except asyncpg.InsufficientPrivilegeError:
                continue
            raise AssertionError(f"a role that can only connect ran {statement!r}")
        try:
            await conn.execute(INSERT, "k")
        except asyncpg.InsufficientPrivilegeError:
            pass
        else:
            raise AssertionError("a role that can only connect inserted an event")
    finally:
        await conn.close()


async def test_it_hears_how_many_events_are_written_and_nothing_of_them(
    db: asyncpg.Connection, make_role: MakeRole
) -> None:
    # LISTEN needs no privilege: the relay's wake-ups tell anyone the seq range of every
    # insert (how many events, when), never a key, a type, a topic or a payload.
    nobody = await make_role("listener")
    heard: asyncio.Queue[str] = asyncio.Queue()
    conn = await asyncpg.connect(nobody.url)
    try:
        await conn.add_listener("outbox_relay", lambda *args: heard.put_nowait(args[3]))
        await db.execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload)"
            " SELECT 'a', 'secret-key-' || n, 't', '{}' FROM generate_series(1, 3) AS n"
        )
        async with asyncio.timeout(5):
            payload = await heard.get()
        low, high = (int(part) for part in payload.split(","))
        assert high - low == 2
        assert set(payload) <= set("0123456789,")
    finally:
        await conn.close()
