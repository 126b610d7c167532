"""Wake-ups: LISTEN on a dedicated connection, kept alive and reconnected with backoff.

A lost notification costs latency, never an event: the fetch loop also polls.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import anyio

from pgconnect import DB_ERRORS, connect, unavailable_cause
from relay import sql
from relay.liveness import Liveness
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


class WakeUp:
    """A flag the fetch loop waits on: set by notifications and news, cleared by the loop."""

    def __init__(self) -> None:
        self._event = anyio.Event()

    def set(self) -> None:
        """Wake the fetch loop (now, or as soon as it next waits)."""
        self._event.set()

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
        """Listen until cancelled; a lost connection is reconnected with backoff."""
        attempt = 0
        # One round: a poll interval of waiting, then a keepalive (5 s at most) or a
        # reconnect (10 s connect timeout plus backoff).
        round_ms = self._poll_interval_ms + 15_000
        while True:
            self._liveness.tick("listen", round_ms)
            try:
                conn = await connect(self._database_url)
            except Exception as exc:
                log.warning("listen connection failed", extra={"cause": str(exc)})
                attempt += 1
                await anyio.sleep(
                    backoff_ms(attempt, base_ms=200, cap_ms=5_000, rng=self._rng) / 1000
                )
                continue
            try:
                await conn.add_listener(sql.LISTEN_CHANNEL, self._on_notify)
                attempt = 0
                self._wake.set()  # anything committed while we were not listening
                while True:
                    await anyio.sleep(self._poll_interval_ms / 1000)
                    with anyio.fail_after(_KEEPALIVE_TIMEOUT_S):
                        await conn.execute("SELECT 1")  # keepalive: a dead socket shows here
                    self._liveness.tick("listen", round_ms)
            except DB_ERRORS as exc:
                # A closed connection (ConnectionDoesNotExistError) is a PostgresError.
                log.warning("listen connection lost", extra={"cause": unavailable_cause(exc)})
            finally:
                conn.terminate()

    def _on_notify(self, *_: object) -> None:
        self._wake.set()
