"""Narrowing a fetch that failed to the one row that makes it fail.

The door measures every row when it is inserted, so a fetch reads stored sizes and prints
only what it sends; still, something in a row could make the statement fail (a row stored
before the door that a relay without the right to measure it must print, a damaged
value). A failure that could come from a row's content (a timeout, a limit, too little
memory, a data error) is narrowed, so that it cannot stop the relay for good:

1. the shortest prefix of the failed fetch that fails is found by halving (a prefix that
   fetches holds no such row);
2. the seqs of that prefix are read, without any of the rows' content: its last row is
   the suspect;
3. the suspect is fetched alone, and must fail again;
4. the rows around it must fetch: the prefix before it did, or one of the rows just after
   it does when fetched alone;
5. the suspect, fetched alone once more after that, must still fail (load that ended
   while it was narrowed names no row).

Only then is the row quarantined (by seq, without its content). Anything else (every probe
failing, the rows having moved on) is load, and the fetch is simply tried again later:
nothing is quarantined. :class:`Narrowing` decides, over the outcomes the fetch loop hands
it; it does no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

AFTER_ROWS = 8
"""Rows after the suspect that are fetched alone, one by one, until one fetches."""


class StepKind(enum.Enum):
    PREFIX = "prefix"  # fetch the first `limit` rows after `start`
    LIST = "list"  # read the seqs of the first `limit` rows after `start`
    ALONE = "alone"  # fetch one row: the first after `start`
    QUARANTINE = "quarantine"  # the row `seq` fails on its own
    GIVE_UP = "give_up"  # load, or rows that moved on: try the fetch again later


@dataclass(frozen=True, slots=True)
class Step:
    """What the fetch loop runs next."""

    kind: StepKind
    start: int = 0
    limit: int = 0
    seq: int = 0


@dataclass(slots=True)
class Narrowing:
    """One failed fetch (``start``, ``limit``) being narrowed: call :meth:`step`, run it,
    and hand its outcome to :meth:`fetched` or :meth:`listed`."""

    start: int
    limit: int
    fetching: int = 0
    """The longest prefix known to fetch."""
    failing: int = field(init=False)
    """The shortest prefix known to fail."""
    seqs: list[int] = field(default_factory=list)
    """The seqs of the first ``failing`` rows and up to AFTER_ROWS after them, once read."""
    failed_alone: bool = False
    after_tried: int = 0
    around_fetched: bool = False
    """The rows around the suspect fetched: it is fetched alone a last time."""
    _done: Step | None = None

    def __post_init__(self) -> None:
        self.failing = self.limit

    def step(self) -> Step:
        """The next statement to run, or the verdict."""
        if self._done is not None:
            return self._done
        if self.failing - self.fetching > 1:
            return Step(StepKind.PREFIX, self.start, (self.fetching + self.failing) // 2)
        if not self.seqs:
            return Step(StepKind.LIST, self.start, self.failing + AFTER_ROWS)
        if not self.failed_alone or self.around_fetched:
            return Step(StepKind.ALONE, self._before_suspect(), 1)
        # It failed alone, again: now the rows after it, one at a time (the n-th of them
        # is the first row after the one before it).
        return Step(StepKind.ALONE, self.seqs[self.failing - 2 + self.after_tried], 1)

    @property
    def suspect(self) -> int:
        """The seq of the row the failing prefix ends with (once the seqs are read)."""
        return self.seqs[self.failing - 1]

    def _before_suspect(self) -> int:
        return self.start if self.failing == 1 else self.seqs[self.failing - 2]

    def fetched(self, ok: bool) -> None:
        """The outcome of a PREFIX or ALONE step: fetched, or failed as a row's content
        could make it fail."""
        if self.failing - self.fetching > 1:
            middle = (self.fetching + self.failing) // 2
            if ok:
                self.fetching = middle
            else:
                self.failing = middle
        elif self.around_fetched:  # the last time alone
            kind = StepKind.GIVE_UP if ok else StepKind.QUARANTINE
            self._done = Step(kind, seq=0 if ok else self.suspect)
        elif not self.failed_alone:
            if ok:  # alone it fetches: not its content
                self._done = Step(StepKind.GIVE_UP)
            else:
                self.failed_alone = True
                if self.fetching:  # the rows before it fetched
                    self.around_fetched = True
                else:
                    self._next_after()
        elif ok:
            self.around_fetched = True
        else:
            self._next_after()

    def listed(self, seqs: list[int]) -> None:
        """The outcome of the LIST step: the seqs read."""
        if len(seqs) < self.failing:  # rows moved on meanwhile: nothing to name
            self._done = Step(StepKind.GIVE_UP)
        else:
            self.seqs = seqs

    def _next_after(self) -> None:
        self.after_tried += 1
        if self.after_tried > AFTER_ROWS or self.failing + self.after_tried > len(self.seqs):
            self._done = Step(StepKind.GIVE_UP)  # nothing around it fetches: load
