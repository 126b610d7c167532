"""Which settled batches one recording statement may take together (relay/engine.py)."""

from __future__ import annotations

from relay.engine import Batch, Settled, may_join
from relay.outcome import FailedRow, Outcome
from relay.retry import NAMED_CLASSES
from tests.support.rows import make_row


def _settled(rows: int, fences: dict[int, int], *, failed: bool = False) -> Settled:
    made = [make_row(seq=n + 1) for n in range(rows)]
    outcome = Outcome(
        published=[], refused=[], rejected=[FailedRow(made[0], NAMED_CLASSES[0])] if failed else []
    )
    batch = Batch(rows=made, fences=fences, submission=None, spans=None)  # type: ignore[arg-type]
    return Settled(batch, outcome)


def test_batches_without_failures_on_the_same_fences_join() -> None:
    assert may_join([_settled(3, {1: 7})], _settled(2, {1: 7, 2: 4}), max_rows=10)


def test_a_lane_under_another_fence_keeps_its_batch_apart() -> None:
    # Claimed again between the two batches: each statement is fenced by one claim.
    assert not may_join([_settled(3, {1: 7})], _settled(2, {1: 8}), max_rows=10)


def test_a_batch_with_a_failure_is_recorded_alone() -> None:
    assert not may_join([_settled(3, {1: 7}, failed=True)], _settled(2, {1: 7}), max_rows=10)
    assert not may_join([_settled(3, {1: 7})], _settled(2, {1: 7}, failed=True), max_rows=10)


def test_full_batches_keep_a_statement_each() -> None:
    assert may_join([_settled(6, {1: 7})], _settled(4, {1: 7}), max_rows=10)
    assert not may_join([_settled(6, {1: 7})], _settled(5, {1: 7}), max_rows=10)
