"""Wake-ups: LISTEN on a dedicated connection, kept alive and reconnected with backoff.

A lost notification costs latency, never an event: the fetch loop also polls.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field

import anyio

from pgconnect import DB_ERRORS, connect, unavailable_cause
from relay import sql
from relay.liveness import Liveness
from relay.passes import News
from relay.retry import backoff_ms

log = logging.getLogger(__name__)

_KEEPALIVE_TIMEOUT_S = 5


@dataclass(frozen=True)
class ListenPlan:
    """Where the relay LISTENs, or why it does not (then it finds work by polling alone)."""

    listen: bool
    url: str | None = field(default=None, repr=False)  # None with listen: libpq PG* variables
    off_because: str | None = None


def listen_plan(
    *,
    notify: bool,
    database_url: str | None,
    listen_database_url: str | None,
    transaction_pooler: bool,
) -> ListenPlan:
    """Decide the LISTEN connection: the listen URL if given, else the database URL unless
    a transaction pooler sits behind it (it would hand our LISTEN to a server connection
    that other clients' transactions use, and its notifications would never reach us)."""
    if not notify:
        return ListenPlan(False, off_because="--no-notify")
    if listen_database_url:
        return ListenPlan(True, listen_database_url)
    if transaction_pooler:
        return ListenPlan(
            False,
            off_because=(
                "behind a transaction pooler LISTEN needs a direct connection to PostgreSQL "
                "(--listen-database-url)"
            ),
        )
    return ListenPlan(True, database_url)


# bigint seqs: at most 19 ASCII digits each (str.isdigit alone takes other scripts' digits).
_PAYLOAD = re.compile(r"([0-9]{1,19}),([0-9]{1,19})")


def notified_seqs(payload: str) -> tuple[int, int] | None:
    """The lowest and highest seq an inserting statement wrote, from its notification's
    payload ('<lowest>,<highest>', migration 0004); None when it says nothing usable (an
    older trigger, a redrive's wake-up, anything else): a hint of a full pass.

    Anyone who can connect may send a notification: its payload only ever tells the
    relay when to fetch and where to start looking (relay/passes.py), never what to send.
    """
    match = _PAYLOAD.fullmatch(payload)
    if match is None:
        return None
    seqs = int(match[1]), int(match[2])
    return seqs if 0 < seqs[0] <= seqs[1] else None


_NO_NEWS = News()
NOTIFIED_LISTED = 64
"""How many notifications the wake-up lists between two looks of the fetch loop; past that
it keeps only the lowest seq (relay/passes.py then fetches)."""


class WakeUp:
    """A flag the fetch loop waits on: set by notifications and news, cleared by the loop.

    It also keeps what was asked of the fetch loop since it last looked: the lowest seq
    notified (a hint of where to start) and each notification's seqs (whether they ask for
    a fetch at all), whether a notification without seqs hinted at a
    full pass, whether the relay itself asked for a full pass (from the beginning of the
    outbox), and for full passes until some time (a failure recorded by the acknowledging
    loop). relay/passes.py decides what to do with each.
    """

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._lowest: int | None = None
        # Each notification's seqs since the loop last looked; None past NOTIFIED_LISTED.
        self._notified: list[tuple[int, int]] | None = []
        self._full_pass = False
        self._full_pass_hinted = False
        self._full_passes_until = 0.0

    def set(self) -> None:
        """Wake the fetch loop (now, or as soon as it next waits)."""
        self._event.set()

    def request_full_pass(self) -> None:
        """Wake the fetch loop for a pass from the beginning: rows may lie anywhere."""
        self._full_pass = True
        self.set()

    def request_full_passes_until(self, deadline: float) -> None:
        """Ask for every pass to start from the beginning until ``deadline`` (monotonic
        seconds): rows wait behind the cursor that no notification will announce. Does not
        wake the loop; it reads this before its next fetch."""
        self._full_passes_until = max(self._full_passes_until, deadline)

    def notified(self, payload: str) -> None:
        """A notification came; a trigger's payload says which seqs its statement wrote."""
        seqs = notified_seqs(payload)
        if seqs is None:
            self._full_pass_hinted = True
        else:
            lowest = seqs[0]
            self._lowest = lowest if self._lowest is None else min(self._lowest, lowest)
            if self._notified is not None:
                if len(self._notified) < NOTIFIED_LISTED:
                    self._notified.append(seqs)
                else:
                    self._notified = None
        self.set()

    def take_news(self) -> News:
        """What was asked since the last call, and forget it: the fetch loop's passes keep
        it from here on (relay/passes.py)."""
        if not (self._full_pass or self._full_pass_hinted or self._full_passes_until) and (
            self._lowest is None
        ):
            return _NO_NEWS
        news = News(
            full_pass_requested=self._full_pass,
            full_pass_hinted=self._full_pass_hinted,
            full_passes_until=self._full_passes_until,
            lowest_notified=self._lowest,
            notified=None if self._notified is None else tuple(self._notified),
        )
        self._full_pass = self._full_pass_hinted = False
        self._full_passes_until, self._lowest, self._notified = 0.0, None, []
        return news

    def clear(self) -> None:
        """Forget earlier wake-ups: the loop is about to look for work anyway."""
        if self._event.is_set():
            self._event = anyio.Event()  # an anyio event is never cleared: replace it

    def is_set(self) -> bool:
        """True when a wake-up came since the last :meth:`clear`."""
        return self._event.is_set()

    async def wait(self) -> None:
        """Return on a wake-up (at once if one came since the last :meth:`clear`)."""
        await self._event.wait()


class NotificationListener:
    """LISTENs for the outbox trigger's notifications and turns them into wake-ups."""

    def __init__(
        self,
        database_url: str | None,
        *,
        poll_interval_ms: int,
        wake: WakeUp,
        liveness: Liveness,
        rng: random.Random,
    ) -> None:
        self._database_url = database_url
        self._poll_interval_ms = poll_interval_ms
        self._wake = wake
        self._liveness = liveness
        self._rng = rng

    async def run(self) -> None:
        """Listen until cancelled; a lost connection is reconnected with backoff.

        Each change of state is logged once, not every retry: the connection failing (and
        again only when its cause changes), lost, and listening again after either.
        """
        attempt = 0
        # One round: a poll interval of waiting, then a keepalive (5 s at most) or a
        # reconnect (10 s connect timeout plus backoff).
        round_ms = self._poll_interval_ms + 15_000
        # Why the relay is not listening now, as last logged; None while it listens (and
        # before the first attempt).
        down_because: str | None = None
        while True:
            self._liveness.tick("listen", round_ms)
            try:
                conn = await connect(self._database_url)
            except Exception as exc:
                # DatabaseUnavailable and ConfigError name no secret and no driver text.
                cause = str(exc)
                if cause != down_because:
                    log.warning("listen connection failed", extra={"cause": cause})
                    down_because = cause
                attempt += 1
                await anyio.sleep(
                    backoff_ms(attempt, base_ms=200, cap_ms=5_000, rng=self._rng) / 1000
                )
                continue
            try:
                await conn.add_listener(sql.LISTEN_CHANNEL, self._on_notify)
                attempt = 0
                if down_because is not None:
                    log.info("listen connection reachable again")
                    down_because = None
                # Anything committed while we were not listening, anywhere in the outbox.
                self._wake.request_full_pass()
                while True:
                    await anyio.sleep(self._poll_interval_ms / 1000)
                    with anyio.fail_after(_KEEPALIVE_TIMEOUT_S):
                        await conn.execute("SELECT 1")  # keepalive: a dead socket shows here
                    self._liveness.tick("listen", round_ms)
            except DB_ERRORS as exc:
                # A closed connection (ConnectionDoesNotExistError) is a PostgresError.
                cause = unavailable_cause(exc)
                if down_because is None:
                    log.warning("listen connection lost", extra={"cause": cause})
                down_because = f"lost: {cause}"
            finally:
                conn.terminate()

    def _on_notify(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._wake.notified(payload)
