"""Fuzzing the sidecar's HTTP server with what a network can send.

Random bytes, odd methods and targets, many or huge headers, bodies with and without
framing, pipelined requests and connections half-closed mid-request, all against a
running sidecar over real sockets. Each connection gets a well-formed answer (2xx, 4xx,
or 503 from the two health endpoints) or a close, the server logs no failure, and
``/livez`` still answers 200 afterwards.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from contracts.policy import EvaluationSettings, OutboxPolicy, Policy
from health.config import SidecarConfig
from health.sidecar import HealthSidecar
from tests.fuzz.profiles import fuzz_settings

# Generous: the answer to a complete request is immediate; only a stalled one waits this.
IO_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 15.0
PATHS = ["/livez", "/readyz", "/health", "/metrics", "/", "/nope", "*", "http://x/livez"]
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH"]
# The sidecar's only 5xx: the health endpoints saying the system is not healthy.
MAY_BE_UNAVAILABLE = {b"/readyz", b"/health"}


def policy() -> Policy:
    return Policy(
        outbox=OutboxPolicy(
            max_pending_count=1000,
            max_pending_age_ms=3_600_000,
            max_quarantined_count=10,
            gates_readiness=True,
        ),
        scoring_jobs=None,
        completion_outbox=None,
        relay=None,
        evaluation=EvaluationSettings(interval_ms=500, timeout_ms=2000, max_evidence_age_ms=60_000),
    )


@pytest_asyncio.fixture
async def server(database_url: str) -> AsyncIterator[tuple[str, int]]:
    """A sidecar on an ephemeral port with its first evaluation done."""
    sidecar = HealthSidecar(
        SidecarConfig(
            database_url=database_url,
            policy=policy(),
            listen=("127.0.0.1", 0),
            receipt_retention_ms=86_400_000,
            http_io_timeout_ms=int(IO_TIMEOUT_S * 1000),
        ),
        registry=CollectorRegistry(),
    )
    async with sidecar:
        task = asyncio.create_task(sidecar.run())
        try:
            await sidecar.next_report()
            yield sidecar.address
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


async def send(address: tuple[str, int], chunks: list[bytes], *, half_close: bool) -> bytes:
    """Send the chunks, optionally half-close, and read what comes back until the close."""
    reader, writer = await asyncio.open_connection(*address)
    received = b""
    try:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        if half_close:
            writer.write_eof()
        async with asyncio.timeout(READ_TIMEOUT_S):
            while data := await reader.read(65536):
                received += data
    except (ConnectionResetError, BrokenPipeError):
        pass  # the server dropped a client that was too slow or broke the protocol
    finally:
        writer.close()
    return received


def assert_answer(received: bytes, target: bytes | None) -> None:
    """Nothing (a close) or one well-formed response that is not a server failure."""
    if not received:
        return
    head, sep, _ = received.partition(b"\r\n\r\n")
    assert sep, received[:200]
    status_line = head.split(b"\r\n", 1)[0]
    version, status, _ = status_line.split(b" ", 2)
    assert version == b"HTTP/1.1", status_line
    code = int(status)
    if code == 503:
        assert target in MAY_BE_UNAVAILABLE, status_line
    else:
        assert 200 <= code < 300 or 400 <= code < 500, status_line


async def assert_still_serving(address: tuple[str, int]) -> None:
    received = await send(address, [b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"], half_close=False)
    assert received.startswith(b"HTTP/1.1 200 "), received[:200]


def no_failures_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


tokens = st.one_of(
    st.sampled_from(METHODS), st.text(st.characters(codec="latin-1"), min_size=0, max_size=12)
)
targets = st.one_of(
    st.sampled_from(PATHS),
    st.sampled_from(PATHS).map(lambda p: p + "?verbose=1&x=%ff#frag"),
    st.text(st.characters(codec="latin-1"), max_size=40),
    st.sampled_from(["http://[/", "http://[::1/livez", "https://x:99999/", "//", "/%00"]),
)
header_names = st.one_of(
    st.sampled_from(["Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect"]),
    st.text(st.characters(codec="latin-1"), min_size=0, max_size=10),
)
header_values = st.one_of(
    st.sampled_from(["0", "5", "-1", "99999999999999999999", "chunked", "close", "100-continue"]),
    st.text(st.characters(codec="latin-1"), max_size=30),
    st.integers(0, 20_000).map(lambda n: "v" * n),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[bytes], bool, bytes]:
    """Raw request bytes in chunks, whether to half-close, and the target asked for."""
    method = draw(tokens).encode("latin-1")
    target = draw(targets).encode("latin-1")
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1x", b""]))
    headers = [(b"Host", b"test")] if draw(st.booleans()) else []
    for name, value in draw(st.lists(st.tuples(header_names, header_values), max_size=6)):
        headers.append((name.encode("latin-1"), value.encode("latin-1")))
    many = draw(st.integers(0, 300))
    headers.extend((b"X-Fill-%d" % i, b"y") for i in range(many))
    eol = draw(st.sampled_from([b"\r\n", b"\n", b"\r"]))
    raw = b" ".join(part for part in (method, target, version) if part) + eol
    raw += b"".join(name + b": " + value + eol for name, value in headers) + eol
    raw += draw(st.binary(max_size=2000))
    if draw(st.booleans()):  # pipelined: a second request in the same write
        raw += b"GET /livez HTTP/1.1\r\nHost: test\r\n\r\n"
    cut = draw(st.integers(0, len(raw)))
    chunks = [raw[:cut], raw[cut:]] if draw(st.booleans()) else [raw]
    # Mostly half-closed, so a request cut short is noticed at once rather than timed out.
    half_close = draw(st.integers(0, 9)) > 0
    return [c for c in chunks if c], half_close, target


@fuzz_settings(max_examples=120)
@given(request=requests())
@example(request=([b"GET http://[/ HTTP/1.1\r\nHost: x\r\n\r\n"], True, b"http://[/"))
@example(request=([b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab"], True, b"/"))
@example(request=([b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n" * 50], True, b"/livez"))
@example(request=([b"X" * 100_000], True, None))
async def test_any_request_is_answered_or_closed(
    server: tuple[str, int],
    caplog: pytest.LogCaptureFixture,
    request: tuple[list[bytes], bool, bytes],
) -> None:
    chunks, half_close, target = request
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="health"):
        received = await send(server, chunks, half_close=half_close)
        assert_answer(received, target)
        await assert_still_serving(server)
    assert no_failures_logged(caplog) == []


@fuzz_settings(max_examples=40)
# Mostly half-closed: bytes that never finish a request head otherwise wait out the deadline.
@given(
    data=st.binary(min_size=1, max_size=20_000),
    half_close=st.integers(0, 4).map(bool),
)
@example(data=b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", half_close=True)  # a TLS hello
async def test_random_bytes_are_answered_or_closed(
    server: tuple[str, int], caplog: pytest.LogCaptureFixture, data: bytes, half_close: bool
) -> None:
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="health"):
        received = await send(server, [data], half_close=half_close)
        assert_answer(received, None)
        await assert_still_serving(server)
    assert no_failures_logged(caplog) == []
