"""`run` freezes what start-up built, so full collections stop walking it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from outbox_relay import cli
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.service import freeze_startup_heap
from outbox_relay.settings import ServiceSettings


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test process's heap is left as it was found."""
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_a_full_collection_no_longer_walks_what_start_up_built(unfrozen: None) -> None:
    alive = len(gc.get_objects())  # imports alone: tens of thousands
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() >= alive * 0.9
    # what a full collection would still walk: only what came after the freeze
    assert len(gc.get_objects(generation=2)) < alive / 20


async def test_run_freezes_before_it_starts_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "freeze_startup_heap", lambda: calls.append("freeze") or 0)

    async def service(settings: ServiceSettings) -> int:
        calls.append("service")
        return 0

    monkeypatch.setattr(cli, "run_service", service)
    args = build_parser().parse_args(["run", "--no-relay", "--policy", "docs/policy.example.toml"])
    settings = resolve(args, {})
    assert isinstance(settings, ServiceSettings)
    assert await cli._serve(settings) == 0
    assert calls == ["freeze", "service"]
