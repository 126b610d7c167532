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
opens a :class:`FetchMark` when it starts (:meth:`open_fetch`), its rows are filtered with
:meth:`held_since` against it, and closing it ends the fetch.

Both resources are handles that give themselves back: a :class:`Slot` taken for a fetch
returns when its ``with`` block ends unless a batch took it (:meth:`admit`), and a mark
closes when its ``with`` block ends. Nothing here needs an event loop until something
waits, so the fetch loop's decisions are tested without one (tests/unit/test_passes.py).

A pass takes a mark the same way, for the same reason one step wider: the database also
holds a key back behind its row that waits to be retried (``OutboxRow.holds_key``), and a
pass's cursor moves past the rows it held back. Once that row is published, the pass's
later fetches would read the key's rows after its cursor first; a key released since the
pass began therefore waits for the next pass, which reads from the beginning.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Set
from types import TracebackType

import anyio
import anyio.lowlevel

from relay.records import Hold, OutboxRow


class Slot:
    """Room for one batch, taken before its rows are fetched: given back when its ``with``
    block ends, unless a batch took it (:meth:`InFlightWindow.admit`), which gives it back
    once its outcome is recorded (:meth:`InFlightWindow.release`)."""

    __slots__ = ("_back", "_held")

    def __init__(self, back: Callable[[], None]) -> None:
        self._back = back
        self._held = True

    def give_back(self) -> None:
        """Return the slot (once; nothing if a batch took it)."""
        if self._held:
            self._held = False
            self._back()

    def taken_by_batch(self) -> None:
        """A batch holds it from now on; its release gives it back, not this handle."""
        self._held = False

    def __enter__(self) -> Slot:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.give_back()


class FetchMark:
    """An open fetch (or pass): keys released from its start on stay held back from its
    rows (:meth:`InFlightWindow.held_since`). Closed once, by :meth:`close` or at the end of
    its ``with`` block."""

    __slots__ = ("_closed", "_open", "at")

    def __init__(self, at: int, closed: Callable[[int], None]) -> None:
        self.at = at
        """The count of releases when it opened."""
        self._closed = closed
        self._open = True

    def close(self) -> None:
        if self._open:
            self._open = False
            self._closed(self.at)

    def __enter__(self) -> FetchMark:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class InFlightWindow:
    """Slots, seq → lane of rows in flight, held keys, and a wait for the window to empty."""

    def __init__(self, capacity: int, *, hold_of: Callable[[OutboxRow], Hold | None]) -> None:
        self._free_slots = capacity
        self._slot_freed: anyio.Event | None = None  # made when someone waits (needs a loop)
        self.hold_of = hold_of
        """What a row holds when it fails (:data:`relay.records.Hold`), or None."""
        self._lanes: dict[int, int] = {}  # seq -> lane
        self._held_keys: Counter[Hold] = Counter()
        self._emptied: anyio.Event | None = None  # made when someone waits
        self._releases = 0  # holds released so far: the marks fetches take
        self._released_at: dict[Hold, int] = {}  # hold -> mark of its last release
        self._open_fetches: Counter[int] = Counter()  # mark -> fetches started there, not done
        # hold -> rows in flight that were fetched waiting to be retried (OutboxRow.holds_key)
        self._holders: Counter[Hold] = Counter()

    # -- slots ----------------------------------------------------------------------------
    async def take_slot(self) -> Slot:
        """Wait for room for one more batch."""
        while not self._free_slots:
            if self._slot_freed is None or self._slot_freed.is_set():
                self._slot_freed = anyio.Event()  # an anyio event is never cleared: replace it
            await self._slot_freed.wait()
        self._free_slots -= 1
        slot = Slot(self._slot_back)
        try:
            await anyio.lowlevel.cancel_shielded_checkpoint()  # as a semaphore's acquire yields
        except BaseException:
            slot.give_back()
            raise
        return slot

    def try_take_slot(self) -> Slot | None:
        """A slot if one is free now, without waiting; None otherwise."""
        if not self._free_slots:
            return None
        self._free_slots -= 1
        return Slot(self._slot_back)

    def slot_free(self) -> bool:
        """True when a batch could take a slot without waiting."""
        return self._free_slots > 0

    def _slot_back(self) -> None:
        self._free_slots += 1
        if self._slot_freed is not None:
            self._slot_freed.set()

    def give_back_batch_slot(self) -> None:
        """A batch that took a slot will never be recorded (settling it failed): its slot
        returns; its rows stay in flight."""
        self._slot_back()

    # -- rows ------------------------------------------------------------------------------
    def admit(self, rows: Iterable[OutboxRow], slot: Slot) -> None:
        """The rows of a sent batch are in flight until :meth:`release`, which gives back
        the batch's slot."""
        slot.taken_by_batch()
        for row in rows:
            self._lanes[row.seq] = row.lane
            if row.holds_key and (hold := self.hold_of(row)) is not None:
                self._holders[hold] += 1

    def hold(self, failed: Iterable[OutboxRow]) -> None:
        """Hold back what these failed rows hold (once per row) until they are released."""
        self._held_keys.update(hold for hold in map(self.hold_of, failed) if hold is not None)

    def release(self, rows: Iterable[OutboxRow], failed: Iterable[OutboxRow]) -> None:
        """A batch's outcome is recorded: its slot, its rows and its failed rows' holds go."""
        self._slot_back()
        for row in rows:
            self._lanes.pop(row.seq, None)
        if not self._lanes and self._emptied is not None:
            self._emptied.set()
        for hold in map(self.hold_of, failed):
            if hold is None:
                continue
            self._held_keys[hold] -= 1
            if self._held_keys[hold] <= 0:
                del self._held_keys[hold]
                self._released(hold)
        # A row the database held its key behind is recorded: the database's hold lifts.
        for row in rows:
            if row.holds_key and (hold := self.hold_of(row)) is not None:
                self._holders[hold] -= 1
                if self._holders[hold] <= 0:
                    del self._holders[hold]
                    self._released(hold)

    def _released(self, hold: Hold) -> None:
        if self._open_fetches:  # only an open fetch or pass can have read the key as free
            self._releases += 1
            self._released_at[hold] = self._releases

    # -- fetches -----------------------------------------------------------------------------
    def open_fetch(self) -> FetchMark:
        """A fetch (or pass) starts now: keys released from here on stay held back from its
        rows until its mark is closed."""
        self._open_fetches[self._releases] += 1
        return FetchMark(self._releases, self._fetch_closed)

    def holds_nothing(self) -> bool:
        """True when no key is held or was released while a fetch was open: then
        :meth:`held_since` is False for every key, and the hot path skips it."""
        return not self._held_keys and not self._released_at

    def held_since(self, row: OutboxRow, since: int) -> bool:
        """True while the row's key is held on its topic, or when it was released after the
        fetch whose mark is at ``since`` started: that fetch's snapshot may predate the
        failure's record."""
        hold = self.hold_of(row)
        return hold is not None and (
            hold in self._held_keys or self._released_at.get(hold, since) > since
        )

    def _fetch_closed(self, mark: int) -> None:
        """The rows of the fetch whose mark is at ``mark`` are filtered (or it failed)."""
        self._open_fetches[mark] -= 1
        if self._open_fetches[mark] <= 0:
            del self._open_fetches[mark]
        # Releases no open fetch started before are of no use any more.
        oldest = min(self._open_fetches, default=self._releases)
        self._released_at = {key: at for key, at in self._released_at.items() if at > oldest}

    # -- what the pipeline asks ------------------------------------------------------------
    def may_hide_rows_behind(self, mark: FetchMark) -> bool:
        """True while keys are held or rows in flight hold their key back in the database,
        or when a key was released since the pass whose ``mark`` this is began: rows of
        those keys may wait behind that pass's cursor, and only a pass from the beginning
        finds them (no notification announces them)."""
        return bool(self._held_keys or self._holders) or self._releases > mark.at

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

    async def wait_empty(self) -> None:
        """Return once no row is in flight."""
        while self._lanes:
            if self._emptied is None or self._emptied.is_set():
                self._emptied = anyio.Event()  # an anyio event is never cleared: replace it
            await self._emptied.wait()
