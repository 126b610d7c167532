"""The fetch loop's passes: where the next fetch starts, and which fetched rows it may send.

A *full pass* reads the outbox from the beginning; its fetches follow each other while
they come back full. Once one does not, the fetches after it are *cursor fetches*: they
start from the cursor (or below the lowest seq notified since), until the next full pass,
at the latest a poll interval after this one began. Every decision about that — when a
pass must start from the beginning, what a cursor fetch can vouch for, where a pass's
later fetches stop, which fetched rows may be sent — is made here, over values the fetch
loop passes in (the clock, the fetched rows, what notifications said). Nothing here
waits or does I/O; relay/engine.py runs the statements and the task groups.

docs/relay.md, "Fetching: passes and the key hold", says why each rule keeps a key's
order; relay/inflight.py keeps the rows in flight and the keys held, which these rules
read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from relay.inflight import InFlightWindow
from relay.records import OutboxRow


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """One fetch to run."""

    lanes: frozenset[int]
    start: int
    """The seq it reads after."""
    cursor_fetch: bool
    """Between full passes: it sends only what it can vouch for (:meth:`Passes.accept`)."""
    opens_pass: bool
    """A full pass's first fetch: the pass's bound is read before its statement."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one fetch read."""

    plan: FetchPlan
    rows: list[OutboxRow]
    """In seq order, minus the rows that were in flight when its statement started."""
    full: bool
    """The statement's limit was reached: more rows may follow at once."""
    last_seq: int | None
    """The last seq it read, rows left out included: where the cursor may move."""
    mark: int
    """The in-flight window's mark taken when it started (InFlightWindow.held_since)."""
    bound: int | None = None
    """For a pass's first fetch, the highest seq drawn before it (None: not known)."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The rows of a fetch that the pass lets through, and what comes next."""

    rows: list[OutboxRow]
    full: bool
    """The next fetch follows at once; otherwise the loop waits for news."""
    cut: bool
    """The pass ended at its bound: the next one starts from the beginning at once."""


def within_bound(rows: list[OutboxRow], bound: int | None) -> tuple[list[OutboxRow], bool]:
    """The rows of a full pass's later fetch up to the pass's bound, and whether any were cut.

    A row the pass's first fetch stepped over because its transaction had not committed
    commits after the bound was read; its key's next row takes its seq only after that,
    so above the bound. Rows up to the bound can follow no such row; a row above it might,
    so the pass ends before it (docs/relay.md, "Passes and late commits").
    """
    if bound is None or not rows or rows[-1].seq <= bound:
        return rows, False
    return [r for r in rows if r.seq <= bound], True  # in seq order: a prefix


def vouched(
    rows: list[OutboxRow], full: bool, last_seq: int | None, heard_up_to: int
) -> tuple[list[OutboxRow], bool, int | None]:
    """The rows of a cursor fetch it can vouch for: those up to the highest seq heard of.

    Notifications arrive in commit order, so once a row's own is heard, so is that of
    every transaction that committed before its transaction took its seq, among them any
    earlier row of its key that this fetch's start could have passed over. Rows after the
    first unheard one wait for their notification (or the next full pass); the cursor
    stays before them.
    """
    if not rows or rows[-1].seq <= heard_up_to:
        return rows, full, last_seq
    kept = [r for r in rows if r.seq <= heard_up_to]  # in seq order: a prefix
    return kept, False, rows[len(kept)].seq - 1


def announced_below(fetched: Fetched, lowest_notified: int | None) -> bool:
    """True when rows at or below a cursor fetch's start were notified while it ran: its
    snapshot may hold a later row of their key, which it must not send first."""
    return (
        bool(fetched.rows) and lowest_notified is not None and lowest_notified <= fetched.plan.start
    )


class Passes:
    """The fetch loop's position in the outbox and what its current pass has seen.

    The loop calls, in order: :meth:`start` (before each fetch it plans), :meth:`plan`,
    :meth:`leave_out` and :meth:`fetched` around the statement, :meth:`accept`,
    :meth:`sendable`, and :meth:`ended` when a fetch was not full. The acknowledging side
    never touches this object: a failure it records asks for full passes through the
    wake-up (relay/wakeups.py), which the loop hands to :meth:`start`.
    """

    def __init__(self, window: InFlightWindow, *, poll_interval_ms: int, batch_size: int) -> None:
        self._window = window
        self._poll_s = poll_interval_ms / 1000
        self._batch_size = batch_size
        self.cursor = 0
        """Where the next fetch reads after; 0: the next fetch opens a full pass."""
        self.in_full_pass = False
        """The current fetches follow each other from the beginning (not cursor fetches)."""
        self._started_at = 0.0
        # The window's mark taken when the pass began: keys released since may have rows
        # the pass stepped over (relay/inflight.py).
        self._mark: int | None = None
        # The highest seq drawn before the pass's first fetch: its later fetches send
        # nothing above it (within_bound). None: not known, nothing is cut.
        self._bound: int | None = None
        self._fetched_lanes: frozenset[int] = frozenset()  # the lanes the last fetch read
        # A fetch left rows out that the next pass must read again (held keys, lanes lost).
        self._stepped_over = False
        # Until then every pass starts from the beginning: a failure recorded lately waits
        # behind the cursor for its retry.
        self._full_until = 0.0
        self._read_up_to = 0  # the highest seq any fetch has read
        # A bound read while the loop waited, for the next full pass to take instead of
        # reading its own on the way to its first fetch.
        self._spare_bound: int | None = None
        self._bound_refreshing = False

    # -- before a fetch -------------------------------------------------------------------
    def full_pass_due(self, now: float, *, requested: bool) -> bool:
        """True when the next fetch must start from the beginning of the outbox: asked
        for (a poll, a notification without seqs, new lanes), a poll interval after the
        last full pass began, or while rows may wait behind the cursor that no
        notification will announce (held keys, retries, rows this relay left out)."""
        return (
            requested
            or now - self._started_at >= self._poll_s
            or self._stepped_over
            or now < self._full_until
            or self._mark is None
            or self._window.irregular_since(self._mark)
        )

    def start(self, now: float, *, full_pass_requested: bool, full_passes_until: float) -> None:
        """Before a fetch is planned: go back to the beginning if a full pass is due, and
        open a pass there. ``full_passes_until`` comes from recorded failures (their rows
        wait behind the cursor until they are due, and a poll interval more)."""
        self._full_until = max(self._full_until, full_passes_until)
        if self.cursor and self.full_pass_due(now, requested=full_pass_requested):
            # Under a continuous backlog a pass also ends after a poll interval; rows still
            # in flight are left out of its fetches (leave_out).
            self.cursor = 0
        if self.cursor == 0:
            self.in_full_pass = True
            self._stepped_over = False
            self._started_at = now
            if self._mark is not None:
                self._window.fetch_done(self._mark)
            self._mark = self._window.fetch_mark()

    def lanes_gained(self, lanes: Iterable[int]) -> bool:
        """True when lanes were gained (or are back) since the last fetch: the cursor has
        moved past their rows, so only a full pass finds them."""
        return bool(self.cursor) and not self._fetched_lanes.issuperset(lanes)

    def plan(self, lanes: Iterable[int], start: int) -> FetchPlan:
        """The next fetch, from ``start`` (the cursor, or below a seq notified since)."""
        return FetchPlan(
            frozenset(lanes),
            start,
            cursor_fetch=not self.in_full_pass,
            opens_pass=self.cursor == 0,
        )

    def leave_out(self, plan: FetchPlan) -> frozenset[int]:
        """The rows in flight that the fetch may meet again, to leave out of its rows;
        taken before its statement starts.

        A fetch that starts while batches are in flight meets their rows again. A row
        whose outcome is recorded while the statement runs may still be read, and must
        not be sent a second time. Every row in flight was read by some fetch, so none
        lies above the highest seq read so far: a fetch from there on (every fetch of an
        ordinary pass) needs no set.
        """
        if plan.start < self._read_up_to and not self._window.empty():
            return self._window.seqs()
        return frozenset()

    def fetched(
        self,
        plan: FetchPlan,
        rows: list[OutboxRow],
        *,
        mark: int,
        left_out: frozenset[int],
        bound: int | None = None,
    ) -> Fetched:
        """What the statement of ``plan`` returned (at most the batch size, in seq order)."""
        if rows:
            self._read_up_to = max(self._read_up_to, rows[-1].seq)
        return Fetched(
            plan,
            [r for r in rows if r.seq not in left_out] if left_out else rows,
            full=len(rows) == self._batch_size,
            last_seq=rows[-1].seq if rows else None,
            mark=mark,
            bound=bound,
        )

    # -- after a fetch --------------------------------------------------------------------
    def accept(
        self, fetched: Fetched, *, heard_up_to: int, lowest_notified: int | None
    ) -> Accepted | None:
        """The rows the pass lets through, and the cursor moved past what was read; None
        when the fetch must be read again from below (nothing of it is sent)."""
        rows, full, last_seq = fetched.rows, fetched.full, fetched.last_seq
        cut = False
        if fetched.plan.cursor_fetch:
            if announced_below(fetched, lowest_notified):
                return None
            rows, full, last_seq = vouched(rows, full, last_seq, heard_up_to)
        elif fetched.plan.opens_pass:
            self._bound = fetched.bound
        else:
            rows, cut = within_bound(rows, self._bound)
            full = full or cut
        self._fetched_lanes = fetched.plan.lanes
        if last_seq is not None:
            # A fetch that was not full read every visible row after its start: a cursor
            # that went back for a late commit returns to where it was.
            self.cursor = last_seq if full else max(self.cursor, last_seq)
        return Accepted(rows, full, cut)

    def may_prefetch(
        self,
        now: float,
        accepted: Accepted,
        lanes: Sequence[int],
        *,
        producer_broken: bool,
        slot_free: bool,
    ) -> bool:
        """True when the next fetch may be read while this one's rows are sent. A pass
        older than a poll interval reads no further ahead: it ends here, so the next one
        starts from the beginning."""
        return (
            accepted.full
            and not accepted.cut
            and bool(lanes)
            and self._fetched_lanes.issuperset(lanes)
            and not producer_broken
            and slot_free
            and now - self._started_at < self._poll_s
        )

    def prefetch_plan(self, lanes: Iterable[int]) -> FetchPlan:
        """The prefetch: from the cursor, never below it. This fetch's rows join the window
        only after the prefetch's statement began (leave_out); a late commit notified
        meanwhile is read by the next fetch that is not a prefetch."""
        return FetchPlan(
            frozenset(lanes), self.cursor, cursor_fetch=not self.in_full_pass, opens_pass=False
        )

    def sendable(self, rows: list[OutboxRow], lanes: Iterable[int], mark: int) -> list[OutboxRow]:
        """The accepted rows of lanes still held whose keys are not held back.

        Lanes may have been handed back since the fetch, and keys held back by a failure
        not recorded yet (or recorded after the fetch began) are skipped; so is a key
        released since the pass began, which may have rows the pass stepped over. The next
        pass finds every row left out here.
        """
        publishable = set(lanes)
        since = mark if self._mark is None else min(mark, self._mark)
        # While nothing is held, no row needs the per-key test (the hot path).
        held_since = None if self._window.holds_nothing() else self._window.held_since
        kept = [
            row
            for row in rows
            if row.lane in publishable and not (held_since and held_since(row.aggregateid, since))
        ]
        if len(kept) < len(rows):
            self._stepped_over = True
        return kept

    def ended(self) -> None:
        """A fetch was not full: the next one comes on news, as a cursor fetch."""
        self.in_full_pass = False

    # -- the next pass's bound ------------------------------------------------------------
    def bound_refresh_due(self, now: float) -> bool:
        """True when the next pass is due soon and no bound is read or being read for it:
        the caller reads one while it waits (and hands it to :meth:`bound_read`)."""
        if (
            now - self._started_at < self._poll_s / 2
            or self._spare_bound is not None
            or self._bound_refreshing
        ):
            return False
        self._bound_refreshing = True
        return True

    def bound_read(self, bound: int | None) -> None:
        """A bound read ahead (None: the read failed; the next pass reads its own)."""
        self._spare_bound = bound
        self._bound_refreshing = False

    def take_spare_bound(self) -> int | None:
        """The bound read ahead, if any, for the pass opening now. A bound read earlier is
        as sound (read before this statement starts), only lower."""
        bound, self._spare_bound = self._spare_bound, None
        return bound

    def close(self) -> None:
        """The loop ends: the pass's mark is let go."""
        if self._mark is not None:
            self._window.fetch_done(self._mark)
            self._mark = None
