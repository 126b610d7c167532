"""The in-flight window: batches fetched and not yet recorded, and what they hold.

A batch takes a slot before its rows are fetched and gives it back once its outcome is
recorded, so at most ``capacity`` batches are in flight: that is the most a crash can
publish twice. While a batch is in flight its rows' lanes stay with this instance, and
the keys of its failed rows are held back on their topics until the failure is recorded
(until then the database does not hold them back yet): what a row holds is its
:data:`relay.records.Hold`, the same unit the database's hold has. Every change to that
state goes through here.

A fetch statement whose snapshot predates a failure's record still sees the key free, so
a key released while a fetch was open stays held back from that fetch's rows: each fetch
takes a mark when it starts (:meth:`fetch_mark`), its rows are filtered with
:meth:`held_since` and it ends with :meth:`fetch_done`.

A pass takes a mark the same way, for the same reason one step wider: the database also
holds a key back behind its row that waits to be retried (``OutboxRow.holds_key``), and a
pass's cursor moves past the rows it held back. Once that row is published, the pass's
later fetches would read the key's rows after its cursor first; a key released since the
pass began therefore waits for the next pass, which reads from the beginning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Set

import anyio

from relay.records import Hold, OutboxRow


class InFlightWindow:
    """Slots, seq → lane of rows in flight, held keys, and a wait for the window to empty."""

    def __init__(self, capacity: int, *, hold_of: Callable[[OutboxRow], Hold | None]) -> None:
        self._slots = anyio.Semaphore(capacity)
        self._hold_of = hold_of
        self._lanes: dict[int, int] = {}  # seq -> lane
        self._held_keys: Counter[Hold] = Counter()
        self._emptied = anyio.Event()
        self._releases = 0  # holds released so far: the marks fetches take
        self._released_at: dict[Hold, int] = {}  # hold -> mark of its last release
        self._open_fetches: Counter[int] = Counter()  # mark -> fetches started there, not done
        # hold -> rows in flight that were fetched waiting to be retried (OutboxRow.holds_key)
        self._holders: Counter[Hold] = Counter()

    # -- slots ----------------------------------------------------------------------------
    async def take_slot(self) -> None:
        """Wait for room for one more batch."""
        await self._slots.acquire()

    def slot_free(self) -> bool:
        """True when a batch could take a slot without waiting."""
        return self._slots.value > 0

    def give_back_slot(self) -> None:
        """Return a slot whose batch never went in flight (nothing fetched or sent)."""
        self._slots.release()

    # -- rows ------------------------------------------------------------------------------
    def admit(self, rows: Iterable[OutboxRow]) -> None:
        """The rows of a sent batch are in flight until :meth:`release`."""
        for row in rows:
            self._lanes[row.seq] = row.lane
            if row.holds_key and (hold := self._hold_of(row)) is not None:
                self._holders[hold] += 1

    def hold(self, failed: Iterable[OutboxRow]) -> None:
        """Hold back what these failed rows hold (once per row) until they are released."""
        self._held_keys.update(hold for hold in map(self._hold_of, failed) if hold is not None)

    def release(self, rows: Iterable[OutboxRow], failed: Iterable[OutboxRow]) -> None:
        """A batch's outcome is recorded: its slot, its rows and its failed rows' holds go."""
        self._slots.release()
        for row in rows:
            self._lanes.pop(row.seq, None)
        if not self._lanes:
            self._emptied.set()
        for hold in map(self._hold_of, failed):
            if hold is None:
                continue
            self._held_keys[hold] -= 1
            if self._held_keys[hold] <= 0:
                del self._held_keys[hold]
                self._released(hold)
        # A row the database held its key behind is recorded: the database's hold lifts.
        for row in rows:
            if row.holds_key and (hold := self._hold_of(row)) is not None:
                self._holders[hold] -= 1
                if self._holders[hold] <= 0:
                    del self._holders[hold]
                    self._released(hold)

    def _released(self, hold: Hold) -> None:
        if self._open_fetches:  # only an open fetch or pass can have read the key as free
            self._releases += 1
            self._released_at[hold] = self._releases

    # -- fetches -----------------------------------------------------------------------------
    def fetch_mark(self) -> int:
        """A fetch starts now: keys released from here on stay held back from its rows."""
        self._open_fetches[self._releases] += 1
        return self._releases

    def holds_nothing(self) -> bool:
        """True when no key is held or was released while a fetch was open: then
        :meth:`held_since` is False for every key, and the hot path skips it."""
        return not self._held_keys and not self._released_at

    def held_since(self, row: OutboxRow, mark: int) -> bool:
        """True while the row's key is held on its topic, or when it was released after the
        fetch that took ``mark`` started: that fetch's snapshot may predate the failure's
        record."""
        hold = self._hold_of(row)
        return hold is not None and (
            hold in self._held_keys or self._released_at.get(hold, mark) > mark
        )

    def fetch_done(self, mark: int) -> None:
        """The rows of the fetch that took ``mark`` are filtered (or it failed)."""
        self._open_fetches[mark] -= 1
        if self._open_fetches[mark] <= 0:
            del self._open_fetches[mark]
        # Releases no open fetch started before are of no use any more.
        oldest = min(self._open_fetches, default=self._releases)
        self._released_at = {key: at for key, at in self._released_at.items() if at > oldest}

    # -- what the pipeline asks ------------------------------------------------------------
    def irregular_since(self, mark: int) -> bool:
        """True while keys are held or rows in flight hold their key back in the database,
        or when a key was released since the pass that took ``mark`` began: rows of those
        keys may wait behind that pass's cursor, and only a pass from the beginning finds
        them (no notification announces them)."""
        return bool(self._held_keys or self._holders) or self._releases > mark

    def empty(self) -> bool:
        """True when no row is in flight."""
        return not self._lanes

    def holds_seq(self, seq: int) -> bool:
        """True while the row ``seq`` is in flight."""
        return seq in self._lanes

    def seqs(self) -> frozenset[int]:
        """The rows in flight now: a fetch that may meet them leaves these out."""
        return frozenset(self._lanes)

    def lanes(self) -> set[int]:
        """The lanes with a row in flight: they must not be handed back yet."""
        return set(self._lanes.values())

    def held(self) -> Set[Hold]:
        """What is held now (a live view, empty while all is well)."""
        return self._held_keys.keys()

    def is_held(self, row: OutboxRow) -> bool:
        """True while a failure of the row's key on its topic is in flight and not yet
        recorded."""
        hold = self._hold_of(row)
        return hold is not None and hold in self._held_keys

    async def wait_empty(self) -> None:
        """Return once no row is in flight."""
        while self._lanes:
            if self._emptied.is_set():
                self._emptied = anyio.Event()  # an anyio event is never cleared: replace it
            await self._emptied.wait()
