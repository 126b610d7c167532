"""Abortive reset of a Kafka producer: nothing it still holds may reach the broker later.

The idempotent producer retries a batch until the broker takes it; aiokafka never expires
one. When the relay gives up on a batch (its path to the broker stalled past the send
timeout, a drain deadline, a lease about to end), that batch must not land later, after
the lane's next owner published newer records of the same keys. Three things can still
carry it: the sender task (it would retry on a new connection), bytes in the client's
buffers (asyncio's and the kernel's) and the producer's accumulator. A reset stops all
three at once:

- the sender task is cancelled, so nothing is written again;
- every connection the producer ever opened — also those aiokafka already closed on a
  request timeout, whose buffered bytes a graceful close would still flush — is closed
  abortively: ``SO_LINGER`` 0 and ``transport.abort()``, so the kernel sends RST and
  discards unsent bytes instead of delivering them when the path heals;
- every batch still held fails with the given cause, so the relay records it (retriable)
  and the rows are published again, in order, by whoever holds the lane.

What this relies on: bytes that did not leave this host before the reset die with the
connection (true for a stalled network path; not for a middlebox that acknowledged and
buffers them — see docs/relay.md). It touches aiokafka internals (``client._get_conn``,
``_conns``, ``_sender``, ``_message_accumulator``, a connection's ``_writer``): they are
listed in relay/kafka_internals.py, which checks them before the first producer starts,
pyproject.toml bounds aiokafka to the releases tested, and tests/faults exercise the
reset against the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiokafka import AIOKafkaProducer

log = logging.getLogger(__name__)

_LINGER_ZERO = struct.pack("ii", 1, 0)


def _linger_zero(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        # A transport that is closing has no descriptor left to set: the standard
        # library's socket says OSError, uvloop's ValueError. Either way it is gone.
        with contextlib.suppress(OSError, ValueError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)


def _take_queued(accumulator: Any) -> None:
    """Take every batch the accumulator still queues as the sender takes one to send
    (drained, and pending), so that failing it next is quiet.

    Failed while queued, a batch sets an error on its drain waiter, which nobody awaits
    once the producer is given up ("Future exception was never retrieved", logged as an
    error); and one the sender had sent once and put back after a retriable error keeps
    the callback that drops it from the pending set, which then raises KeyError. The
    accumulator is being given up: its bookkeeping only has to let both pass.
    """
    for queued in accumulator._batches.values():
        for batch in queued:
            batch.drain_ready()
        accumulator._pending_batches.update(queued)


class ProducerReset:
    """Tracks a producer's broker connections from the start; :meth:`reset` kills them all."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self._producer = producer
        self._transports: list[asyncio.WriteTransport] = []
        self._conns: list[Any] = []
        self._stopping = False
        self.done = False
        client: Any = producer.client
        original: Callable[..., Awaitable[Any]] = client._get_conn

        async def get_conn(*args: Any, **kwargs: Any) -> Any:
            conn = await original(*args, **kwargs)
            if conn is None:  # the client could not connect
                return None
            # Read directly: a renamed attribute must fail, never turn the reset off (the
            # start-up check in relay/kafka_internals.py refuses such an aiokafka first).
            writer = conn._writer
            if writer is not None and writer.transport not in self._transports:
                # A new connection (every request asks for its connection; only a new
                # transport is recorded).
                if self._stopping:
                    # The client closes only the connections it had when it closed: one
                    # that lands later would stay open, owned by nobody.
                    conn.close()
                    return None
                # Any later close, aiokafka's own included, is then abortive: a graceful
                # close would deliver the buffered bytes once the path heals.
                _linger_zero(writer.transport)
                self._transports = [t for t in self._transports if not t.is_closing()]
                self._transports.append(writer.transport)
                self._conns = [c for c in self._conns if c.connected()]
                self._conns.append(conn)
            return conn

        client._get_conn = get_conn

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """Around the producer's stop: a connection that opens meanwhile is closed at once,
        and one the stopped client left open (opened while it closed) is closed after."""
        self._stopping = True
        yield
        for conn in self._conns:
            if conn.connected():
                conn.close()
        self._conns = []

    def reset(self, cause: BaseException) -> None:
        """Stop the sender, reset every connection (RST), fail every held batch with ``cause``."""
        if self.done:
            return
        self.done = True
        producer: Any = self._producer
        sender = producer._sender
        accumulator = producer._message_accumulator
        task = sender.sender_task if sender is not None else None
        if task is not None:
            # Its own end-of-task handler would fail the batches with whatever the task
            # ended with, through a transaction manager an idempotent producer half has
            # (an AttributeError logged as an error); this reset fails them itself, below.
            task.remove_done_callback(sender._fail_all)
            task.cancel()
        for transport in self._transports:
            _linger_zero(transport)
            transport.abort()
        for conn in list(producer.client._conns.values()):
            writer = conn._writer  # None once closed
            if writer is not None:
                _linger_zero(writer.transport)
                writer.transport.abort()
            conn.close()
        _take_queued(accumulator)
        accumulator.fail_all(cause)
        if task is not None:
            # A produce request the cancelled sender still awaits can put its batch back
            # into the accumulator as it ends; fail those too, once it has ended.
            def sender_ended(ended: asyncio.Future[Any]) -> None:
                if not ended.cancelled() and ended.exception() is not None:
                    log.debug("the reset kafka sender ended with %r", ended.exception())
                _take_queued(accumulator)
                accumulator.fail_all(cause)

            task.add_done_callback(sender_ended)
        log.warning("kafka producer reset: its unsent records were dropped and fail as retriable")
