"""The orchestrator's probes are answered while another process floods the health port: with
connections that send an oversized request and then go silent (each gets its 400 and must
not keep a slot from a probe), and with idle connections past the connection cap. Real
sockets, a real sidecar, the flood in a process of its own."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.health.test_http import running
from tests.support.http import Reply, exchange

ROOT = Path(__file__).resolve().parents[2]
PROMPT_S = 2.0  # each probe's bound, as in test_http_availability
PROBES = 20  # of each of /livez and /readyz
FLOOD_RATE = 400  # connections a second asked of the flood
MIN_FLOOD_RATE = 350  # what it must reach for the run to count
HOLD_S = 3.0  # longer than the server's 2 s I/O deadline
OVERSIZED = b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n"


@dataclass
class Flood:
    opened: int = 0
    failed: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.opened / self.seconds if self.seconds else 0.0


@asynccontextmanager
async def flooding(address: tuple[str, int], mode: str) -> AsyncIterator[Flood]:
    """The flood of ``mode`` against ``address`` from another process, at its steady state."""
    host, port = address
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.httpflood",
        f"{host}:{port}",
        f"--mode={mode}",
        f"--rate={FLOOD_RATE}",
        f"--hold={HOLD_S}",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    flood = Flood()
    try:
        assert await process.stdout.readline() == b"flooding\n"
        await asyncio.sleep(HOLD_S)  # every slot the flood can take is taken
        yield flood
    finally:
        process.terminate()
        async with asyncio.timeout(30):
            out, _ = await process.communicate()
    summary = json.loads(out.decode().strip().splitlines()[-1])
    flood.opened, flood.failed, flood.seconds = (
        summary["opened"],
        summary["failed"],
        summary["seconds"],
    )


async def timed_probe(address: tuple[str, int], path: str) -> tuple[Reply | BaseException, float]:
    """``path`` and how long it took; a reset, a refusal or a timeout is returned, not raised."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome: Reply | BaseException
    try:
        outcome = await exchange(
            address, f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode(), timeout=PROMPT_S + 3
        )
    except (OSError, TimeoutError, ValueError, IndexError) as exc:  # reset, empty reply
        outcome = exc
    return outcome, loop.time() - started


async def probe_round(address: tuple[str, int]) -> dict[str, str]:
    """``PROBES`` probes of /livez and of /readyz, alternating; per path a line of . and X."""
    marks: dict[str, list[str]] = {"/livez": [], "/readyz": []}
    for _ in range(PROBES):
        for path, line in marks.items():
            outcome, elapsed = await timed_probe(address, path)
            ok = isinstance(outcome, Reply) and outcome.status == 200 and elapsed < PROMPT_S
            line.append("." if ok else "X")
        await asyncio.sleep(0.1)
    return {path: "".join(line) for path, line in marks.items()}


@pytest.mark.parametrize("mode", ["linger", "idle"])
async def test_probes_are_answered_under_a_flood(database_url: str, mode: str) -> None:
    async with running(database_url) as sidecar:
        async with flooding(sidecar.address, mode) as flood:
            answered = await probe_round(sidecar.address)
        # The flood was what it claims to be, from start to end of the probes.
        assert flood.rate >= MIN_FLOOD_RATE, flood
        assert answered == {"/livez": "." * PROBES, "/readyz": "." * PROBES}, flood
        # Once it is over, an oversized request still gets its 400.
        reply = await exchange(sidecar.address, OVERSIZED)
        assert reply.status == 400
