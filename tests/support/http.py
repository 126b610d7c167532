"""A raw HTTP/1.1 client over real sockets, so tests see exactly what the server sends."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

# How long a probe of the health server may take to answer, tested under load
# (tests/health/test_http_availability.py); deploy/'s probes wait as long.
PROMPT_S = 2.0  # a generous bound for a probe on a busy 2-core machine


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


async def exchange(address: tuple[str, int], raw: bytes, *, timeout: float = 5.0) -> Reply:
    """Send raw bytes, read until the server closes, parse one response."""
    reader, writer = await asyncio.open_connection(*address)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(timeout):
            data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(status, headers, body)


async def get(address: tuple[str, int], path: str, *, method: str = "GET") -> Reply:
    request = f"{method} {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode("ascii")
    return await exchange(address, request)
