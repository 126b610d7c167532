"""Narrowing a failed fetch to its row (relay/narrowing.py), over a simulated outbox: which
row is quarantined, and when nothing is. No services."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from relay.narrowing import AFTER_ROWS, Narrowing, Step, StepKind


@dataclass
class Outbox:
    """Candidate rows by seq; a fetch fails when it would read a bad one (or always, under
    load); LIST reads seqs only and never fails."""

    seqs: list[int]
    bad: set[int] = field(default_factory=set)
    load: bool = False
    probes: list[Step] = field(default_factory=list)

    def after(self, start: int, limit: int) -> list[int]:
        return [seq for seq in self.seqs if seq > start][:limit]

    def run(self, narrowing: Narrowing) -> Step:
        while (step := narrowing.step()).kind not in (StepKind.QUARANTINE, StepKind.GIVE_UP):
            self.probes.append(step)
            read = self.after(step.start, step.limit)
            if step.kind is StepKind.LIST:
                narrowing.listed(read)
            else:
                narrowing.fetched(not self.load and not self.bad.intersection(read))
        return step


def narrowed(outbox: Outbox, start: int = 0, limit: int = 1000) -> Step:
    return outbox.run(Narrowing(start, limit))


@pytest.mark.parametrize("position", [2, 17, 500, 999, 1000])
def test_one_bad_row_among_a_thousand_is_found_in_a_few_probes(position: int) -> None:
    outbox = Outbox(seqs=list(range(101, 1101)), bad={100 + position})
    assert narrowed(outbox, start=100) == Step(StepKind.QUARANTINE, seq=100 + position)
    # halving, the seqs, the row alone, and alone again once the rows before it fetched
    assert len(outbox.probes) <= math.ceil(math.log2(1000)) + 3


def test_the_first_row_is_quarantined_once_a_row_after_it_fetches() -> None:
    outbox = Outbox(seqs=list(range(1, 101)), bad={1, 2, 3})
    assert narrowed(outbox, limit=100) == Step(StepKind.QUARANTINE, seq=1)
    alone = [p for p in outbox.probes if p.kind is StepKind.ALONE]
    # itself, the rows after it one by one until one fetched (4), itself again
    assert [p.start for p in alone] == [0, 1, 2, 3, 0]


def test_rows_that_all_fail_are_load_and_nothing_is_quarantined() -> None:
    outbox = Outbox(seqs=list(range(1, 1001)), load=True)
    assert narrowed(outbox).kind is StepKind.GIVE_UP
    assert len(outbox.probes) <= math.ceil(math.log2(1000)) + 3 + AFTER_ROWS


def test_more_failing_rows_in_a_row_than_it_looks_past_are_not_quarantined() -> None:
    outbox = Outbox(seqs=list(range(1, 101)), bad=set(range(1, AFTER_ROWS + 2)))
    assert narrowed(outbox, limit=100).kind is StepKind.GIVE_UP


def test_a_row_that_fetches_alone_is_not_quarantined() -> None:
    """The fetch failed only with its neighbours (a timeout under load that passed)."""
    narrowing = Narrowing(0, 4)
    narrowing.fetched(False)  # prefix of 2
    narrowing.fetched(False)  # prefix of 1
    assert narrowing.step() == Step(StepKind.LIST, 0, 1 + AFTER_ROWS)
    narrowing.listed([5, 6, 7])
    assert narrowing.step() == Step(StepKind.ALONE, 0, 1)
    narrowing.fetched(True)
    assert narrowing.step().kind is StepKind.GIVE_UP


def test_rows_that_moved_on_while_it_narrowed_name_nothing() -> None:
    narrowing = Narrowing(0, 4)
    narrowing.fetched(True)  # prefix of 2
    narrowing.fetched(False)  # prefix of 3
    narrowing.listed([5, 6])  # one of them was published meanwhile
    assert narrowing.step().kind is StepKind.GIVE_UP


def test_a_fetch_of_one_row_is_narrowed_to_that_row() -> None:
    outbox = Outbox(seqs=[7, 8], bad={7})
    assert narrowed(outbox, limit=1) == Step(StepKind.QUARANTINE, seq=7)


def test_a_row_that_fetches_alone_once_the_load_is_gone_is_not_quarantined() -> None:
    """The server was overloaded while the prefixes and the row failed, and recovered when
    the rows around it were fetched: the row is fetched alone once more, and fetches."""
    narrowing = Narrowing(0, 4)
    narrowing.fetched(False)  # prefix of 2
    narrowing.fetched(False)  # prefix of 1
    narrowing.listed([5, 6, 7])
    narrowing.fetched(False)  # 5 alone, under load
    assert narrowing.step() == Step(StepKind.ALONE, 5, 1)  # the row after it
    narrowing.fetched(True)  # the load is gone
    assert narrowing.step() == Step(StepKind.ALONE, 0, 1)  # 5 alone, again
    narrowing.fetched(True)
    assert narrowing.step().kind is StepKind.GIVE_UP
