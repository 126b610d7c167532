"""The fetch loop's passes: where the next fetch starts, and which fetched rows it may send.

A *full pass* reads the outbox from the beginning; its fetches follow each other while they
reach their row limit or byte budget. Once one does not, the fetches after it are *cursor
fetches*: they start from the cursor (or below the lowest seq notified since), until the
next full pass, at the latest a poll interval after this one began. Every decision about
that — when a pass must start from the beginning, where a fetch starts and how many rows it
asks for, which rows of a cursor fetch must wait for a late commit, where a pass's later
fetches stop, which fetched rows may be sent — is made here, over values the fetch loop
passes in (the clock, the fetched rows, what notifications hinted), and comes back as a
value: a :data:`Decision` before each fetch, a :class:`FetchPlan` of one :class:`FetchKind`,
the :class:`Accepted` rows after it, a prefetch plan or none. Nothing here waits or does
I/O, and nothing needs an event loop; relay/engine.py dispatches on the values, runs the
statements and the task groups.

docs/relay.md, "Fetching: passes and the key hold", says why each rule keeps a key's
order; relay/inflight.py keeps the rows in flight and the keys held, which these rules
read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum, auto

from relay.inflight import FetchMark, InFlightWindow
from relay.records import OutboxRow, fetched_bytes


class FetchKind(Enum):
    """Where a fetch stands in its pass, which decides what its rows must not overtake."""

    OPENS_PASS = auto()
    """A full pass's first fetch, from the beginning: the pass's bound is read before its
    statement."""
    IN_PASS = auto()
    """A full pass's later fetch: it sends nothing above the pass's bound."""
    CURSOR = auto()
    """Between full passes: each row comes with its key's earliest pending row at or below
    the start, which it must not overtake (:meth:`Passes.accept`)."""


@dataclass(frozen=True, slots=True)
class FetchPlan:
    """One fetch to run."""

    lanes: frozenset[int]
    start: int
    """The seq it reads after."""
    limit: int
    """At most this many rows (its bytes are bounded by the store)."""
    kind: FetchKind

    @property
    def check_below(self) -> int:
        """The seq at or below which the statement looks for a row's earlier pending rows:
        the start of a cursor fetch; 0 (none) for a pass's fetches, which its bound keeps."""
        return self.start if self.kind is FetchKind.CURSOR else 0


@dataclass(frozen=True, slots=True)
class News:
    """What was asked of the fetch loop since it last looked (relay/wakeups.py)."""

    full_pass_requested: bool = False
    """The relay asked for a pass from the beginning (new lanes, a reconnected listener)."""
    full_pass_hinted: bool = False
    """A notification without seqs came (a redrive's wake-up, or anyone's)."""
    full_passes_until: float = 0.0
    """Recorded failures wait behind the cursor until then (0.0: none asked)."""
    lowest_notified: int | None = None
    """The lowest seq notified."""
    notified: tuple[tuple[int, int], ...] | None = ()
    """Each notification's lowest and highest seq, in the order they came; None when more
    came than the wake-up lists (NOTIFIED_LISTED)."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to fetch now: wait this long."""

    seconds: float
    for_news: bool
    """A wake-up ends the wait early (no lane to fetch from); otherwise only a stop does
    (the quiet after a fetch that read nothing)."""


@dataclass(frozen=True, slots=True)
class ReplaceProducer:
    """The producer's sequences no longer match the broker's: replace it once nothing is in
    flight, before anything is sent again."""


@dataclass(frozen=True, slots=True)
class ResolveHolds:
    """Record where these lanes' held rows hold their keys under this relay's template
    before their rows are fetched."""

    lanes: frozenset[int]


@dataclass(frozen=True, slots=True)
class Fetch:
    """Fetch from these lanes: take a slot, then :meth:`Passes.plan` the statement."""

    lanes: frozenset[int]


Decision = Wait | ReplaceProducer | ResolveHolds | Fetch
"""What the fetch loop does next (:meth:`Passes.next`)."""


@dataclass(frozen=True, slots=True)
class Fetched:
    """What one fetch read."""

    plan: FetchPlan
    rows: list[OutboxRow]
    """In seq order, minus the rows that were in flight when its statement started."""
    limit_reached: bool
    """The statement's row limit or byte budget was reached: more rows may follow at once."""
    last_seq: int | None
    """The last seq it read, rows left out included: where the cursor may move."""
    mark: FetchMark
    """The in-flight window's mark opened when it started (InFlightWindow.held_since);
    closed once its rows are filtered (:meth:`Passes.sendable`)."""
    left_out: frozenset[int] = frozenset()
    """The rows in flight when its statement started."""
    bound: int | None = None
    """For a pass's first fetch, the highest seq drawn before it (None: not known)."""
    transferred_bytes: int = 0
    """The bytes of rows it transferred (:func:`relay.records.fetched_bytes`)."""
    started_at: float = 0.0
    """When its statement was sent (the loop's clock)."""


@dataclass(frozen=True, slots=True)
class Accepted:
    """The rows of a fetch that the pass lets through, and what comes next."""

    rows: list[OutboxRow]
    more_now: bool
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


QUIET_MS = 10
"""After a fetch that read nothing, the next one starts no sooner than this after it began.
Any role that can connect may notify, as fast as it likes, announcing nothing: then the
relay fetches at most once per QUIET_MS. A notification with rows behind it comes after a
fetch that found rows (or long after one that found none), and waits for nothing, as long
as no fetch reads nothing for a notification that asked for nothing
(:meth:`Passes.asks_for_fetch`)."""

READ_REMEMBERED = 8_192
"""How many of the seqs the last fetches read are remembered, to tell a notification that
asks for nothing (every row it names was read already) from one that asks for a fetch."""


class _ReadSeqs:
    """The seqs the last :data:`READ_REMEMBERED` rows fetched had (each row once)."""

    __slots__ = ("_order", "_seqs")

    def __init__(self) -> None:
        self._seqs: set[int] = set()
        self._order: deque[int] = deque()

    def note(self, rows: Iterable[OutboxRow]) -> None:
        seqs, order = self._seqs, self._order
        for row in rows:
            seq = row.seq
            if seq in seqs:
                continue
            if len(order) == READ_REMEMBERED:
                seqs.discard(order.popleft())
            order.append(seq)
            seqs.add(seq)

    def cover(self, lowest: int, highest: int) -> bool:
        """True when a fetch read a row at every seq from ``lowest`` to ``highest``."""
        seqs = self._seqs
        return highest - lowest < READ_REMEMBERED and all(
            seq in seqs for seq in range(lowest, highest + 1)
        )


# A notification's payload is a hint: any role that can connect may send one. Hints may
# move a fetch's start more than a batch below the cursor, or bring a pass from the
# beginning, at most this many times each per poll interval; past that they only wake the
# loop.
HINTS_PER_POLL = 2


def fetch_start(cursor: int, lowest_notified: int | None) -> int:
    """Where a fetch after ``cursor`` starts: before the lowest seq notified since the last
    fetch began, so a transaction that committed after the cursor moved past its rows (seq
    is taken at INSERT, not at COMMIT) is read at once."""
    if lowest_notified is None:
        return cursor
    return max(0, min(cursor, lowest_notified - 1))


class _HintBudget:
    """How many hints of one kind were taken in the current poll interval."""

    __slots__ = ("_interval_s", "_since", "_taken")

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._since = float("-inf")
        self._taken = 0

    def take(self, now: float) -> bool:
        if now - self._since >= self._interval_s:
            self._since, self._taken = now, 0
        if self._taken >= HINTS_PER_POLL:
            return False
        self._taken += 1
        return True


class Passes:
    """The fetch loop's position in the outbox and what its current pass has seen.

    The loop asks :meth:`next` what to do before each fetch it does not have in hand (with
    the news since it last looked); on :class:`Fetch` it takes a slot and asks for the
    :meth:`plan`. Around the statement :meth:`open_fetch` and :meth:`fetched`; then
    :meth:`accept`, :meth:`prefetch` and :meth:`sendable`. When the rows accepted do not ask
    for more at once, the loop waits for news, or a poll interval (:meth:`polled`). The
    acknowledging side never touches this object: a failure it records asks for full
    passes through the wake-up (relay/wakeups.py), whose news the loop hands in.

    What a fetch may send never depends on a notification: a pass's later fetches stop at
    the bound read before its first one, and a cursor fetch leaves out a row whose key has
    an earlier pending row it did not read (a late commit), as the statement reports it.
    Notifications only say when to fetch and where to start looking.
    """

    def __init__(
        self,
        window: InFlightWindow,
        *,
        poll_interval_ms: int,
        batch_size: int,
        fetch_max_bytes: int,
    ) -> None:
        self._window = window
        self._poll_s = poll_interval_ms / 1000
        self._batch_size = batch_size
        self._fetch_max_bytes = fetch_max_bytes
        self.cursor = 0
        """Where the next fetch reads after; 0: the next fetch opens a full pass."""
        self.in_full_pass = False
        """The current fetches follow each other from the beginning (not cursor fetches)."""
        self._started_at = 0.0
        # The window's mark opened when the pass began: keys released since may have rows
        # the pass stepped over (relay/inflight.py).
        self._mark: FetchMark | None = None
        # The highest seq drawn before the pass's first fetch: its later fetches send
        # nothing above it (within_bound). None: not known, nothing is cut.
        self._bound: int | None = None
        self._fetched_lanes: frozenset[int] = frozenset()  # the lanes the last fetch read
        # A fetch left rows out that the next pass must read again (held keys, lanes lost).
        self._stepped_over = False
        # A full pass was asked for (news, a cut, gained lanes, a poll) and has not started.
        self._full_pass_asked = False
        # A notification without seqs came and no full pass has started since.
        self._full_pass_hinted = False
        # Until then every pass starts from the beginning: a failure recorded lately waits
        # behind the cursor for its retry.
        self._full_until = 0.0
        self._lowest_notified: int | None = None  # since the last fetch was planned
        self._read_up_to = 0  # the highest seq any fetch has read
        # Below a late commit a cursor fetch found (one seq before it): where the next fetch
        # starts at the latest.
        self._back_to: int | None = None
        self._restart_hints = _HintBudget(self._poll_s)
        self._start_hints = _HintBudget(self._poll_s)
        # A bound read while the loop waited, for the next full pass to take instead of
        # reading its own on the way to its first fetch.
        self._spare_bound: int | None = None
        self._bound_refreshing = False
        # Rows whose outcome the database refused to record: never sent again by this
        # process (a failed one's key stays held in the window).
        self._never_send: set[int] = set()
        self._quiet_until = 0.0  # (quiet_left)
        self._read = _ReadSeqs()  # (asks_for_fetch)

    # -- before a fetch -------------------------------------------------------------------
    def next(
        self,
        now: float,
        lanes: Sequence[int],
        news: News,
        *,
        producer_broken: bool,
        holds_resolved: bool,
    ) -> Decision:
        """What the loop does next: wait, replace the producer, resolve holds, or fetch
        from ``lanes`` (the lanes it may publish now). Opens a full pass first when one is
        due (:meth:`full_pass_due`)."""
        self._heard(news)
        if (quiet := self.quiet_left(now)) > 0:
            return Wait(quiet, for_news=False)
        # Lanes gained (or back) since the last fetch: the cursor has moved past their
        # rows, so only a full pass finds them.
        gained = bool(self.cursor) and not self._fetched_lanes.issuperset(lanes)
        self._start(now, gained=gained)
        if producer_broken:
            return ReplaceProducer()
        if not lanes:
            return Wait(self._poll_s, for_news=True)
        if not holds_resolved:
            return ResolveHolds(frozenset(lanes))
        return Fetch(frozenset(lanes))

    def full_pass_due(self, now: float, *, requested: bool) -> bool:
        """True when the next fetch must start from the beginning of the outbox: asked
        for (a poll, new lanes, a reconnected listener), a poll interval after the last
        full pass began, or while rows may wait behind the cursor that no notification
        will announce (held keys, retries, rows this relay left out)."""
        return (
            requested
            or now - self._started_at >= self._poll_s
            or self._stepped_over
            or now < self._full_until
            or self._mark is None
            or self._window.may_hide_rows_behind(self._mark)
        )

    def _heard(self, news: News) -> None:
        self._full_pass_asked = self._full_pass_asked or news.full_pass_requested
        self._full_pass_hinted = self._full_pass_hinted or news.full_pass_hinted
        self._full_until = max(self._full_until, news.full_passes_until)
        if news.lowest_notified is not None:
            lowest = self._lowest_notified
            self._lowest_notified = (
                news.lowest_notified if lowest is None else min(lowest, news.lowest_notified)
            )

    def _start(self, now: float, *, gained: bool) -> None:
        """Go back to the beginning if a full pass is due, and open a pass there. A hint of
        a full pass (a notification without seqs) is honoured within the hint budget."""
        if self.cursor and (
            self.full_pass_due(now, requested=self._full_pass_asked or gained)
            or (self._full_pass_hinted and self._restart_hints.take(now))
        ):
            # Under a continuous backlog a pass also ends after a poll interval; rows still
            # in flight are left out of its fetches (skipped_in_flight).
            self.cursor = 0
        if self.cursor == 0:
            self.in_full_pass = True
            self._stepped_over = False
            self._back_to = None
            self._started_at = now
            if self._mark is not None:
                self._mark.close()
            self._mark = self._window.open_fetch()

    def plan(self, lanes: Iterable[int], now: float, news: News = News()) -> FetchPlan:
        """The next fetch, with the news since :meth:`next`: from the cursor, or below a late
        commit a cursor fetch found, or below the lowest seq notified since the last fetch
        (within the hint budget). A fetch from the beginning covers every full pass asked
        for until now."""
        self._heard(news)
        start = self.cursor
        if self._back_to is not None:
            start, self._back_to = min(start, self._back_to), None
        lowest, self._lowest_notified = self._lowest_notified, None
        if lowest is not None:
            notified = fetch_start(start, lowest)
            # Up to a batch below the start, reading again costs what a cursor fetch
            # costs, and concurrent writers commit that late all the time: always
            # honoured. Further below, within the hint budget.
            if notified < start and (
                start - notified <= self._batch_size or self._start_hints.take(now)
            ):
                start = notified
        if start == 0:
            self._full_pass_asked = self._full_pass_hinted = False
        kind = FetchKind.OPENS_PASS if self.cursor == 0 else self._following_kind()
        return FetchPlan(frozenset(lanes), start, self._batch_size, kind)

    def _following_kind(self) -> FetchKind:
        """The kind of a fetch that follows the last one from the cursor: a full pass's
        later fetch, or a cursor fetch once the pass has ended."""
        return FetchKind.IN_PASS if self.in_full_pass else FetchKind.CURSOR

    def open_fetch(self, plan: FetchPlan) -> tuple[frozenset[int], FetchMark]:
        """What a fetch takes as its statement starts: the rows in flight to leave out of
        its rows (:meth:`skipped_in_flight`), and its mark in the window (closed once its
        rows are filtered)."""
        return self.skipped_in_flight(plan), self._window.open_fetch()

    def skipped_in_flight(self, plan: FetchPlan) -> frozenset[int]:
        """The rows in flight that the fetch may meet again, to leave out of its rows;
        taken before its statement starts.

        A fetch that starts while batches are in flight meets their rows again. A row
        whose outcome is recorded while the statement runs may still be read, and must
        not be sent a second time. Every row in flight was read by some fetch, so none
        lies above the highest seq read so far: a pass's fetch from there on (every fetch
        of an ordinary pass) needs no set. A cursor fetch always takes it: a row's earlier
        pending row in flight is no late commit.
        """
        if self._window.empty():
            return frozenset()
        if plan.kind is FetchKind.CURSOR or plan.start < self._read_up_to:
            return self._window.seqs()
        return frozenset()

    def met_in_flight(self, plan: FetchPlan, left_out: frozenset[int]) -> list[int]:
        """The rows of ``left_out`` the fetch may read, in seq order: its statement brings
        them without their content (relay/sql.py, FETCH_READY's $8), so a pass that meets
        rows whose batches wait on the broker does not transfer them again. Those above its
        start (none lies above the highest seq read so far), and of them the first
        ``limit``: a fetch reads at most that many rows, so one further up is met only
        when rows below it were recorded meanwhile (it then comes whole, and is left out
        all the same)."""
        if not left_out or plan.start >= self._read_up_to:
            return []
        return sorted(seq for seq in left_out if seq > plan.start)[: plan.limit]

    def fetched(
        self,
        plan: FetchPlan,
        rows: list[OutboxRow],
        *,
        mark: FetchMark,
        left_out: frozenset[int],
        bound: int | None = None,
        started_at: float = 0.0,
        met: frozenset[int] = frozenset(),
    ) -> Fetched:
        """What the statement of ``plan`` returned: at most its limit, in seq order, and
        the rows that fit the byte budget (plus the one that crossed it); those ``met``
        (:meth:`met_in_flight`) came without their content."""
        if rows:
            self._read_up_to = max(self._read_up_to, rows[-1].seq)
            self._read.note(rows)
        if met:
            transferred = sum(fetched_bytes(r, in_flight=r.seq in met) for r in rows)
        else:
            transferred = sum(map(fetched_bytes, rows))
        cut_by_bytes = transferred >= self._fetch_max_bytes
        return Fetched(
            plan,
            [r for r in rows if r.seq not in left_out] if left_out else rows,
            limit_reached=len(rows) == plan.limit or cut_by_bytes,
            last_seq=rows[-1].seq if rows else None,
            mark=mark,
            left_out=left_out,
            bound=bound,
            transferred_bytes=transferred,
            started_at=started_at,
        )

    # -- after a fetch --------------------------------------------------------------------
    def accept(self, fetched: Fetched) -> Accepted:
        """The rows the pass lets through, and the cursor moved past what was read. A cut
        asks for the next pass at once; a fetch that asks for nothing more ends the full
        pass: the next fetch comes on news, as a cursor fetch."""
        rows, more, last_seq = fetched.rows, fetched.limit_reached, fetched.last_seq
        self._quiet_until = fetched.started_at + QUIET_MS / 1000 if last_seq is None else 0.0
        cut = False
        kind = fetched.plan.kind
        if kind is FetchKind.CURSOR:
            late = {
                row.earlier
                for row in rows
                if row.earlier is not None
                and row.earlier not in fetched.left_out
                and not self._window.holds_seq(row.earlier)
            }
            if late:
                # A late commit below the start: its key's rows here wait, and the next
                # fetch (at once) starts below it, so it goes first.
                back_to = min(late) - 1
                if self._back_to is not None:
                    back_to = min(back_to, self._back_to)
                self._back_to = back_to
                rows = [row for row in rows if row.earlier not in late]
                more = True
        elif kind is FetchKind.OPENS_PASS:
            self._bound = fetched.bound
        else:
            rows, cut = within_bound(rows, self._bound)
            more = more or cut
        if cut:
            # The next pass starts from the beginning at once: it reads any row stepped
            # over before its key's next one.
            self._full_pass_asked = True
        self._fetched_lanes = fetched.plan.lanes
        if last_seq is not None:
            # A fetch that asks for nothing more read every visible row after its start: a cursor
            # that went back for a late commit returns to where it was.
            self.cursor = last_seq if more else max(self.cursor, last_seq)
        if kind is FetchKind.OPENS_PASS and not more and fetched.bound:
            # A pass's only fetch read every row visible up to the bound: the next fetches
            # start there, as cursor fetches, instead of from the beginning again (a row
            # that commits late below it is found as any late commit is).
            self.cursor = max(self.cursor, fetched.bound)
        if not more:
            self.in_full_pass = False
        return Accepted(rows, more, cut)

    def prefetch(
        self,
        now: float,
        accepted: Accepted,
        lanes: Sequence[int],
        *,
        producer_broken: bool,
        slot_free: bool,
    ) -> FetchPlan | None:
        """The next fetch to read while this one's rows are sent, if one may: from the
        cursor, never below it, never opening a pass. A pass older than a poll interval
        reads no further ahead: it ends here, so the next one starts from the beginning.
        This fetch's rows join the window only after the prefetch's statement began
        (skipped_in_flight); a late commit notified meanwhile is read by the next fetch
        that is not a prefetch."""
        if not (
            accepted.more_now
            and not accepted.cut
            and bool(lanes)
            and self._fetched_lanes.issuperset(lanes)
            and not producer_broken
            and slot_free
            and now - self._started_at < self._poll_s
        ):
            return None
        return FetchPlan(frozenset(lanes), self.cursor, self._batch_size, self._following_kind())

    def sendable(
        self, rows: list[OutboxRow], lanes: Iterable[int], mark: FetchMark
    ) -> list[OutboxRow]:
        """The accepted rows of lanes still held whose keys are not held back.

        Lanes may have been handed back since the fetch, and keys held back by a failure
        not recorded yet (or recorded after the fetch began) are skipped; so is a key
        released since the pass began, which may have rows the pass stepped over. The next
        pass finds every row left out here.
        """
        if self._never_send:
            rows = [row for row in rows if row.seq not in self._never_send]
        publishable = set(lanes)
        # Stored before the door and not measured yet: the loop has them measured, and the
        # next pass reads them whole.
        unmeasured = any(row.size is None for row in rows)
        since = mark.at if self._mark is None else min(mark.at, self._mark.at)
        # While nothing is held, no row needs the per-key test (the hot path).
        held_since = None if self._window.holds_nothing() else self._window.held_since
        kept = [
            row
            for row in rows
            if row.lane in publishable
            and not (held_since and held_since(row, since))
            and not (unmeasured and row.size is None)
        ]
        if len(kept) < len(rows):
            self._stepped_over = True
        return kept

    def asks_for_fetch(self, news: News) -> bool:
        """Take in the news that woke the loop while it waited for news; False when it asks
        for no fetch: it holds nothing but notifications, and a fetch read a row at every
        seq each of them names.

        Under load a fetch often reads a row before the row's notification arrives (its
        statement began after the commit, the notification came after it began). A fetch
        for that notification would read nothing, and the quiet after it (QUIET_MS) would
        hold back what commits next. A notification naming a seq no fetch read (a row not
        read yet, a late commit, one of another instance's lanes, anything forged) asks for
        the fetch, as every notification did before; so does one of more than the
        remembered seqs. Whether a fetch comes now is all a notification decides.
        """
        if (
            news.notified
            and not (news.full_pass_requested or news.full_pass_hinted or news.full_passes_until)
            and all(self._read.cover(lowest, highest) for lowest, highest in news.notified)
        ):
            return False
        self._heard(news)
        return True

    def polled(self) -> None:
        """A poll interval passed without news: the next fetch opens a full pass (the safety
        net for what no notification announced)."""
        self._full_pass_asked = True

    def never_send(self, seq: int) -> None:
        """Never let the row ``seq`` through again (its outcome cannot be recorded)."""
        self._never_send.add(seq)

    @property
    def never_sent(self) -> int:
        """How many rows are never sent again by this process."""
        return len(self._never_send)

    def quiet_left(self, now: float) -> float:
        """Seconds until the next fetch may start: after one that read nothing, QUIET_MS
        after it began; otherwise none."""
        return max(0.0, self._quiet_until - now)

    # -- the next pass's bound ------------------------------------------------------------
    def take_bound_refresh(self, now: float) -> bool:
        """True when the next pass is due soon and no bound is read or being read for it:
        the caller reads one now, while it waits, and hands it to :meth:`bound_read`."""
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
            self._mark.close()
            self._mark = None
