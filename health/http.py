"""A small HTTP/1.1 server for probes: one request per connection, bounded in size and time.

h11 does the parsing (a well-kept, sans-I/O parser); this module adds the limits the
orchestrator-facing surface needs: a request head of at most ``max_request_bytes``, a
deadline for reading it and one for writing the answer, a cap on open connections, and
problem+json bodies for every error. A misbehaving client is answered or dropped; the
server keeps serving.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

import h11
import msgspec

from health.errors import ListenError

logger = logging.getLogger("health.http")

PROBLEM_JSON = "application/problem+json"
ALLOWED_METHODS = ("GET", "HEAD")
_READ_CHUNK = 4096
_TITLES = {
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class Request:
    """What a handler sees: the method and the path (query string removed)."""

    method: str
    path: str


@dataclass(frozen=True)
class Response:
    """A complete response; the server adds framing and cache headers."""

    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = field(default=())


Handler = Callable[[Request], Awaitable[Response]]


def problem(status: int, detail: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """An RFC 9457 problem+json response."""
    body = msgspec.json.encode(
        {
            "type": "about:blank",
            "title": _TITLES.get(status, "Error"),
            "status": status,
            "detail": detail,
        }
    )
    return Response(status, PROBLEM_JSON, body, headers)


_BIND_CAUSES = {
    errno.EADDRINUSE: "address already in use",
    errno.EADDRNOTAVAIL: "address not available on this machine",
    errno.EACCES: "permission denied",
}


class HTTPServer:
    """Serves ``handler`` on ``listen`` until closed; an async context manager."""

    def __init__(
        self,
        listen: tuple[str, int],
        handler: Handler,
        *,
        max_request_bytes: int = 8192,
        io_timeout: float = 2.0,
        max_connections: int = 64,
    ) -> None:
        self._listen = listen
        self._handler = handler
        self._max_request_bytes = max_request_bytes
        self._io_timeout = io_timeout
        self._slots = asyncio.Semaphore(max_connections)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The bound host and port (the real port when 0 was asked for)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the server is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def __aenter__(self) -> Self:
        host, port = self._listen
        try:
            self._server = await asyncio.start_server(
                self._accept, host, port, reuse_address=True, start_serving=True
            )
        except OSError as exc:
            cause = _BIND_CAUSES.get(exc.errno or 0, exc.strerror or type(exc).__name__)
            raise ListenError(f"cannot listen on {host}:{port}: {cause}") from exc
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop accepting and drop open connections."""
        if self._server is not None:
            self._server.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def serve_forever(self) -> None:
        """Serve until cancelled."""
        if self._server is None:
            raise RuntimeError("enter the server before serving")
        await self._server.serve_forever()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(
            self._connection(reader, writer), name="health-http-connection"
        )
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._slots.locked():
            # Over the cap: close at once rather than queue, so a flood cannot pile up.
            writer.transport.abort()
            return
        async with self._slots:
            try:
                await self._exchange(reader, writer)
            except (TimeoutError, ConnectionError, h11.LocalProtocolError):
                # Too slow or gone: drop without flushing anything further.
                writer.transport.abort()
            except Exception as exc:
                # Type only: a message could carry request bytes.
                logger.error("health HTTP connection failed: %s", type(exc).__name__)
                writer.transport.abort()
            else:
                # The answer is already drained to the kernel, so closing cannot linger.
                writer.close()

    async def _exchange(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._max_request_bytes)
        try:
            async with asyncio.timeout(self._io_timeout):
                request = await self._read_request(conn, reader)
        except h11.RemoteProtocolError:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(conn, writer, problem(400, "malformed or oversized request"))
            return
        if request is None:
            return
        if request.method not in ALLOWED_METHODS:
            response = problem(
                405,
                "only GET and HEAD are allowed",
                headers=(("Allow", ", ".join(ALLOWED_METHODS)),),
            )
        else:
            try:
                response = await self._handler(request)
            except Exception as exc:
                logger.error("health HTTP handler failed: %s", type(exc).__name__)
                response = problem(500, "internal error")
        await self._send(conn, writer, response, head=request.method == "HEAD")

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> Request | None:
        received = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(_READ_CHUNK)
                received += len(data)
                if received > self._max_request_bytes:
                    raise h11.RemoteProtocolError("request too large")
                conn.receive_data(data)  # b"" marks end of stream
                continue
            if isinstance(event, h11.Request):
                return _request(event)
            if isinstance(event, h11.ConnectionClosed):
                return None
            raise h11.RemoteProtocolError("unexpected event")

    async def _send(
        self,
        conn: h11.Connection,
        writer: asyncio.StreamWriter,
        response: Response,
        *,
        head: bool = False,
    ) -> None:
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("Connection", "close"),
            *response.headers,
        ]
        data = conn.send(h11.Response(status_code=response.status, headers=headers)) or b""
        if not head:
            data += conn.send(h11.Data(data=response.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        async with asyncio.timeout(self._io_timeout):
            writer.write(data)
            await writer.drain()


def _request(event: h11.Request) -> Request:
    target = event.target.decode("ascii", "replace")
    path = target.split("?", 1)[0].split("#", 1)[0]
    return Request(method=event.method.decode("ascii", "replace"), path=path)
