"""A small HTTP/1.1 server for probes: one request per connection, bounded in size and time.

h11 does the parsing (a well-kept, sans-I/O parser); this module adds the limits the
orchestrator-facing surface needs: a request (head and any body) of at most
``MAX_REQUEST_BYTES``, a deadline for reading it and one for writing the answer, a cap on
open connections, and problem+json bodies for every error. A misbehaving client is
answered or dropped; the server keeps serving.

**The cap evicts, it does not refuse.** A connection that has not delivered its request
yet costs the server nothing but a socket, and an orchestrator's probe is exactly such a
connection for its first milliseconds. So when a new connection would go over the cap, a
connection that no probe can be waiting on is closed to make room: first the oldest one
that was already answered and is only draining its client's input before the close (see
below), else the oldest one still waiting for its request. Only when every open
connection is busy answering (each for at most two I/O deadlines) is the new one refused.
Idle sockets, clients that send an oversized request and then go silent, or a connection
flood therefore push out each other, never a probe that sends its request promptly: a
probe is evicted only if ``max_connections`` newer connections arrive before its request
does.

**After an answer to a request that was not read to its end** (a 400 for an oversized or
malformed one) the server half-closes and discards what the client still sends, so that
the close is an orderly one and the answer is not destroyed by a reset (RFC 9112 9.6);
that drain is bounded in bytes and to ``_DRAIN_S``, and evictable.

Kept on h11 rather than a general server (uvicorn, hypercorn): their connection limit
answers 503 to everything over it, which fails the very probes this must keep serving,
and none closes idle connections first; the eviction above is a few lines here.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

import h11
import msgspec

from health.errors import HealthSettingError, ListenError

logger = logging.getLogger("health.http")

PROBLEM_JSON = "application/problem+json"
ALLOWED_METHODS = ("GET", "HEAD")
MAX_REQUEST_BYTES = 8192
"""A request's head and body together; a larger one is answered 400."""
_READ_CHUNK = 4096
_DRAIN_BYTES = 65536
"""At most this much unread input is discarded after answering, so the close is clean."""
_DRAIN_S = 0.5
"""And for at most this long (or the I/O deadline, if shorter): enough for a client that is
still sending to see the answer and close, short for one that never will."""
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
        io_timeout: float,
        max_connections: int,
    ) -> None:
        """``io_timeout`` and ``max_connections``: the sidecar's (health/config.py)."""
        if max_connections < 1:
            raise HealthSettingError("the HTTP connection cap must be at least 1")
        self._listen = listen
        self._handler = handler
        self._io_timeout = io_timeout
        self._max_connections = max_connections
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        # Connections still waiting for their request, oldest first: the ones to evict.
        self._waiting: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        # Connections answering a request; never evicted (each is bounded by io_timeout).
        self._answering: set[asyncio.Task[None]] = set()
        # Connections answered, draining their client's input before the close, oldest
        # first: evicted before any connection that may be a probe waiting for its answer.
        self._draining: dict[asyncio.Task[None], asyncio.StreamWriter] = {}

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
        open_now = len(self._waiting) + len(self._answering) + len(self._draining)
        if open_now >= self._max_connections:
            evictable = self._draining or self._waiting
            if not evictable:
                # Every slot is answering a request: refuse rather than queue.
                writer.transport.abort()
                return
            # The oldest answered connection, else the oldest one that has not sent its
            # request, makes room.
            evictable.pop(next(iter(evictable))).transport.abort()
        task = asyncio.get_running_loop().create_task(
            self._connection(reader, writer), name="health-http-connection"
        )
        self._waiting[task] = writer
        self._connections.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._connections.discard(task)
        self._waiting.pop(task, None)
        self._answering.discard(task)
        self._draining.pop(task, None)

    def _admit(self) -> bool:
        """Move this connection from waiting to answering; False when it was evicted."""
        task = asyncio.current_task()
        if task is None or self._waiting.pop(task, None) is None:
            return False
        self._answering.add(task)
        return True

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        try:
            async with asyncio.timeout(self._io_timeout):
                request = await self._read_request(conn, reader)
        except h11.RemoteProtocolError:
            if self._admit() and conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._send(conn, writer, problem(400, "malformed or oversized request"))
                await self._drain(conn, reader, writer)
            return
        if request is None or not self._admit():
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
        await self._drain(conn, reader, writer)

    async def _drain(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Closing a socket with unread input makes the kernel send a reset, which can
        # destroy the answer before the client reads it. When the client may still be
        # sending (a refused body, an oversized head), half-close and discard what
        # arrives, bounded in bytes and time, so the close is an orderly one. The answer
        # is out, so the connection now yields its slot to any newcomer.
        if conn.their_state in (h11.DONE, h11.CLOSED, h11.MUST_CLOSE) or reader.at_eof():
            return
        task = asyncio.current_task()
        if task is not None and task in self._answering:
            self._answering.discard(task)
            self._draining[task] = writer
        if writer.can_write_eof():
            writer.write_eof()
        discarded = 0
        async with asyncio.timeout(min(self._io_timeout, _DRAIN_S)):
            while discarded < _DRAIN_BYTES:
                data = await reader.read(_READ_CHUNK)
                if not data:
                    return
                discarded += len(data)

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> Request | None:
        # The whole request, body included: a GET may carry one (it is read and ignored),
        # and an answer sent before it is read would be lost to a reset at close.
        received = 0
        request: Request | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(_READ_CHUNK)
                received += len(data)
                if received > MAX_REQUEST_BYTES:
                    raise h11.RemoteProtocolError("request too large")
                conn.receive_data(data)  # b"" marks end of stream
                continue
            if isinstance(event, h11.Request):
                request = _request(event)
            elif isinstance(event, h11.Data):
                continue
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None
            else:
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
    if target.startswith(("http://", "https://")):
        # Absolute form (RFC 9112 3.2.2), as proxies send it: only the path matters here.
        try:
            path = urlsplit(target).path or "/"
        except ValueError:  # e.g. an unclosed "[": no path of ours, so a 404
            path = target
    else:
        path = target.split("?", 1)[0].split("#", 1)[0]
    return Request(method=event.method.decode("ascii", "replace"), path=path)
