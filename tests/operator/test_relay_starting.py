"""Right after `run` starts, the relay family says `starting`, never `stalled`."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from contracts.health import Classification, FamilyResult
from contracts.policy import Family
from health.families.relay import while_starting
from health.rules import build_report
from tests.operator.stack import PORT_BASE, Stack, health, instance_id, running
from tests.support.waiting import wait_until_blocking


def _relay(document: dict[str, Any]) -> tuple[str, list[str]]:
    check = document["checks"]["relay:classification"][0]
    return check["classification"], check["reasons"]


async def test_relay_family_is_starting_until_the_relay_had_its_chance_to_claim_lanes(
    stack: Stack, db: asyncpg.Connection
) -> None:
    port = PORT_BASE + 1
    seen: list[tuple[str, list[str]]] = []

    def report(until: str | None) -> bool:
        document = health(port)
        if document is not None:
            seen.append(_relay(document))
        return bool(seen) and (until is None or seen[-1][0] == until)

    # The relay's heartbeat row is written, uncommitted, by this test, so the relay's first
    # lane round waits on it: the sidecar's first evaluations see a fresh database (no
    # heartbeat, 64 unowned lanes) while the relay has not yet had its chance to claim them.
    lanes = db.transaction()
    await lanes.start()
    locked = True
    try:
        await db.execute("INSERT INTO relay_instance (instance_id) VALUES ($1)", instance_id(port))
        with running(stack, port) as process:
            await asyncio.to_thread(
                wait_until_blocking, lambda: report(None), what="a first health report", timeout=90
            )
            first = seen[0]
            await lanes.rollback()
            locked = False
            await asyncio.to_thread(
                wait_until_blocking,
                lambda: report("within_bounds"),
                what="the relay family within bounds",
                timeout=90,
            )
            assert process.poll() is None, stack.log(port)
    finally:
        if locked:
            await lanes.rollback()
    assert first == ("unknown", ["starting"]), seen[:5]
    assert all(classification != "stalled" for classification, _ in seen), seen


@pytest.mark.parametrize(
    ("family", "before", "reasons", "after"),
    [
        (Family.RELAY, Classification.STALLED, ("lanes",), (Classification.UNKNOWN, ("starting",))),
        (Family.RELAY, Classification.UNKNOWN, ("db",), (Classification.UNKNOWN, ("db",))),
        (Family.RELAY, Classification.WITHIN_BOUNDS, (), (Classification.WITHIN_BOUNDS, ())),
        (Family.OUTBOX, Classification.STALLED, ("x",), (Classification.STALLED, ("x",))),
    ],
)
def test_while_starting_turns_only_a_stalled_relay_family_unknown(
    family: Family,
    before: Classification,
    reasons: tuple[str, ...],
    after: tuple[Classification, tuple[str, ...]],
) -> None:
    result = FamilyResult(
        family=family, classification=before, reasons=reasons, gates_readiness=True, evidence=None
    )
    report = while_starting(build_report([result], 1))
    assert (report.families[0].classification, report.families[0].reasons) == after
    assert report.classification is after[0]
