"""The parts of aiokafka the relay uses that are not its public API, and the start-up check
that they are there.

relay/producer_reset.py resets a producer abortively through its client's connections,
its sender task and its accumulator; relay/publisher.py builds record batches itself with
``BatchBuilder`` and the producer's compression. aiokafka may rename any of these in a
release without notice, and a rename must not quietly turn the reset off (that reset is
what keeps per-key order when a path to the broker stalls). So pyproject.toml bounds
aiokafka to the releases tested, and the relay checks each of these names before its
first producer connects: one that is missing refuses the start in one line naming the
installed aiokafka version. tests/unit/test_kafka_internals.py fails when relay/ reaches
a private name this list does not hold.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import aiokafka
from aiokafka import AIOKafkaProducer
from aiokafka.conn import AIOKafkaConnection
from aiokafka.producer.message_accumulator import BatchBuilder, MessageBatch

from contracts.errors import ConfigError


@dataclass(frozen=True)
class KafkaInternal:
    """One name of aiokafka's that the relay relies on, on the object that holds it."""

    owner: str
    name: str
    used_for: str


INTERNALS: Final = (
    KafkaInternal(
        "AIOKafkaProducer", "_sender", "producer_reset: cancel the sender task on a reset"
    ),
    KafkaInternal("Sender", "sender_task", "producer_reset: the task a reset cancels"),
    KafkaInternal(
        "AIOKafkaProducer",
        "_message_accumulator",
        "producer_reset: fail every batch it holds; publisher: its compression",
    ),
    KafkaInternal("MessageAccumulator", "fail_all", "producer_reset: fail every held batch"),
    KafkaInternal(
        "Sender", "_fail_all", "producer_reset: its end-of-task handler, removed on a reset"
    ),
    KafkaInternal("MessageAccumulator", "_batches", "producer_reset: the batches still queued"),
    KafkaInternal(
        "MessageAccumulator",
        "_pending_batches",
        "producer_reset: queued batches counted as sent before they are failed",
    ),
    KafkaInternal("MessageBatch", "drain_ready", "producer_reset: a queued batch taken as if sent"),
    KafkaInternal(
        "MessageAccumulator",
        "_compression_type",
        "publisher: build batches with the producer's compression",
    ),
    KafkaInternal(
        "AIOKafkaClient", "_get_conn", "producer_reset: see every connection the client opens"
    ),
    KafkaInternal("AIOKafkaClient", "_conns", "producer_reset: the connections a reset aborts"),
    KafkaInternal("AIOKafkaConnection", "_writer", "producer_reset: the transport to abort"),
    KafkaInternal("AIOKafkaConnection", "connected", "producer_reset: which ones are open"),
    KafkaInternal("AIOKafkaConnection", "close", "producer_reset: close a late connection"),
    KafkaInternal(
        "BatchBuilder",
        "__init__",
        "publisher: BatchBuilder(batch_size, compression_type), an empty batch",
    ),
    KafkaInternal(
        "BatchBuilder", "append", "publisher: add a record (timestamp, key, value, headers)"
    ),
    KafkaInternal("BatchBuilder", "size", "publisher: a batch's bytes, for a refusal"),
    KafkaInternal("BatchBuilder", "record_count", "publisher: a batch's records, for a refusal"),
)
"""Every name of aiokafka's the relay uses beyond its public API."""

_APPEND_KEYWORDS: Final = ("timestamp", "key", "value", "headers")


def _owners(producer: Any, connection: Any) -> dict[str, Any]:
    """Each owner of :data:`INTERNALS` as it sits in a producer (None: not reachable)."""
    accumulator = getattr(producer, "_message_accumulator", None)
    return {
        "AIOKafkaProducer": producer,
        "Sender": getattr(producer, "_sender", None),
        "MessageAccumulator": accumulator,
        "AIOKafkaClient": getattr(producer, "client", None),
        "AIOKafkaConnection": connection,
        "BatchBuilder": BatchBuilder,
        "MessageBatch": MessageBatch,
    }


def _builds_a_batch() -> bool:
    """A batch is built as relay/publisher.py builds one (0: no compression)."""
    try:
        builder = BatchBuilder(16 * 1024, 0)
        appended = builder.append(timestamp=None, key=b"k", value=b"v", headers=[])
        return appended is not None and builder.record_count() == 1 and builder.size() > 0
    except Exception:  # any failure means its shape changed
        return False


def _present(internal: KafkaInternal, owner: Any) -> bool:
    if internal.owner == "BatchBuilder" and internal.name == "__init__":
        return _builds_a_batch()
    if internal.owner == "BatchBuilder" and internal.name == "append":
        parameters = inspect.signature(BatchBuilder.append).parameters
        return all(keyword in parameters for keyword in _APPEND_KEYWORDS)
    return owner is not None and hasattr(owner, internal.name)


def missing_from(producer: Any, connection: Any) -> list[str]:
    """``Owner.name`` of each internal that ``producer`` (its sender, accumulator and
    client), ``connection`` and ``BatchBuilder`` lack; empty when all are there."""
    owners = _owners(producer, connection)
    return [
        f"{internal.owner}.{internal.name}"
        for internal in INTERNALS
        if not _present(internal, owners[internal.owner])
    ]


def supported_range() -> str | None:
    """The aiokafka requirement this installation was built with (pyproject.toml's)."""
    try:
        requirements = metadata.requires("outbox-relay") or []
    except metadata.PackageNotFoundError:
        return None
    return next(
        (r.split(";")[0].strip() for r in requirements if r.lower().startswith("aiokafka")),
        None,
    )


async def check_kafka_internals() -> None:
    """Refuse to start (:class:`ConfigError`, one line naming the installed aiokafka
    version) when an internal the relay uses is missing. Makes a producer and a
    connection that never connect; call it with an event loop running."""
    producer = AIOKafkaProducer(bootstrap_servers="localhost:9092", enable_idempotence=True)
    missing = missing_from(producer, AIOKafkaConnection("localhost", 9092))
    try:
        await producer.stop()  # it opened nothing; this only marks it closed
    except Exception:
        if not missing:
            raise
        # stop() itself reaches for what is missing: the line below says what that is.
    if missing:
        wanted = supported_range()
        raise ConfigError(
            f"aiokafka {aiokafka.__version__} lacks what the relay relies on: "
            f"{', '.join(missing)} (relay/kafka_internals.py)"
            + (f"; install {wanted}" if wanted else "")
        )
