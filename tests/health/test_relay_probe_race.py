"""A transaction that begins while the relay probe runs is not "in the future".

The probe's clock is its statement's start. A transaction that locks the outbox after that
instant, but before the probe reads ``pg_locks`` and ``pg_stat_activity``, has an
``xact_start`` later than the probe's clock, and the relay family's future-timestamp guard
turned it ``unknown``: a false alarm.

This test stages the interleaving on the real server, deterministically. The probe's
connection resolves ``relay_instance`` through a view in a schema of its own, placed first on
its search path. The view waits on an advisory lock that the test holds, so the probe is held
mid-statement, after its clock was read and before the lock catalog is read. While it waits,
another session begins a transaction on the outbox. Then the gate opens.
"""

from __future__ import annotations

import asyncio

import asyncpg

from contracts.health import Classification
from health.families.relay import classify_relay, probe_relay
from tests.support.policies import relay_policy

GATE_KEY = 727_271


async def _wait_until_blocked(observer: asyncpg.Connection, pid: int) -> None:
    for _ in range(500):
        waiting = await observer.fetchval(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
        )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the probe never reached the gate")


async def test_a_transaction_begun_mid_probe_is_no_older_than_now(
    db: asyncpg.Connection, database_url: str
) -> None:
    await db.execute(
        f"""
        CREATE SCHEMA probe_gate;
        CREATE FUNCTION probe_gate.pass() RETURNS boolean LANGUAGE plpgsql VOLATILE AS
            $$ BEGIN PERFORM pg_advisory_xact_lock({GATE_KEY}); RETURN true; END $$;
        CREATE VIEW probe_gate.relay_instance AS
            SELECT * FROM public.relay_instance WHERE (SELECT probe_gate.pass());
        """
    )
    probe_conn = await asyncpg.connect(
        database_url, server_settings={"search_path": "probe_gate, public"}
    )
    gatekeeper = await asyncpg.connect(database_url)
    latecomer = await asyncpg.connect(database_url)
    try:
        await gatekeeper.execute("BEGIN")
        await gatekeeper.execute("SELECT pg_advisory_xact_lock($1)", GATE_KEY)
        policy = relay_policy()
        probe = asyncio.create_task(probe_relay(probe_conn, policy))
        await _wait_until_blocked(db, probe_conn.get_server_pid())

        # Begins after the probe's clock was read, and holds a lock on the outbox.
        await latecomer.execute("BEGIN")
        await latecomer.execute("SELECT 1 FROM outbox LIMIT 1")
        await gatekeeper.execute("COMMIT")

        evidence = await asyncio.wait_for(probe, 10)
        await latecomer.execute("COMMIT")
    finally:
        for conn in (probe_conn, gatekeeper, latecomer):
            await conn.close()

    classification, reasons = classify_relay(evidence, policy)
    assert classification is not Classification.UNKNOWN, reasons
    # Counted, and dated no later than the observation: at most that old, never newer.
    assert evidence.blocking_transaction_count == 1
    assert evidence.observed_at_unix_ms is not None
    assert evidence.oldest_blocking_transaction_started_at_unix_ms == evidence.observed_at_unix_ms
