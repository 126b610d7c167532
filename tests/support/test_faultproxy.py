"""The fault proxy against a tiny local upstream: forwarding, stall, heal, cut. No Kafka."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.faultproxy import FaultProxy, parse_address
from tests.support.kafka_paths import ProxyRoute, parse_routes, started_proxies
from tests.support.ports import free_port
from tests.support.waiting import wait_until_blocking


class Upstream:
    """A loopback server that echoes (or only collects) what each connection sends."""

    def __init__(self, *, echo: bool = True) -> None:
        self.echo = echo
        self.received: list[bytearray] = []
        self.ends: list[str] = []  # per finished connection: "eof" or "reset"
        self.sockets: list[socket.socket] = []  # the server side, to push bytes unasked
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                buffer = bytearray()
                self.received.append(buffer)
                self.sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn, buffer), daemon=True).start()

    def _serve(self, conn: socket.socket, buffer: bytearray) -> None:
        end = "eof"
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except ConnectionResetError:
                    end = "reset"
                    break
                if not data:
                    break
                with self._lock:
                    buffer += data
                if self.echo:
                    with contextlib.suppress(OSError):
                        conn.sendall(data)
        with self._lock:
            self.ends.append(end)

    def total(self) -> int:
        with self._lock:
            return sum(len(b) for b in self.received)

    def close(self) -> None:
        self._listener.close()


def _recv_exactly(sock: socket.socket, size: int, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def _nothing_arrives(sock: socket.socket, within: float = 0.3) -> bool:
    sock.settimeout(within)
    try:
        sock.recv(1)
    except TimeoutError:
        return True
    return False


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.close()


@pytest.fixture
def sink() -> Iterator[Upstream]:
    server = Upstream(echo=False)
    yield server
    server.close()


def _proxy_to(server: Upstream) -> FaultProxy:
    return FaultProxy(("127.0.0.1", 0), server.address)


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:19094") == ("127.0.0.1", 19094)
    with pytest.raises(ValueError, match="host:port"):
        parse_address("19094")


def test_parse_routes() -> None:
    text = "127.0.0.1:19094>127.0.0.1:9094, 127.0.0.1:19095>127.0.0.1:9095,"
    assert parse_routes(text) == [
        ProxyRoute("127.0.0.1:19094", "127.0.0.1:9094"),
        ProxyRoute("127.0.0.1:19095", "127.0.0.1:9095"),
    ]
    assert parse_routes("") == []
    with pytest.raises(ValueError, match="listen>upstream"):
        parse_routes("127.0.0.1:19094")
    with pytest.raises(ValueError, match="host:port"):
        parse_routes("127.0.0.1:19094>9094")


def test_started_proxies_follow_their_routes(upstream: Upstream) -> None:
    target = f"{upstream.address[0]}:{upstream.address[1]}"
    port = free_port()
    with started_proxies([ProxyRoute(f"127.0.0.1:{port}", target)]) as [proxy]:
        assert proxy.listen == f"127.0.0.1:{port}"
        with socket.create_connection(proxy.address) as client:
            client.sendall(b"route")
            assert _recv_exactly(client, 5) == b"route"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_forwards_both_ways_and_counts_the_bytes(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy, socket.create_connection(proxy.address) as client:
        client.sendall(b"x" * 100_000)
        assert _recv_exactly(client, 100_000) == b"x" * 100_000
        counters = proxy.counters()
    assert counters.accepted == 1
    assert counters.forwarded_up == counters.forwarded_down == 100_000
    assert counters.held == counters.peak_held == counters.dropped == 0


def test_stall_holds_bytes_both_ways_and_heal_delivers_them(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy, socket.create_connection(proxy.address) as client:
        client.sendall(b"before")
        assert _recv_exactly(client, 6) == b"before"
        proxy.stall()
        client.sendall(b"held")
        counters = proxy.wait_until(lambda c: c.held_up == 4)
        assert _nothing_arrives(client)
        assert upstream.total() == 6  # the upstream never saw the held bytes
        assert counters.forwarded_up == 6
        proxy.heal()
        assert _recv_exactly(client, 4) == b"held"
        after = proxy.counters()
    assert after.held == 0
    assert after.peak_held == 4
    assert after.forwarded_up == after.forwarded_down == 10


def test_stall_holds_what_the_upstream_sends(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy, socket.create_connection(proxy.address) as client:
        client.sendall(b"hi")
        assert _recv_exactly(client, 2) == b"hi"
        proxy.stall()
        upstream.sockets[0].sendall(b"unasked")
        counters = proxy.wait_until(lambda c: c.held_down == 7)
        assert counters.held_up == 0
        assert _nothing_arrives(client)
        proxy.heal()
        assert _recv_exactly(client, 7) == b"unasked"


def test_stall_applies_to_connections_accepted_later(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy:
        proxy.stall()
        with socket.create_connection(proxy.address) as client:
            client.sendall(b"new")
            proxy.wait_until(lambda c: c.held_up == 3)
            assert _nothing_arrives(client)
            assert proxy.connections()[0].stalled
            proxy.heal()
            assert _recv_exactly(client, 3) == b"new"


def test_stall_new_only_keeps_current_connections_flowing(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy, socket.create_connection(proxy.address) as old:
        old.sendall(b"a")
        assert _recv_exactly(old, 1) == b"a"
        proxy.stall_new_only()
        with socket.create_connection(proxy.address) as new:
            new.sendall(b"b")
            old.sendall(b"c")
            assert _recv_exactly(old, 1) == b"c"
            proxy.wait_until(lambda c: c.held_up == 1)
            assert _nothing_arrives(new)
            proxy.heal()
            assert _recv_exactly(new, 1) == b"b"


def test_one_connection_stalls_while_another_forwards(upstream: Upstream) -> None:
    with (
        _proxy_to(upstream) as proxy,
        socket.create_connection(proxy.address) as first,
        socket.create_connection(proxy.address) as second,
    ):
        proxy.wait_until(lambda c: c.open == 2)
        one, _ = proxy.connections()
        proxy.stall_connection(one.id)
        first.sendall(b"1")
        second.sendall(b"2")
        assert _recv_exactly(second, 1) == b"2"
        proxy.wait_until(lambda c: c.held_up == 1)
        assert _nothing_arrives(first)
        proxy.heal_connection(one.id)
        assert _recv_exactly(first, 1) == b"1"


def test_cut_resets_both_sides_and_drops_what_was_held(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy, socket.create_connection(proxy.address) as client:
        client.sendall(b"ok")
        assert _recv_exactly(client, 2) == b"ok"
        proxy.stall()
        client.sendall(b"lost")
        proxy.wait_until(lambda c: c.held_up == 4)
        assert proxy.cut() == 1
        client.settimeout(5)
        with pytest.raises(ConnectionResetError):
            client.recv(1)
        wait_until_blocking(
            lambda: upstream.ends == ["reset"], timeout=5, interval=0.01, what="the upstream reset"
        )
        counters = proxy.counters()
        assert counters.open == 0
        assert counters.cuts == 1
        assert counters.dropped == 4
        assert upstream.total() == 2  # the held bytes never arrived
        proxy.heal()
        assert upstream.total() == 2
        # The proxy itself keeps serving new connections.
        with socket.create_connection(proxy.address) as again:
            again.sendall(b"again")
            assert _recv_exactly(again, 5) == b"again"


def test_graceful_close_while_stalled_delivers_the_held_bytes_after_heal(sink: Upstream) -> None:
    with _proxy_to(sink) as proxy:
        proxy.stall()
        with socket.create_connection(proxy.address) as client:
            client.sendall(b"late request")
        counters = proxy.wait_until(lambda c: c.client_closed_while_stalled == 1)
        assert counters.held_up == len(b"late request")
        time.sleep(0.2)
        assert sink.total() == 0
        proxy.heal()
        wait_until_blocking(
            lambda: sink.total() == len(b"late request"),
            timeout=5,
            interval=0.01,
            what="the held request delivered",
        )
        wait_until_blocking(
            lambda: sink.ends == ["eof"], timeout=5, interval=0.01, what="the close after the data"
        )
        proxy.wait_until(lambda c: c.open == 0)


def test_abortive_close_while_stalled_drops_the_held_bytes(sink: Upstream) -> None:
    with _proxy_to(sink) as proxy:
        proxy.stall()
        client = socket.create_connection(proxy.address)
        client.sendall(b"never")
        proxy.wait_until(lambda c: c.held_up == 5)
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()
        counters = proxy.wait_until(lambda c: c.open == 0)
        assert counters.dropped == 5
        proxy.heal()
        wait_until_blocking(
            lambda: sink.ends == ["reset"], timeout=5, interval=0.01, what="the reset passed on"
        )
        assert sink.total() == 0


def test_upstream_down_refuses_the_client() -> None:
    with FaultProxy(("127.0.0.1", 0), ("127.0.0.1", free_port())) as proxy:
        with socket.create_connection(proxy.address) as client:
            client.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert client.recv(1) == b""
        assert proxy.wait_until(lambda c: c.refused == 1).open == 0


def test_close_stops_listening_and_the_port_can_be_bound_again(upstream: Upstream) -> None:
    proxy = _proxy_to(upstream).start()
    address = proxy.address
    client = socket.create_connection(address)
    proxy.close()
    proxy.close()  # twice is harmless
    client.settimeout(5)
    with contextlib.suppress(ConnectionResetError):
        assert client.recv(1) == b""
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=1).close()
    with FaultProxy(address, upstream.address) as again:
        assert again.address == address
    with pytest.raises(RuntimeError, match="not running"):
        proxy.counters()


async def test_usable_from_an_event_loop(upstream: Upstream) -> None:
    with _proxy_to(upstream) as proxy:
        reader, writer = await asyncio.open_connection(*proxy.address)
        proxy.stall()
        writer.write(b"async")
        await writer.drain()
        counters = await proxy.until(lambda c: c.held_up == 5)
        assert counters.held == 5
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.readexactly(5), 0.2)
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"async"
        writer.close()
        await writer.wait_closed()
