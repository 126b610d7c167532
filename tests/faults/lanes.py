"""What the fault scenarios read of lane ownership and the outbox."""

from __future__ import annotations

from collections.abc import Iterable

import asyncpg

LANE_OF = "SELECT (hashtext($1) & 63)::int"


async def key_in_lanes(conn: asyncpg.Connection, prefix: str, lanes: Iterable[int]) -> str:
    """The first key ``prefix0``, ``prefix1``, … whose lane is one of ``lanes``."""
    wanted = set(lanes)
    for i in range(10_000):
        key = f"{prefix}{i}"
        if await conn.fetchval(LANE_OF, key) in wanted:
            return key
    raise AssertionError("no key found for those lanes")


async def lane_of(conn: asyncpg.Connection, key: str) -> int:
    return int(await conn.fetchval(LANE_OF, key))


async def lane_owner(conn: asyncpg.Connection, lane: int) -> tuple[str | None, int]:
    row = await conn.fetchrow(
        "SELECT owner_id, fence FROM relay_lane WHERE lane = $1 AND "
        "(lease_expires_at IS NULL OR lease_expires_at > clock_timestamp())",
        lane,
    )
    return (None, 0) if row is None else (row["owner_id"], int(row["fence"]))


async def lanes_held(conn: asyncpg.Connection, owner: str) -> int:
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM relay_lane WHERE owner_id = $1 "
            "AND lease_expires_at > clock_timestamp()",
            owner,
        )
    )


async def unpublished(conn: asyncpg.Connection, key: str | None = None) -> int:
    """Rows still in the outbox (quarantined ones included), of one key or all."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM outbox WHERE $1::text IS NULL OR aggregateid = $1", key
        )
    )


async def published_versions(conn: asyncpg.Connection, key: str) -> int:
    return int(
        await conn.fetchval("SELECT count(*) FROM outbox_receipt WHERE aggregateid = $1", key)
    )
