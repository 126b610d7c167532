"""What the development servers must offer beyond the schema (scripts/services declares it).

The benchmarks measure the relay's hot statements where they run
(docs/benchmarks.md#one-events-latency): on every server the suite and ``make bench`` use,
``pg_stat_statements`` has to be preloaded, or the breakdown can only say the server's
cost is unknown.
"""

from __future__ import annotations

import asyncpg

from tests.support.services import PostgresServer


async def test_every_server_measures_its_statements(
    pg_server: PostgresServer, database_url: str
) -> None:
    conn = await asyncpg.connect(database_url)
    try:
        preloaded = await conn.fetchval("SELECT current_setting('shared_preload_libraries')")
        assert "pg_stat_statements" in [name.strip() for name in preloaded.split(",")], (
            f"{pg_server.name} does not preload pg_stat_statements: {preloaded!r}"
        )
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT 1 AS outbox_relay_measured_statement")
        calls = await conn.fetchval(
            "SELECT sum(s.calls) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = current_database()"
            " AND s.query LIKE '%outbox_relay_measured_statement%'"
        )
        assert calls and calls >= 1
    finally:
        await conn.close()
