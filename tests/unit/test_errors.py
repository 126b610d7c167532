"""The product's error tree: every exception the relay defines sits under ``RelayError``,
itself an ``OutboxRelayError``; and one of the relay's signals that reaches the command
line is told like any unexpected error (by type and place, never its text)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from unittest import mock

import pytest

import outbox_relay.cli as cli
import relay
from contracts.errors import OutboxRelayError

SECRET = "postgresql://relay:s3cret@db.internal/app"


def _relay_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the relay package, by qualified name."""
    found: dict[str, type[BaseException]] = {}
    for module_info in pkgutil.iter_modules(relay.__path__, "relay."):
        module = importlib.import_module(module_info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_of_the_relay_is_under_the_root_error_tree() -> None:
    found = _relay_exceptions()
    assert len(found) >= 8  # the seven signals and the engine's own
    outside = sorted(name for name, kind in found.items() if not issubclass(kind, OutboxRelayError))
    assert outside == []
    from relay.errors import RelayError

    assert issubclass(RelayError, OutboxRelayError)
    assert all(issubclass(kind, RelayError) for kind in found.values())


_SIGNALS = (
    "RecordRejected",
    "Stopped",
    "PredecessorFailed",
    "TopicNotFound",
    "TopicLookupPending",
    "BatchTooLarge",
    "ProducerWasReset",
)


def _signal(name: str) -> BaseException:
    kind = getattr(importlib.import_module("relay.errors"), name)
    signal: BaseException = (
        kind("invalid_topic", SECRET) if name == "RecordRejected" else kind(SECRET)
    )
    return signal


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("name", _SIGNALS)
def test_a_relay_signal_that_reaches_the_command_line_is_an_unexpected_error(
    name: str, grouped: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    signal = _signal(name)
    raised = ExceptionGroup("a task group", [signal]) if grouped else signal
    died: list[BaseException] = []

    async def run_verb(_: object) -> int:
        raise raised

    def record(verb: str, exc: BaseException) -> int:
        died.append(exc)
        return cli.EXIT_FAILURE

    with mock.patch.object(cli, "_run_verb", run_verb), mock.patch.object(cli, "_died", record):
        code = cli.main(["migrate", "--database-url", "postgresql://relay@127.0.0.1:1/app"])

    assert code == cli.EXIT_FAILURE
    assert len(died) == 1
    assert died[0] is raised or signal in getattr(died[0], "exceptions", ())
    # Told as the unexpected error it is: nothing of its text on the terminal.
    assert SECRET not in capsys.readouterr().err
