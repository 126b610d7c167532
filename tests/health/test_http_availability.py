"""The probe endpoints stay answerable while clients misbehave: idle sockets, one connection
over the cap, a connection flood; and odd but valid requests (a GET with a body, an
absolute-form target) get a proper answer. Real sockets against a real sidecar."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from prometheus_client import CollectorRegistry

from contracts.errors import ConfigError
from health.config import SidecarConfig
from health.sidecar import HealthSidecar
from tests.health.test_http import running
from tests.support.http import PROMPT_S, Reply, exchange, get
from tests.support.policies import loose_policy


async def timed_livez(address: tuple[str, int]) -> tuple[Reply | BaseException, float]:
    """/livez and how long it took; a reset or a refusal is returned, not raised."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    outcome: Reply | BaseException
    try:
        outcome = await exchange(
            address, b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n", timeout=PROMPT_S + 3
        )
    except (OSError, TimeoutError, ValueError, IndexError) as exc:  # reset, empty reply
        outcome = exc
    return outcome, loop.time() - started


def assert_prompt_ok(outcome: Reply | BaseException, elapsed: float) -> None:
    assert isinstance(outcome, Reply), f"probe failed: {outcome!r}"
    assert outcome.status == 200
    assert elapsed < PROMPT_S, elapsed


@asynccontextmanager
async def idle_sockets(address: tuple[str, int], count: int) -> AsyncIterator[list[object]]:
    """``count`` connections that send nothing; closed on exit."""
    writers: list[asyncio.StreamWriter] = []
    try:
        for _ in range(count):
            _reader, writer = await asyncio.open_connection(*address)
            writers.append(writer)
        await asyncio.sleep(0.1)  # let the server accept all of them
        yield list(writers)
    finally:
        for writer in writers:
            writer.close()


async def test_livez_is_prompt_with_200_idle_sockets_open(database_url: str) -> None:
    async with running(database_url) as sidecar, idle_sockets(sidecar.address, 200):
        for _ in range(3):
            assert_prompt_ok(*await timed_livez(sidecar.address))


@pytest.mark.parametrize("extra", [0, 1])
async def test_livez_is_prompt_with_the_cap_of_idle_sockets_plus_one(
    database_url: str, extra: int
) -> None:
    async with (
        running(database_url, http_max_connections=8) as sidecar,
        idle_sockets(sidecar.address, 8 + extra),
    ):
        assert_prompt_ok(*await timed_livez(sidecar.address))
        assert_prompt_ok(*await timed_livez(sidecar.address))


async def test_a_busy_connection_is_not_evicted_for_an_idle_one(database_url: str) -> None:
    # Eviction takes idle connections only: a request already read is answered.
    async with running(database_url, http_max_connections=2) as sidecar:
        reader, writer = await asyncio.open_connection(*sidecar.address)
        writer.write(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        await writer.drain()
        async with idle_sockets(sidecar.address, 4):
            async with asyncio.timeout(PROMPT_S):
                data = await reader.read()
        writer.close()
        assert data.startswith(b"HTTP/1.1 200 ")


OVERSIZED = b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n"


async def answered_then_silent(address: tuple[str, int]) -> asyncio.StreamWriter:
    """A connection that sent an oversized request, read its 400, and neither sends nor
    closes: the client of the review's linger flood, one at a time."""
    reader, writer = await asyncio.open_connection(*address)
    writer.write(OVERSIZED)
    await writer.drain()
    async with asyncio.timeout(PROMPT_S):
        head = await reader.readuntil(b"\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    return writer


async def test_answered_connections_do_not_keep_probes_out(database_url: str) -> None:
    # Every slot is held by a client that got its 400 and went silent: they are answered,
    # so they make room for a probe rather than have it refused.
    async with running(database_url, http_max_connections=4) as sidecar:
        silent = [await answered_then_silent(sidecar.address) for _ in range(4)]
        try:
            assert_prompt_ok(*await timed_livez(sidecar.address))
            assert_prompt_ok(*await timed_livez(sidecar.address))
        finally:
            for writer in silent:
                writer.close()


async def test_an_answered_connection_is_evicted_before_a_waiting_one(database_url: str) -> None:
    # A connection still waiting for its request may be a slow probe; one already answered
    # cannot be, so it is the one to make room.
    async with running(database_url, http_max_connections=2) as sidecar:
        reader, writer = await asyncio.open_connection(*sidecar.address)
        silent = await answered_then_silent(sidecar.address)
        try:
            assert_prompt_ok(*await timed_livez(sidecar.address))
            writer.write(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n")
            await writer.drain()
            async with asyncio.timeout(PROMPT_S):
                data = await reader.read()
            assert data.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
            silent.close()


async def test_livez_is_prompt_under_a_connection_flood(database_url: str) -> None:
    async with running(database_url) as sidecar:
        address = sidecar.address
        stop = asyncio.Event()
        flood: list[asyncio.StreamWriter] = []

        async def open_idle_connections() -> None:
            # About 100 new idle connections a second, kept open by the client.
            while not stop.is_set():
                try:
                    _reader, writer = await asyncio.open_connection(*address)
                except OSError:
                    continue
                flood.append(writer)
                await asyncio.sleep(0.01)

        flooding = asyncio.create_task(open_idle_connections())
        try:
            await asyncio.sleep(1.0)  # past the default cap of idle connections
            outcomes = []
            for _ in range(12):
                outcomes.append(await timed_livez(address))
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await flooding
            for writer in flood:
                writer.close()
        assert len(flood) > 100  # the flood really was over the cap
        for outcome, elapsed in outcomes:
            assert_prompt_ok(outcome, elapsed)


async def send_in_parts(address: tuple[str, int], *parts: bytes) -> bytes:
    """Send each part as its own packet, a moment apart, then read until the server closes."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.2)
        async with asyncio.timeout(5):
            return await reader.read()
    finally:
        writer.close()


async def test_get_with_a_body_gets_an_answer(database_url: str) -> None:
    async with running(database_url) as sidecar:
        for parts in (
            (b"GET /livez HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n", b"hello", b" world"),
            (
                b"GET /livez HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\nhello\r\n",
                b"0\r\n\r\n",
            ),
        ):
            # The body arrives after the head, as it does from a real client.
            data = await send_in_parts(sidecar.address, *parts)
            assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b"\r\n\r\nok\n")
        # Head and a body longer than one read in a single write (a form post sent as GET).
        raw = b"GET /livez HTTP/1.1\r\nHost: t\r\nContent-Length: 6000\r\n\r\n" + b"x" * 6000
        for _ in range(5):
            reply = await exchange(sidecar.address, raw)
            assert (reply.status, reply.text) == (200, "ok\n")
        # A body over the request limit is refused with an answer, not a reset.
        data = await send_in_parts(
            sidecar.address,
            b"GET /livez HTTP/1.1\r\nHost: t\r\nContent-Length: 20000\r\n\r\n",
            b"x" * 20_000,
        )
        assert data.startswith(b"HTTP/1.1 400 ")
        assert json.loads(data.partition(b"\r\n\r\n")[2])["status"] == 400
        assert (await get(sidecar.address, "/livez")).status == 200


async def test_absolute_form_target_is_served_like_its_path(database_url: str) -> None:
    async with running(database_url) as sidecar:
        host, port = sidecar.address
        for target, status in (
            (f"http://{host}:{port}/livez", 200),
            (f"http://{host}:{port}/health?verbose=1", 200),
            (f"http://{host}:{port}", 200),  # empty path is "/"
            (f"http://{host}:{port}/nope", 404),
        ):
            reply = await get(sidecar.address, target)
            assert reply.status == status, target
        livez = await get(sidecar.address, f"http://{host}:{port}/livez")
        assert livez.text == "ok\n"


async def test_connection_cap_below_one_is_a_config_error(database_url: str) -> None:
    with pytest.raises(ConfigError, match="--http-max-connections must be a positive integer"):
        HealthSidecar(
            SidecarConfig(
                database_url=database_url,
                policy=loose_policy(),
                listen=("127.0.0.1", 0),
                http_max_connections=0,
            ),
            registry=CollectorRegistry(),
        )
