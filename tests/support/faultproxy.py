"""A loopback TCP proxy that stalls, heals and cuts one client's network path on demand.

One proxy is one listen address forwarding to one upstream address. Put a client behind it
(a Kafka client bootstrapped at a broker listener whose *advertised* address is the
proxy's, so the metadata it receives names the proxy again) and every byte of that
client's traffic passes here, where a test can:

- ``stall()``: keep accepting connections, forward nothing in either direction and hold
  what arrives, the way a path that silently drops everything looks to both ends;
- ``heal()``: forward again, held bytes first;
- ``cut()``: close every current connection abortively (``SO_LINGER`` 0, so both ends see
  a reset) and throw the held bytes away.

What the held bytes model: the sender's unsent data. When a sender closes its socket
gracefully (FIN) during a stall, its kernel would still deliver what it had queued, so the
held bytes are delivered on ``heal()`` and the close follows them. When a sender closes
abortively (RST), its unsent data dies with the connection, so the held bytes of that
connection are dropped. Both rules matter: they decide whether a "given up" request can
still land after the path comes back.

The proxy runs in its own thread around a ``selectors`` loop, so synchronous tests,
asyncio tests and a long soak harness use it alike. Every operation runs inside that
thread and returns once it is in effect; ``counters()`` is a consistent snapshot, so a test
can prove that its fault happened (bytes were held, connections were cut).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import selectors
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from tests.support.waiting import described, wait_until, wait_until_blocking

_CHUNK = 64 * 1024
# Past this many buffered bytes in one direction the proxy stops reading that side, so
# a stalled path pushes back on the sender like a full TCP window instead of growing
# without bound.
_BUFFER_LIMIT = 8 * 1024 * 1024
_CONNECT_TIMEOUT_S = 2.0
_CALL_TIMEOUT_S = 10.0
_POLL_S = 0.02

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ProxyCounters:
    """What the proxy saw since it started; ``held_*`` are bytes held right now."""

    accepted: int
    open: int
    refused: int  # connections closed at once because the upstream did not answer
    forwarded_up: int  # client -> upstream
    forwarded_down: int  # upstream -> client
    held_up: int
    held_down: int
    peak_held: int  # the most bytes ever held at once, both directions together
    dropped: int  # held bytes thrown away by a cut or an abortive close
    cuts: int  # connections closed abortively by cut()
    client_closed_while_stalled: int  # clients that gave up on a stalled connection

    @property
    def held(self) -> int:
        return self.held_up + self.held_down


@dataclasses.dataclass(frozen=True)
class ConnectionStats:
    """One proxied connection as the proxy sees it now."""

    id: int
    stalled: bool
    client_eof: bool
    upstream_eof: bool
    held_up: int
    held_down: int
    forwarded_up: int
    forwarded_down: int


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` (IPv4 or a name) as a socket address."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {text!r}")
    return host, int(port)


def _abort(sock: socket.socket) -> None:
    """Close so that the peer sees a reset: unsent data dies with the connection."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Pipe:
    """One direction of a connection: what was read from ``src`` and not yet written."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.buffer = bytearray()
        self.src_eof = False
        self.dst_shut = False
        self.broken = False  # dst is gone: nothing more can be written
        self.forwarded = 0

    @property
    def finished(self) -> bool:
        return self.broken or self.dst_shut


class _Connection:
    def __init__(self, ident: int, client: socket.socket, upstream: socket.socket, stalled: bool):
        self.id = ident
        self.client = client
        self.upstream = upstream
        self.stalled = stalled
        self.up = _Pipe(client, upstream)
        self.down = _Pipe(upstream, client)
        self.closed = False

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            id=self.id,
            stalled=self.stalled,
            client_eof=self.up.src_eof,
            upstream_eof=self.down.src_eof,
            held_up=len(self.up.buffer) if self.stalled else 0,
            held_down=len(self.down.buffer) if self.stalled else 0,
            forwarded_up=self.up.forwarded,
            forwarded_down=self.down.forwarded,
        )


class FaultProxy:
    """A TCP proxy from ``listen`` to ``upstream`` with stall, heal and cut; see the module."""

    def __init__(self, listen: str | tuple[str, int], upstream: str | tuple[str, int]) -> None:
        self._listen_at = parse_address(listen) if isinstance(listen, str) else listen
        self.upstream = parse_address(upstream) if isinstance(upstream, str) else upstream
        self._selector = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._calls: list[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = []
        self._calls_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running = False
        self._connections: dict[int, _Connection] = {}
        self._by_socket: dict[socket.socket, _Connection] = {}
        self._registered: dict[socket.socket, int] = {}
        self._ids = itertools.count(1)
        self._stall_new = False
        self._accepted = self._refused = self._cuts = self._gave_up = 0
        self._forwarded_up = self._forwarded_down = self._dropped = self._peak_held = 0
        self.address: tuple[str, int] = self._listen_at

    # -- life cycle -----------------------------------------------------------------------
    def start(self) -> FaultProxy:
        """Bind, listen and start forwarding in a background thread."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(self._listen_at)
        except OSError:
            listener.close()
            raise
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self.address = listener.getsockname()[:2]
        self._wake_r.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._running = True
        self._thread = threading.Thread(
            target=self._run, name=f"fault-proxy {self.address[1]}", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening and close every connection abortively; safe to call twice."""
        if self._thread is None:
            return
        if self._thread.is_alive():
            self._call(self._shutdown)
            self._thread.join(timeout=_CALL_TIMEOUT_S)
        self._thread = None
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> FaultProxy:
        return self.start() if self._thread is None else self

    def __exit__(self, *_: object) -> None:
        self.close()

    @property
    def listen(self) -> str:
        """The address clients connect to, as ``host:port``."""
        return f"{self.address[0]}:{self.address[1]}"

    # -- faults ---------------------------------------------------------------------------
    def stall(self) -> None:
        """Hold every byte of every current and future connection until ``heal()``."""
        self._call(lambda: self._set_stall(current=True, new=True))

    def stall_new_only(self) -> None:
        """Let current connections forward, hold every byte of connections accepted from now."""
        self._call(lambda: self._set_stall(current=False, new=True))

    def heal(self) -> None:
        """Forward again on every connection, held bytes first; new connections forward."""
        self._call(lambda: self._set_stall(current=False, new=False))

    def cut(self) -> int:
        """Reset every current connection on both sides, dropping held bytes; returns how many."""
        return self._call(self._cut_all)

    def stall_connection(self, ident: int) -> None:
        """Hold the bytes of one connection only."""
        self._call(lambda: self._set_one(ident, stalled=True))

    def heal_connection(self, ident: int) -> None:
        """Forward one connection again, held bytes first."""
        self._call(lambda: self._set_one(ident, stalled=False))

    def cut_connection(self, ident: int) -> None:
        """Reset one connection on both sides, dropping its held bytes."""
        self._call(lambda: self._cut_one(ident))

    # -- what happened --------------------------------------------------------------------
    def counters(self) -> ProxyCounters:
        """A consistent snapshot of the counters."""
        return self._call(self._snapshot)

    def connections(self) -> list[ConnectionStats]:
        """Every open connection, oldest first."""
        return self._call(lambda: [c.stats() for c in self._connections.values()])

    def wait_until(
        self,
        predicate: Callable[[ProxyCounters], bool],
        timeout: float = 10.0,
        what: str | None = None,
    ) -> ProxyCounters:
        """Block until ``predicate(counters())`` holds and return those counters; a failure
        names ``what`` (else the predicate) and the last counters. For a test's own thread
        (tests/support/waiting.py)."""
        try:
            return wait_until_blocking(
                lambda: self._met(predicate),
                what=self._what(predicate, what),
                timeout=timeout,
                interval=_POLL_S,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last {self.counters()}") from None

    async def until(
        self,
        predicate: Callable[[ProxyCounters], bool],
        timeout: float = 10.0,
        what: str | None = None,
    ) -> ProxyCounters:
        """:meth:`wait_until` for asyncio tests: polls without blocking the event loop."""
        try:
            return await wait_until(
                lambda: self._met(predicate),
                what=self._what(predicate, what),
                timeout=timeout,
                interval=_POLL_S,
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last {self.counters()}") from None

    def _met(self, predicate: Callable[[ProxyCounters], bool]) -> ProxyCounters | None:
        counters = self.counters()
        return counters if predicate(counters) else None

    def _what(self, predicate: Callable[[ProxyCounters], bool], what: str | None) -> str:
        return f"proxy {self.listen}: {what or described(predicate)}"

    # -- inside the proxy thread ------------------------------------------------------------
    def _call(self, fn: Callable[[], T]) -> T:
        if threading.current_thread() is self._thread:
            return fn()
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the fault proxy is not running")
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._calls_lock:
            self._calls.append((fn, done))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        return done.result(timeout=_CALL_TIMEOUT_S)

    def _run_calls(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._calls_lock:
            calls, self._calls = self._calls, []
        for fn, done in calls:
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)

    def _run(self) -> None:
        try:
            while self._running:
                self._update_interest()
                for key, mask in self._selector.select(timeout=0.5):
                    sock = key.fileobj
                    if sock is self._wake_r:
                        self._run_calls()
                    elif sock is self._listener:
                        self._accept()
                    else:
                        assert isinstance(sock, socket.socket)
                        connection = self._by_socket.get(sock)
                        if connection is not None and not connection.closed:
                            self._service(connection, sock, mask)
                self._account_peak()
        finally:
            for connection in list(self._connections.values()):
                self._abort_connection(connection)
            if self._listener is not None:
                self._listener.close()
            # Answer calls that raced with the shutdown instead of leaving them hanging.
            with self._calls_lock:
                calls, self._calls = self._calls, []
            for _, done in calls:
                if not done.done():
                    done.set_exception(RuntimeError("the fault proxy stopped"))

    def _shutdown(self) -> None:
        self._running = False

    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            self._accepted += 1
            try:
                upstream = socket.create_connection(self.upstream, timeout=_CONNECT_TIMEOUT_S)
            except OSError:
                self._refused += 1
                _abort(client)
                continue
            for sock in (client, upstream):
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            connection = _Connection(next(self._ids), client, upstream, self._stall_new)
            self._connections[connection.id] = connection
            self._by_socket[client] = connection
            self._by_socket[upstream] = connection

    def _update_interest(self) -> None:
        wanted: dict[socket.socket, int] = {}
        for connection in self._connections.values():
            for pipe in (connection.up, connection.down):
                if not pipe.src_eof and len(pipe.buffer) < _BUFFER_LIMIT:
                    wanted[pipe.src] = wanted.get(pipe.src, 0) | selectors.EVENT_READ
                if not connection.stalled and not pipe.finished and pipe.buffer:
                    wanted[pipe.dst] = wanted.get(pipe.dst, 0) | selectors.EVENT_WRITE
        for sock in list(self._registered):
            if sock not in wanted:
                self._selector.unregister(sock)
                del self._registered[sock]
        for sock, events in wanted.items():
            if sock not in self._registered:
                self._selector.register(sock, events)
            elif self._registered[sock] != events:
                self._selector.modify(sock, events)
            self._registered[sock] = events

    def _service(self, connection: _Connection, sock: socket.socket, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            pipe = connection.up if sock is connection.client else connection.down
            self._read(connection, pipe)
        if connection.closed:
            return
        if mask & selectors.EVENT_WRITE:
            for pipe in (connection.up, connection.down):
                if pipe.dst is sock:
                    self._flush(connection, pipe)
        self._finish_if_done(connection)

    def _read(self, connection: _Connection, pipe: _Pipe) -> None:
        try:
            data = pipe.src.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # An abortive close: the sender's unsent data dies with it, and the other end
            # hears of it as a reset too.
            self._abort_connection(connection)
            return
        if not data:
            pipe.src_eof = True
            if connection.stalled and pipe is connection.up:
                self._gave_up += 1
        elif pipe.broken:
            self._dropped += len(data)  # its receiver is gone
        else:
            pipe.buffer += data
        if not connection.stalled:
            self._flush(connection, pipe)

    def _flush(self, connection: _Connection, pipe: _Pipe) -> None:
        if connection.stalled or pipe.finished:
            return
        while pipe.buffer:
            try:
                sent = pipe.dst.send(pipe.buffer)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self._dropped += len(pipe.buffer)
                pipe.buffer.clear()
                pipe.broken = True
                return
            del pipe.buffer[:sent]
            pipe.forwarded += sent
            if pipe is connection.up:
                self._forwarded_up += sent
            else:
                self._forwarded_down += sent
        if pipe.src_eof and not pipe.dst_shut:
            with contextlib.suppress(OSError):
                pipe.dst.shutdown(socket.SHUT_WR)
            pipe.dst_shut = True

    def _finish_if_done(self, connection: _Connection) -> None:
        if connection.up.finished and connection.down.finished:
            self._close_connection(connection, abortive=False)

    def _close_connection(self, connection: _Connection, *, abortive: bool) -> None:
        if connection.closed:
            return
        connection.closed = True
        for sock in (connection.client, connection.upstream):
            if sock in self._registered:
                self._selector.unregister(sock)
                del self._registered[sock]
            self._by_socket.pop(sock, None)
            if abortive:
                _abort(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.close()
        self._connections.pop(connection.id, None)

    def _abort_connection(self, connection: _Connection) -> None:
        self._dropped += len(connection.up.buffer) + len(connection.down.buffer)
        connection.up.buffer.clear()
        connection.down.buffer.clear()
        self._close_connection(connection, abortive=True)

    def _set_stall(self, *, current: bool, new: bool) -> None:
        self._stall_new = new
        for connection in list(self._connections.values()):
            connection.stalled = current
            if not current:
                self._flush(connection, connection.up)
                self._flush(connection, connection.down)
                self._finish_if_done(connection)

    def _set_one(self, ident: int, *, stalled: bool) -> None:
        connection = self._connections.get(ident)
        if connection is None:
            raise KeyError(f"no open connection {ident}")
        connection.stalled = stalled
        if not stalled:
            self._flush(connection, connection.up)
            self._flush(connection, connection.down)
            self._finish_if_done(connection)

    def _cut_all(self) -> int:
        connections = list(self._connections.values())
        for connection in connections:
            self._abort_connection(connection)
        self._cuts += len(connections)
        return len(connections)

    def _cut_one(self, ident: int) -> None:
        connection = self._connections.get(ident)
        if connection is None:
            raise KeyError(f"no open connection {ident}")
        self._abort_connection(connection)
        self._cuts += 1

    def _held(self) -> tuple[int, int]:
        up = down = 0
        for connection in self._connections.values():
            if connection.stalled:
                up += len(connection.up.buffer)
                down += len(connection.down.buffer)
        return up, down

    def _account_peak(self) -> None:
        up, down = self._held()
        self._peak_held = max(self._peak_held, up + down)

    def _snapshot(self) -> ProxyCounters:
        up, down = self._held()
        return ProxyCounters(
            accepted=self._accepted,
            open=len(self._connections),
            refused=self._refused,
            forwarded_up=self._forwarded_up,
            forwarded_down=self._forwarded_down,
            held_up=up,
            held_down=down,
            peak_held=max(self._peak_held, up + down),
            dropped=self._dropped,
            cuts=self._cuts,
            client_closed_while_stalled=self._gave_up,
        )


@contextlib.contextmanager
def proxied_database_url(database_url: str) -> Iterator[tuple[str, FaultProxy]]:
    """``database_url`` through a loopback proxy (which counts what the server sends, e.g.
    ``counters().forwarded_down``), and the proxy."""
    parts = urlsplit(database_url)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    upstream = (parts.hostname or "127.0.0.1", parts.port or 5432)
    with FaultProxy(("127.0.0.1", port), upstream) as proxy:
        credentials = parts.netloc.rsplit("@", 1)[0]
        yield urlunsplit(parts._replace(netloc=f"{credentials}@127.0.0.1:{port}")), proxy
