"""``outbox-relay`` with one fault planted, for the tests of what the product says about
what nothing expected.

    python -m tests.foundation.planted PLANT [outbox-relay arguments…]

PLANT is one of:

- ``relay-run``: the relay's ``run`` raises at once, so the ``run`` verb ends by it;
- ``migrate``: applying the migrations raises, so ``migrate`` ends by it;
- ``kafka-sender``: aiokafka's sender task crashes on its first round (inside the library);
- ``producer-without:DOTTED``: every AIOKafkaProducer made lacks the attribute at that
  path (``_message_accumulator._compression_type``), as an aiokafka that renamed it would;
- ``connection-without:NAME``: every AIOKafkaConnection made lacks that attribute.

A planted error's message is the environment's ``PLANTED_MESSAGE``: a test looks for it in
the output, and it never sits in a source line a traceback could quote.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.conn import AIOKafkaConnection
from aiokafka.producer.message_accumulator import MessageAccumulator

import outbox_relay.cli
import relay.engine


def _message() -> str:
    return os.environ.get("PLANTED_MESSAGE", "planted")


async def _raising(*_: Any, **__: Any) -> Any:
    raise RuntimeError(_message())


def _raising_sync(*_: Any, **__: Any) -> Any:
    raise RuntimeError(_message())


def _without(cls: type[Any], dotted: str) -> None:
    """Instances of ``cls`` lose the attribute at ``dotted`` right after ``__init__``."""
    original = cls.__init__
    *path, name = dotted.split(".")

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        owner = self
        for step in path:
            owner = getattr(owner, step)
        delattr(owner, name)

    cls.__init__ = init


def plant(name: str) -> None:
    kind, _, argument = name.partition(":")
    match kind:
        case "relay-run":
            relay.engine.Relay.run = _raising
        case "migrate":
            outbox_relay.cli.apply = _raising
        case "kafka-sender":
            MessageAccumulator.drain_by_nodes = _raising_sync
        case "producer-without":
            _without(AIOKafkaProducer, argument)
        case "connection-without":
            _without(AIOKafkaConnection, argument)
        case _:
            raise SystemExit(f"unknown plant {name!r}")


if __name__ == "__main__":
    plant(sys.argv[1])
    sys.exit(outbox_relay.cli.main(sys.argv[2:]))
