"""The aiokafka internals the relay uses: bounded in pyproject.toml, all listed in
relay/kafka_internals.py, and checked at start against the installed aiokafka."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiokafka
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.conn import AIOKafkaConnection
from aiokafka.producer.message_accumulator import BatchBuilder, MessageAccumulator, MessageBatch
from aiokafka.producer.sender import Sender
from packaging.requirements import Requirement

from contracts.errors import ConfigError
from relay.kafka_internals import INTERNALS, KafkaInternal, check_kafka_internals, missing_from

REPO = Path(__file__).resolve().parents[2]
RELAY = REPO / "relay"
CLASSES: dict[str, type[Any]] = {
    "AIOKafkaProducer": AIOKafkaProducer,
    "Sender": Sender,
    "MessageAccumulator": MessageAccumulator,
    "AIOKafkaConnection": AIOKafkaConnection,
    "BatchBuilder": BatchBuilder,
    "MessageBatch": MessageBatch,
}
# Private names relay/ reaches on objects that are not aiokafka's, and why each is fine.
NOT_AIOKAFKA = {
    "_make": "NamedTuple._make, a documented standard-library method (relay/engine.py)",
}


# -- the version range ---------------------------------------------------------------------
def _aiokafka_requirement() -> Requirement:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    (requirement,) = [
        Requirement(text)
        for text in pyproject["project"]["dependencies"]
        if Requirement(text).name == "aiokafka"
    ]
    return requirement


def test_aiokafka_is_bounded_above_and_the_installed_version_is_in_range() -> None:
    requirement = _aiokafka_requirement()
    assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier)
    assert requirement.specifier.contains(aiokafka.__version__)


# -- the check -----------------------------------------------------------------------------
async def test_the_installed_aiokafka_passes_the_check() -> None:
    await check_kafka_internals()


@pytest.fixture
async def made() -> Any:
    """A producer and a connection as the check makes them (never connected)."""
    producer = AIOKafkaProducer(bootstrap_servers="localhost:9092", enable_idempotence=True)
    connection = AIOKafkaConnection("localhost", 9092)
    yield producer, connection
    await producer.stop()


def _owner(internal: KafkaInternal, producer: Any, connection: Any) -> Any:
    return {
        "AIOKafkaProducer": producer,
        "Sender": producer._sender,
        "MessageAccumulator": producer._message_accumulator,
        "AIOKafkaClient": producer.client,
        "AIOKafkaConnection": connection,
        "MessageBatch": MessageBatch,
    }[internal.owner]


def _remove(
    internal: KafkaInternal, producer: Any, connection: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Take ``internal`` away, as an aiokafka that renamed or reshaped it would."""
    if internal.owner == "BatchBuilder":
        if internal.name == "__init__":
            # An older shape: BatchBuilder(magic, batch_size, compression_type).
            def old_init(self: Any, magic: int, batch_size: int, compression: int) -> None:
                raise TypeError("missing argument")

            monkeypatch.setattr(BatchBuilder, "__init__", old_init)
        elif internal.name == "append":
            monkeypatch.setattr(BatchBuilder, "append", lambda self, record: None)
        else:
            monkeypatch.delattr(BatchBuilder, internal.name)
        return
    owner = _owner(internal, producer, connection)
    # Put back after the test (before the producer is stopped, which uses them).
    if internal.name in vars(owner):
        monkeypatch.delattr(owner, internal.name)
    else:  # a method or property: gone from the class
        monkeypatch.delattr(type(owner), internal.name)


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda i: f"{i.owner}.{i.name}")
def test_each_internal_that_is_missing_is_named(
    made: Any, internal: KafkaInternal, monkeypatch: pytest.MonkeyPatch
) -> None:
    producer, connection = made
    assert missing_from(producer, connection) == []
    _remove(internal, producer, connection, monkeypatch)
    assert f"{internal.owner}.{internal.name}" in missing_from(producer, connection)


async def test_a_missing_internal_refuses_the_start_naming_the_aiokafka_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = AIOKafkaConnection.__init__

    def renamed(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self._stream_writer = self.__dict__.pop("_writer")

    monkeypatch.setattr(AIOKafkaConnection, "__init__", renamed)
    with pytest.raises(ConfigError) as caught:
        await check_kafka_internals()
    message = str(caught.value)
    assert f"aiokafka {aiokafka.__version__}" in message
    assert "AIOKafkaConnection._writer" in message
    assert "aiokafka<" in message or "aiokafka>=" in message  # the range to install
    assert "\n" not in message


# -- what relay/ reaches ---------------------------------------------------------------------
def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_accesses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, name) of every private attribute read or written on an object other than
    ``self``, ``cls`` or ``super()``, and of every getattr/setattr/hasattr/delattr with a
    private name written out."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
                continue
            yield node.lineno, node.attr
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            yield node.lineno, node.args[1].value


def relay_sources() -> list[Path]:
    return sorted(RELAY.rglob("*.py"))


def test_relay_reaches_no_private_name_the_check_does_not_list() -> None:
    listed = {internal.name for internal in INTERNALS}
    unlisted = [
        f"{path.relative_to(REPO)}:{line} {name}"
        for path in relay_sources()
        for line, name in private_accesses(ast.parse(path.read_text(encoding="utf-8")))
        if name not in listed and name not in NOT_AIOKAFKA
    ]
    assert not unlisted, (
        "private names relay/ uses that relay/kafka_internals.py does not check: "
        + ", ".join(unlisted)
    )


def test_every_private_name_the_check_lists_is_used_in_relay() -> None:
    used = {
        name
        for path in relay_sources()
        if path.name != "kafka_internals.py"
        for _, name in private_accesses(ast.parse(path.read_text(encoding="utf-8")))
    }
    listed = {internal.name for internal in INTERNALS if _private(internal.name)}
    assert listed <= used, f"listed but no longer used: {sorted(listed - used)}"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("conn._writer.transport.abort()", {"_writer"}),
        ("w = getattr(conn, '_reader', None)", {"_reader"}),
        ("self._producer._sender.sender_task", {"_sender"}),
        ("self._conns.append(c)", set()),
        ("super()._x", set()),
        ("type(e).__name__", set()),
    ],
)
def test_the_scan_finds_private_names_on_other_objects(source: str, found: set[str]) -> None:
    assert {name for _, name in private_accesses(ast.parse(source))} == found


def test_the_classes_named_are_aiokafkas() -> None:
    owners = {internal.owner for internal in INTERNALS}
    assert owners <= {*CLASSES, "AIOKafkaClient"}
