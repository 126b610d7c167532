"""Lanes: how relay instances split the key space, and the lease keeper that holds them.

A key's lane is fixed by a hash in the outbox table. Each lane is leased to one instance
at a time in ``relay_lane``; the fence grows with every change of owner, and every write
the relay makes for a lane checks owner and fence, so a stale owner changes nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncpg

from pgconnect import pooled
from relay import sql

log = logging.getLogger(__name__)


def fair_share(lane_count: int, live_instances: int) -> int:
    """How many lanes one instance should hold when ``live_instances`` share them."""
    return math.ceil(lane_count / max(live_instances, 1))


def lanes_to_release(held: Iterable[int], target: int) -> list[int]:
    """The highest-numbered lanes beyond the fair share; claims take the lowest free ones."""
    ordered = sorted(held)
    return ordered[target:] if len(ordered) > target else []


@dataclass
class LaneLeases:
    """The lanes this instance holds, with the fence each was taken under."""

    fences: dict[int, int] = field(default_factory=dict)
    # Local monotonic deadline of the last renewal; never trusted past its end.
    valid_until: float = 0.0
    releasing: set[int] = field(default_factory=set)

    def publishable(self, margin_s: float) -> list[int]:
        """Lanes that may start a new send: held, not being released, lease outliving margin."""
        if time.monotonic() + margin_s >= self.valid_until:
            return []
        return sorted(lane for lane in self.fences if lane not in self.releasing)

    def fences_for(self, lanes: Iterable[int]) -> tuple[list[int], list[int]]:
        chosen = sorted(set(lanes) & self.fences.keys())
        return chosen, [self.fences[lane] for lane in chosen]


class LaneKeeper:
    """Heartbeats, renews held leases, claims a fair share and hands back the excess."""

    def __init__(
        self, pool: asyncpg.Pool, *, instance_id: str, ttl_ms: int, topic_template: str
    ) -> None:
        self._pool = pool
        self._instance_id = instance_id
        self._ttl_ms = ttl_ms
        self._topic_template = topic_template
        self._template_writable = True
        self.leases = LaneLeases()

    async def tick(self, *, in_flight_lanes: set[int]) -> None:
        """One round: heartbeat, renew, rebalance. Raises on database errors."""
        started = time.monotonic()
        async with pooled(self._pool) as conn, conn.transaction():
            await self._heartbeat(conn)
            renewed = {
                r["lane"]: r["fence"]
                for r in await conn.fetch(sql.RENEW_LANES, self._instance_id, self._ttl_ms)
            }
            live = await conn.fetchval(sql.LIVE_INSTANCES, self._ttl_ms)
            target = fair_share(sql.LANE_COUNT, live)
            release = [
                lane for lane in lanes_to_release(renewed, target) if lane not in in_flight_lanes
            ]
            if release:
                await conn.execute(sql.RELEASE_LANES, self._instance_id, release)
                for lane in release:
                    renewed.pop(lane)
            claimed: dict[int, int] = {}
            if len(renewed) < target:
                claimed = {
                    r["lane"]: r["fence"]
                    for r in await conn.fetch(
                        sql.CLAIM_LANES, self._instance_id, self._ttl_ms, target - len(renewed)
                    )
                }
            await conn.execute(sql.FORGET_DEAD_INSTANCES, self._ttl_ms * 30)
        lost = self.leases.fences.keys() - renewed.keys() - set(release)
        if lost:
            log.warning("lost lane leases", extra={"lanes": sorted(lost)})
        if claimed:
            log.info("claimed lanes", extra={"lanes": sorted(claimed), "target": target})
        if release:
            log.info("released lanes", extra={"lanes": release, "target": target})
        self.leases.fences = renewed | claimed
        # Lanes beyond the share stop taking new work now and go back once drained.
        self.leases.releasing = set(lanes_to_release(self.leases.fences, target))
        self.leases.valid_until = started + self._ttl_ms / 1000

    async def _heartbeat(self, conn: asyncpg.Connection) -> None:
        if self._template_writable:
            try:
                async with conn.transaction():  # a savepoint: a refusal ends only it
                    await conn.execute(
                        sql.HEARTBEAT_WITH_TEMPLATE, self._instance_id, self._topic_template
                    )
                return
            except asyncpg.InsufficientPrivilegeError:
                self._template_writable = False
                log.warning(
                    "cannot record this instance's topic template; the health sidecar "
                    "holds every held row's key on every topic: run `outbox-relay grant` "
                    "again for the relay's role"
                )
        await conn.execute(sql.HEARTBEAT, self._instance_id)

    async def leave(self) -> None:
        """Give every lane back at once so the others need not wait for expiry."""
        async with pooled(self._pool) as conn, conn.transaction():
            await conn.execute(sql.RELEASE_LANES, self._instance_id, list(self.leases.fences))
            await conn.execute(sql.LEAVE, self._instance_id)
        self.leases = LaneLeases()
