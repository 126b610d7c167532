"""PostgreSQL's plans, as ``EXPLAIN (FORMAT JSON)`` gives them, for tests that read them."""

from __future__ import annotations

from typing import Any

import asyncpg


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and every node beneath it, parents before their children."""
    return [node, *(n for child in node.get("Plans", []) for n in plan_nodes(child))]


def blocks_read(node: dict[str, Any]) -> int:
    """The shared buffers ``node`` and its children read, from cache or not, as ``EXPLAIN
    (ANALYZE, BUFFERS)`` counts them."""
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


# The states a minute's autovacuum can leave the outbox's statistics in while the relay
# keeps up (how, live rows): a heap of pages the relay emptied with a few live rows in it,
# analyzed after a vacuum or with the rows the relay deleted since still in it; right after
# a catch-up, the statistics still counting the backlog; and an empty outbox.
OUTBOX_STATISTICS = {
    "one_live_row": ("vacuum", 1),
    "a_few_live_rows": ("vacuum", 4),
    "a_few_live_rows_among_dead_ones": ("analyze", 4),
    "a_hundred_live_rows": ("vacuum", 100),
    "counting_a_backlog": ("stale", 4),
    "empty": ("vacuum", 0),
}


async def stage_outbox_statistics(db: asyncpg.Connection, how: str, live: int) -> None:
    """30,000 rows of about 1 KiB on 1,000 keys, all but the newest ``live`` deleted
    oldest first as the relay deletes what it published, and the statistics ``how``."""
    await db.execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
    await db.execute(
        """INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
           SELECT 'order', 'k' || (g % 1000), 'created',
                  jsonb_build_object('fill', repeat(md5(g::text), 30))
           FROM generate_series(1, 30000) AS g"""
    )
    if how == "stale":
        await db.execute("ANALYZE outbox")
    await db.execute("DELETE FROM outbox WHERE seq <= (SELECT max(seq) FROM outbox) - $1", live)
    if how == "vacuum":
        await db.execute("VACUUM (ANALYZE) outbox")
    elif how == "analyze":
        await db.execute("ANALYZE outbox")
