"""The ``run`` verb's process-wide settings (outbox_relay/runtime.py).

It keeps the memory its large, short-lived buffers free instead of faulting it in again:
a drain builds and frees buffers of about a megabyte for every batch (rows read from
PostgreSQL, produce requests), and with glibc's defaults each free of such a block went
back to the kernel, so the next batch faulted the same pages in again
(docs/benchmarks.md#findings).
And it freezes what start-up built, so full collections stop walking it, and spaces the
young collections out past what one batch allocates.
"""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_relay import cli, runtime
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.runtime import freeze_startup_heap, space_young_collections
from outbox_relay.settings import ServiceSettings
from relay.records import RecordMapper
from tests.support.rows import make_row

glibc_only = pytest.mark.skipif(
    runtime._glibc_mallopt() is None, reason="the thresholds are glibc's"
)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The test process's heap is left as it was found."""
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()


def test_a_full_collection_no_longer_walks_what_start_up_built(unfrozen: None) -> None:
    # Alive, not merely not yet collected: earlier tests in this process leave garbage
    # that the freeze collects first.
    gc.collect()
    alive = len(gc.get_objects())  # imports alone: tens of thousands
    frozen = freeze_startup_heap()
    assert frozen == gc.get_freeze_count() >= alive * 0.9
    # what a full collection would still walk: only what came after the freeze
    assert len(gc.get_objects(generation=2)) < alive / 20


# A batch's worth of transient megabyte buffers, 200 times over; prints the minor page
# faults of the loop alone. The environment is cleared of glibc's own knobs in the test.
_CHURN = """
import resource, sys
from outbox_relay.runtime import tune_allocator
tuned = sys.argv[1] == "tuned" and tune_allocator()
chunk = b"x" * (1 << 20)
def batch():
    parts = [chunk + b"%d" % i for i in range(4)]  # four live at once, as in a request
    return len(b"".join(parts))
batch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(200):
    batch()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> tuple[str, int]:
    env = {"PATH": "/usr/bin:/bin"}  # no GLIBC_TUNABLES, no MALLOC_*_ from the caller
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], env=env, check=True, capture_output=True, text=True
    ).stdout.split()
    return out[0], int(out[1])


@glibc_only
def test_freed_megabyte_buffers_are_reused_not_faulted_in_again() -> None:
    _, untuned = _faults("untuned")
    tuned_flag, tuned = _faults("tuned")
    assert tuned_flag == "True"
    # 200 rounds of 8 MiB: untuned, the pages come back from the kernel every round
    assert untuned > 200 * 256
    assert tuned < untuned / 20


def test_an_operators_own_malloc_settings_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    def mallopt(option: int, value: int) -> int:
        calls.append((option, value))
        return 1

    monkeypatch.setattr(runtime, "_glibc_mallopt", lambda: mallopt)
    for name in ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_"):
        monkeypatch.setenv(
            name, "glibc.malloc.trim_threshold=1" if name == "GLIBC_TUNABLES" else "1"
        )
        assert runtime.tune_allocator() is False
        monkeypatch.delenv(name)
    assert calls == []
    assert runtime.tune_allocator() is True
    assert len(calls) == 2


@pytest.fixture
def thresholds() -> Iterator[None]:
    """The test process's collector thresholds are left as they were found."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def _young_collections_while_one_batch_is_held() -> int:
    """Map a default batch of rows to records and keep them, as one fetch's batch stays in
    flight until it is recorded; the young collections that ran meanwhile."""
    mapper = RecordMapper(topic_template="outbox.{aggregatetype}", ce_source="urn:test")
    rows = [make_row(seq=seq, aggregateid=f"key-{seq % 100}") for seq in range(1, 1001)]
    gc.collect()
    before = gc.get_stats()[0]["collections"]
    held = [mapper.to_record(row) for row in rows]
    after = gc.get_stats()[0]["collections"]
    assert len(held) == len(rows)
    return after - before


def test_young_collections_wait_for_more_than_one_batch(thresholds: None) -> None:
    # Every young collection walks what is still alive since the last one: under a
    # backlog that is the rows and records of the batches in flight, all of it live.
    # At the interpreter's default (700) a batch cost several collections that freed
    # nothing (docs/benchmarks.md#findings).
    space_young_collections()
    assert _young_collections_while_one_batch_is_held() <= 1
    # the older generations keep the interpreter's ratios
    assert gc.get_threshold()[1:] == (10, 10)


async def test_run_tunes_the_allocator_and_freezes_the_heap_before_the_service(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(cli, "tune_allocator", lambda: calls.append("allocator") or True)
    monkeypatch.setattr(cli, "freeze_startup_heap", lambda: calls.append("freeze") or 0)
    monkeypatch.setattr(cli, "space_young_collections", lambda: calls.append("collector"))

    async def service(settings: ServiceSettings) -> int:
        calls.append("service")
        return 0

    monkeypatch.setattr(cli, "run_service", service)
    args = build_parser().parse_args(["run", "--no-relay", "--policy", "docs/policy.example.toml"])
    settings = resolve(args, {})
    assert isinstance(settings, ServiceSettings)
    assert await cli._serve(settings) == 0
    assert calls == ["allocator", "freeze", "collector", "service"]


_POLICY = str(Path(__file__).resolve().parents[2] / "docs" / "policy.example.toml")
_LOOP_OF = """
import asyncio, sys
from outbox_relay import cli
async def which(_settings):
    return print(type(asyncio.get_running_loop()).__module__) or 0
cli._run_verb = which
cli._run(cli.resolve(cli.build_parser().parse_args(sys.argv[1:])))
"""


@pytest.mark.parametrize(
    ("argv", "loop"),
    [
        (
            ["run", "--no-relay", "--database-url", "postgresql://h/d", "--policy", _POLICY],
            "uvloop",
        ),
        (["migrate", "--database-url", "postgresql://h/d"], "asyncio"),
    ],
)
def test_run_alone_runs_on_uvloop(argv: list[str], loop: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _LOOP_OF, *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(".")[0].strip() == loop
