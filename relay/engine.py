"""The relay service: fetch committed rows, publish them, record what Kafka acknowledged.

Loops (each a named task; one dying stops the service):
- ``lanes``: heartbeat and lane leases (relay/lanes.py);
- ``listen``: LISTEN on a dedicated connection, turning notifications into wake-ups
  (relay/wakeups.py);
- ``fetch``: read ready rows of held lanes and hand them to the producer;
- ``ack``: wait for the broker's acknowledgements in order and record them;
- ``prune`` and ``observe``: receipt pruning, backlog gauges and the oldest open writer
  transaction (relay/housekeeping.py).

This module keeps the pipeline (fetch → send → settle → record) and the task groups; the
database calls are in relay/store.py, the in-flight bookkeeping in relay/inflight.py and
the producer's life cycle in relay/producer.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import NamedTuple

import anyio
import anyio.lowlevel
import asyncpg
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from contracts.errors import DatabaseUnavailable
from contracts.unexpected import log_unexpected, raised_at
from pgconnect import DB_ERRORS, pooled, unavailable_cause
from pgconnect.schema import SchemaNeeds, ShortfallLog, read_shortfall
from relay import schema
from relay.config import RelayConfig
from relay.errors import RecordRejected, RelayError, Stopped
from relay.housekeeping import OBSERVE_EVERY_MS, Housekeeping, run_rounds
from relay.inflight import InFlightWindow, Slot
from relay.lanes import LaneKeeper
from relay.liveness import Liveness
from relay.metrics import RelayMetrics
from relay.narrowing import Narrowing, Step, StepKind
from relay.outcome import (
    Delayed,
    FailedRow,
    Outcome,
    PublishedGroup,
    ToRecord,
    halves,
    rows_in,
    sort_outcome,
)
from relay.passes import (
    Accepted,
    Decision,
    Fetch,
    Fetched,
    FetchKind,
    FetchPlan,
    Passes,
    ReplaceProducer,
    ResolveHolds,
    Wait,
)
from relay.producer import ProducerFactory, ProducerKeeper, make_producer
from relay.publisher import Submission
from relay.records import OutboxRow, RecordMapper
from relay.retry import (
    LANE_LOST,
    NOT_BROKER_FAILURES,
    UNEXPECTED,
    UNFETCHABLE,
    UNMEASURABLE,
    FailureClass,
    backoff_ms,
    classify_failure,
    perhaps_content,
    refused_for_content,
    retry_delay_ms,
)
from relay.signals import RelaySignals
from relay.stopping import unless_stopped
from relay.store import (
    OutboxStore,
    Recorded,
    RelayStore,
    StoreFactory,
    create_relay_pool,
    relay_session_settings,
)
from relay.tracing import PublishSpans, PublishTracing
from relay.wakeups import NotificationListener, WakeUp, listen_plan

log = logging.getLogger(__name__)


class _RefusedForContent(RelayError):
    """The database refused an outcome's statement for the rows it carries."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


# The least time handing the lanes back and closing the pool get after a stop, even when
# the drain used all of its time: one round trip on a healthy path.
_LEAVE_FLOOR_S = 0.1

# Recording statements at once: the database write is the pipeline's slowest step, so two
# overlap, and what settles meanwhile waits to join the next one (_ack_loop, may_join).
_CONCURRENT_RECORDS = 2
_IDLE_TICK_MS = 1_000  # an idle loop still shows it is alive this often
_DATABASE_RETRY_CAP_MS = 30_000  # the longest wait between two tries to reach the database
_SCHEMA_POLL_S = 1.0  # how often a relay waiting for its schema looks again


@dataclass
class Batch:
    """Rows handed to the producer together, acknowledged and recorded together."""

    rows: list[OutboxRow]
    fences: dict[int, int]
    # Rows not in any submitted batch are either failures found before sending (the
    # submission's failures) or held back because an earlier row of their key failed.
    submission: Submission
    spans: PublishSpans  # ended once the broker answered (relay/tracing.py)


async def _set_before(event: anyio.Event, stop: anyio.Event) -> bool:
    """Wait for ``event``; False when ``stop`` was set first."""
    async with anyio.create_task_group() as waiting:

        async def stopped() -> None:
            await stop.wait()
            waiting.cancel_scope.cancel()

        waiting.start_soon(stopped)
        await event.wait()
        waiting.cancel_scope.cancel()
    return event.is_set() and not stop.is_set()


class Settled(NamedTuple):
    """A batch whose acknowledgements are in, sorted into its outcome, to be recorded."""

    batch: Batch
    outcome: Outcome


def may_join(group: Sequence[Settled], waiting: Settled, max_rows: int) -> bool:
    """Whether ``waiting`` may be recorded by the same statement as ``group``: neither has
    a failure (its retry delay and its log lines are its batch's own), every lane they
    share has one fence, and together they hold no more than ``max_rows`` rows (a backlog's
    full batches keep a statement each, two at once)."""
    if waiting.outcome.failed or any(settled.outcome.failed for settled in group):
        return False
    if sum(len(settled.batch.rows) for settled in group) + len(waiting.batch.rows) > max_rows:
        return False
    fences = waiting.batch.fences
    return all(
        fences.get(lane, fence) == fence
        for settled in group
        for lane, fence in settled.batch.fences.items()
    )


class _Prefetch:
    """The next batch's rows, read while the current one is sent, in a slot of their own;
    a task in the fetch loop's task group fills it."""

    def __init__(self, plan: FetchPlan, slot: Slot) -> None:
        self.plan = plan
        self.slot = slot
        self._done = anyio.Event()
        self._fetched: Fetched | None = None
        self._error: BaseException | None = None

    async def fill(self, fetch: Callable[[], Awaitable[Fetched]]) -> None:
        try:
            self._fetched = await fetch()
        except DB_ERRORS as exc:  # raised to the fetch loop when it takes the rows
            self._error = exc
        finally:
            self._done.set()

    async def fetched(self) -> Fetched:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        # Unset only when its task was cancelled, and its task group with it: then so is
        # the fetch loop waiting here.
        assert self._fetched is not None
        return self._fetched


class Relay:
    """One relay instance. Use :meth:`run` inside an event loop; it returns after a drain."""

    def __init__(
        self,
        config: RelayConfig,
        metrics: RelayMetrics,
        *,
        producer_factory: ProducerFactory = make_producer,
        store_factory: StoreFactory = RelayStore,
        tracer_provider: object = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.liveness = Liveness.for_relay(config)
        self.signals = RelaySignals()  # for tests (relay/signals.py)
        self._rng = random.Random()  # noqa: S311 - jitter only
        self._producer = ProducerKeeper(
            config, factory=producer_factory, on_backoff=self._wait_on_kafka, rng=self._rng
        )
        self._tracing = PublishTracing(
            client_id=config.instance_id, tracer_provider=tracer_provider
        )
        self._mapper = RecordMapper(
            topic_template=config.topic_template,
            ce_source=config.ce_source,
            allowed_topics=config.allowed_topics_pattern(),
            on_void_traceparent=metrics.void_traceparents.inc,
        )
        self._store_factory = store_factory
        # What the database must hold before a lane is claimed (relay/schema.py), and
        # what is missing while the relay waits for it.
        self._schema_needs: SchemaNeeds = schema.NEEDS
        self._waiting_for: str | None = None
        self._store: OutboxStore | None = None
        self._lanes: LaneKeeper | None = None
        self._wake = WakeUp()
        # When the stop's drain time ends (set by _drain_deadline): handing the lanes back
        # and closing the pool get what is left of it, never more.
        self._stop_deadline: float | None = None
        # Batches submitted and not yet recorded, at most this many: a crash can publish
        # again only what these hold.
        self._window = InFlightWindow(config.max_in_flight_batches, hold_of=self._mapper.hold_of)
        self._last_lane_tick_ok = 0.0
        # Where the fetch loop is in the outbox and what its pass has seen (relay/passes.py).
        self._passes = Passes(
            self._window,
            poll_interval_ms=config.poll_interval_ms,
            batch_size=config.batch_size,
            fetch_max_bytes=config.fetch_max_bytes,
        )
        self._bound_unreadable_said = False  # the sequence's refusal is logged once
        self._fetch_failure_said = ""  # a fetch failure's cause is logged once in a row
        # Lanes whose held rows hold their keys where this relay's template says
        # (_resolve_holds); a lane lost since is resolved again.
        self._resolved_lanes: set[int] = set()
        # Submissions the broker may not have answered yet (answered ones are dropped).
        self._unanswered: deque[Submission] = deque()
        # How long before the local end of a lease the producer is reset if it still
        # holds records of those lanes (the local end is already earlier than the
        # database's: it counts from before the renewal was sent).
        self._lease_guard_s = min(1.0, config.lease_renew_ms / 1000)

    # -- what the health sidecar asks -------------------------------------------------
    def live(self) -> bool:
        """True while every loop keeps coming back within its allowance."""
        return not self.liveness.stale()

    def ready(self) -> bool:
        """True when the relay can do its job: leases renewed recently and Kafka answering."""
        lanes_fresh = time.monotonic() - self._last_lane_tick_ok < self.config.lease_ttl_ms / 1000
        return self._producer.connected and lanes_fresh and self._producer.answering()

    def waiting_for(self) -> str | None:
        """What the database lacks before the relay may start its work (None: nothing)."""
        return self._waiting_for

    # -- service -----------------------------------------------------------------------
    async def run(self, stop: anyio.Event, may_claim: anyio.Event | None = None) -> None:
        """Relay until ``stop`` is set, then drain in-flight work within the drain timeout.

        With ``may_claim``, no lane is claimed before it is set: the process may still
        refuse to go on (outbox_relay/open_schema.py); the relay connects, waits for its
        schema and says what it waits for meanwhile."""
        config = self.config
        pool = await self._connect(stop)
        if pool is None:
            return
        store = self._store = self._store_factory(
            pool,
            instance_id=config.instance_id,
            topic_template=config.topic_template,
            fetch_max_bytes=config.fetch_max_bytes,
        )
        self._lanes = LaneKeeper(
            pool,
            instance_id=config.instance_id,
            ttl_ms=config.lease_ttl_ms,
            topic_template=config.topic_template,
        )
        housekeeping = Housekeeping(store, config, self.metrics, self.liveness)
        try:
            if not await self._wait_for_schema(pool, stop):
                return
            if not await self._producer.start(stop):
                return
            if config.transaction_pooler:
                await self._check_role_settings(store)
            if may_claim is not None and not await _set_before(may_claim, stop):
                return
            async with anyio.create_task_group() as background:
                self._every(background, "lanes", self._lane_round, config.lease_renew_ms)
                self._every(background, "observe", housekeeping.observe_round, OBSERVE_EVERY_MS)
                self._every(background, "prune", housekeeping.prune_round, config.prune_interval_ms)
                plan = listen_plan(
                    notify=config.notify,
                    database_url=config.database_url,
                    listen_database_url=config.listen_database_url,
                    transaction_pooler=config.transaction_pooler,
                )
                if plan.listen:
                    listener = NotificationListener(
                        plan.url,
                        poll_interval_ms=config.poll_interval_ms,
                        wake=self._wake,
                        liveness=self.liveness,
                        rng=self._rng,
                    )
                    background.start_soon(listener.run, name="listen")
                elif config.notify:
                    # Said once: the relay still delivers, a poll interval later at worst.
                    log.warning(
                        "NOTIFY wake-ups are off; polling only",
                        extra={
                            "cause": plan.off_because,
                            "poll_interval_ms": config.poll_interval_ms,
                        },
                    )
                # Every batch queued holds an in-flight slot, so the buffer never fills.
                batches, acknowledging = anyio.create_memory_object_stream[Batch](
                    config.max_in_flight_batches
                )
                with batches, acknowledging, anyio.CancelScope() as pipeline_scope:
                    async with anyio.create_task_group() as pipeline:
                        pipeline.start_soon(self._fetch_loop, stop, batches, name="fetch")
                        pipeline.start_soon(self._ack_loop, acknowledging, name="ack")
                        pipeline.start_soon(self._drain_deadline, stop, pipeline_scope)
                background.cancel_scope.cancel()
            if not self._window.empty():
                # Cancelled with records still in the producer: they must never land after
                # the next owner of these lanes published.
                self._producer.reset("stopping with records unanswered")
            await self._leave()
        finally:
            if not self._window.empty():
                self._producer.reset("stopping with records unanswered")
            await self._producer.stop()
            with anyio.move_on_after(self._time_left_to_stop()) as closing:
                await store.close()  # its kept connections: the pool waits for them
                await pool.close()
            if closing.cancelled_caught:  # a server that stopped answering: just drop them
                pool.terminate()

    async def _wait_for_schema(self, pool: asyncpg.Pool, stop: anyio.Event) -> bool:
        """Wait until the database holds the migrations and privileges the relay needs: no
        lane is claimed and nothing is fetched before. What is missing is said once, and
        again at most once a minute while it lasts; False if ``stop`` came first."""
        said = ShortfallLog()
        unreachable = ""
        while not stop.is_set():
            try:
                async with pooled(pool) as conn:
                    shortfall = await read_shortfall(conn, self._schema_needs)
            except DB_ERRORS as exc:
                if unavailable_cause(exc) != unreachable:
                    unreachable = unavailable_cause(exc)
                    log.warning(
                        "cannot read the schema's level; retrying", extra={"cause": unreachable}
                    )
            else:
                unreachable = ""
                self._waiting_for = None if shortfall is None else str(shortfall)
                if said.due(shortfall):
                    if shortfall is None:
                        log.info("schema ready; the relay starts")
                    else:
                        log.warning(
                            "the relay waits for its schema: it claims no lane until then",
                            extra={"cause": self._waiting_for},
                        )
                if shortfall is None:
                    return True
            with anyio.move_on_after(_SCHEMA_POLL_S):
                await stop.wait()
        return False

    async def _check_role_settings(self, store: OutboxStore) -> None:
        """Behind a transaction pooler the planner settings come from the relay's role:
        say once which are missing (the relay is correct without them, only slower after
        a burst)."""
        try:
            missing = await store.settings_not_in_effect(
                relay_session_settings(self.config.statement_timeout_ms)
            )
        except DB_ERRORS:
            return  # the loops report an unreachable database
        if missing:
            log.warning(
                "behind the pooler these session settings are not in effect; "
                "set them on the relay's role (ALTER ROLE ... SET)",
                extra={"settings": ", ".join(missing)},
            )

    async def _connect(self, stop: anyio.Event) -> asyncpg.Pool | None:
        """The relay's pool, waiting for the database with capped back-off (an orchestrator
        restarting us would only back off longer); None if ``stop`` came first, also in
        the middle of an attempt. Logs each change of state once. A malformed URL
        (ConfigError) is not retried."""
        attempt = 0
        last_cause = ""
        connecting = partial(
            create_relay_pool,
            self.config.database_url,
            transaction_pooler=self.config.transaction_pooler,
            statement_timeout_ms=self.config.statement_timeout_ms,
        )
        while not stop.is_set():
            try:
                # A stop ends the attempt at once: on a stalled path it waits 10 s.
                pool = await unless_stopped(stop, connecting)
            except Stopped:
                return None
            except DatabaseUnavailable as exc:
                if str(exc) != last_cause:
                    last_cause = str(exc)
                    log.warning(
                        "relay database unavailable, retrying with back-off",
                        extra={"cause": last_cause, "retry_cap_ms": _DATABASE_RETRY_CAP_MS},
                    )
                delay = backoff_ms(
                    attempt, base_ms=500, cap_ms=_DATABASE_RETRY_CAP_MS, rng=self._rng
                )
                attempt += 1
                with anyio.move_on_after(delay / 1000):
                    await stop.wait()
                continue
            if last_cause:
                log.info("relay database reachable again")
            return pool
        return None

    def _every(
        self,
        group: TaskGroup,
        name: str,
        round_: Callable[[], Awaitable[None]],
        every_ms: int,
    ) -> None:
        ticker = partial(run_rounds, liveness=self.liveness, rng=self._rng)
        group.start_soon(ticker, name, round_, every_ms, name=name)

    async def _drain_deadline(self, stop: anyio.Event, scope: anyio.CancelScope) -> None:
        """After ``stop``: drain, and at the end of the drain time give up on what the
        broker has not answered (reset), keeping a reserve to record that and hand back."""
        await stop.wait()
        self._wake.set()
        drain_s = self.config.drain_timeout_ms / 1000
        self._stop_deadline = anyio.current_time() + drain_s
        reserve_s = min(2.0, drain_s / 4)
        scope.deadline = self._stop_deadline - reserve_s / 2
        with anyio.move_on_after(drain_s - reserve_s):
            await self._window.wait_empty()
            return  # drained in time: nothing to give up, and no reason to wait longer
        if not self._window.empty():
            self._producer.reset("drain timeout")

    def _wait_on_kafka(self, delay_ms: int) -> None:
        """While the producer cannot start, the pipeline loops wait with it and stay live."""
        self.liveness.tick("fetch", delay_ms)
        self.liveness.tick("ack", delay_ms)

    # -- lanes ---------------------------------------------------------------------------
    async def _lane_round(self) -> None:
        assert self._lanes is not None
        before = set(self._lanes.leases.fences)
        await self._lanes.tick(in_flight_lanes=self._window.lanes())
        self._last_lane_tick_ok = time.monotonic()
        self.metrics.lanes_owned.set(len(self._lanes.leases.fences))
        self.signals.lanes_owned.signal(len(self._lanes.leases.fences))
        if set(self._lanes.leases.fences) - before:
            # New lanes may have a backlog waiting, anywhere in the outbox.
            self._wake.request_full_pass()

    def _time_left_to_stop(self) -> float:
        """Seconds until the stop's drain time ends (the whole drain time without a stop),
        with a floor so that a quick statement still gets its round trip."""
        if self._stop_deadline is None:
            return self.config.drain_timeout_ms / 1000
        return max(_LEAVE_FLOOR_S, self._stop_deadline - anyio.current_time())

    async def _leave(self) -> None:
        assert self._lanes is not None
        cause = "timed out"
        # On a path that stopped answering the statement would wait for ever; the lanes
        # expire on their own within a lease.
        with anyio.move_on_after(self._time_left_to_stop()):
            try:
                await self._lanes.leave()
                return
            except DB_ERRORS as exc:
                cause = unavailable_cause(exc)
        log.warning("could not hand lanes back; they expire on their own", extra={"cause": cause})

    # -- fetch and send ---------------------------------------------------------------------
    async def _fetch_loop(self, stop: anyio.Event, batches: MemoryObjectSendStream[Batch]) -> None:
        # Closing the stream (on the way out, however) tells the ack loop nothing more comes.
        async with batches, anyio.create_task_group() as prefetching:
            try:
                await self._fetch_passes(stop, batches, prefetching)
            finally:
                prefetching.cancel_scope.cancel()

    async def _fetch_passes(
        self, stop: anyio.Event, batches: MemoryObjectSendStream[Batch], prefetching: TaskGroup
    ) -> None:
        """Do what the passes decide (relay/passes.py makes every decision about the rows):
        wait, replace the producer, resolve holds, or fetch and send; after a fetch whose
        rows ask for nothing more at once, wait for news."""
        passes, wake = self._passes, self._wake
        # While a full batch is mapped and handed to the producer, the database already
        # reads the next one. A prefetch holds an in-flight slot of its own.
        prefetch: _Prefetch | None = None
        try:
            while not stop.is_set():
                self.liveness.tick("fetch", self.config.poll_interval_ms)
                if prefetch is None:
                    lanes = self._publishable_lanes()
                    decision = passes.next(
                        time.monotonic(),
                        lanes,
                        wake.take_news(),
                        producer_broken=self._producer.broken,
                        holds_resolved=bool(lanes) and self._holds_resolved(lanes),
                    )
                    if not isinstance(decision, Fetch):
                        await self._carry_out(decision, stop)
                        continue
                    slot = await self._window.take_slot()
                    # The news this fetch answers, and the wake-ups that brought it: a
                    # wake-up left set with its news taken would bring a fetch for nothing.
                    wake.clear()
                    plan = passes.plan(decision.lanes, time.monotonic(), wake.take_news())
                    if plan.start == 0:
                        self.metrics.full_passes.inc()
                    fetching = self._fetch(plan)
                else:
                    slot, plan, fetching = prefetch.slot, prefetch.plan, prefetch.fetched()
                    prefetch = None
                with slot:  # given back at the end unless a batch took it
                    try:
                        fetched = await fetching
                    except DB_ERRORS as exc:
                        await self._fetch_failed(plan, exc)
                        continue
                    accepted, prefetch = await self._hand_on(fetched, slot, batches, prefetching)
                if not accepted.more_now:
                    await self._wait_for_news(prefetching)
        finally:
            if prefetch is not None:
                prefetch.slot.give_back()  # its task is cancelled with the task group
            passes.close()

    async def _hand_on(
        self,
        fetched: Fetched,
        slot: Slot,
        batches: MemoryObjectSendStream[Batch],
        prefetching: TaskGroup,
    ) -> tuple[Accepted, _Prefetch | None]:
        """Let the pass accept a fetch's rows, start reading the next fetch while they are
        sent when the pass may go on, and send the rows that may go in ``slot``."""
        passes, window = self._passes, self._window
        self._fetch_failure_said = ""
        self.metrics.fetched_bytes.inc(fetched.transferred_bytes)
        prefetch = None
        with fetched.mark:  # closed once its rows are filtered
            accepted = passes.accept(fetched)
            lanes = self._publishable_lanes()
            ahead = passes.prefetch(
                time.monotonic(),
                accepted,
                lanes,
                producer_broken=self._producer.broken,
                slot_free=window.slot_free(),
            )
            if ahead is not None and (free := window.try_take_slot()):
                prefetch = _Prefetch(ahead, free)
                prefetching.start_soon(prefetch.fill, partial(self._fetch, ahead))
                # Let it run as far as sending its statement (its first real wait) before
                # this batch is mapped: mapping never yields, and a prefetch sent only
                # after it would take turns with it instead of overlapping.
                await anyio.lowlevel.checkpoint()
            rows = passes.sendable(accepted.rows, lanes, fetched.mark)
        unmeasured = [row.seq for row in accepted.rows if row.size is None]
        if unmeasured:
            await self._measure(unmeasured)
        if rows:
            await batches.send(await self._send(rows, slot))
        return accepted, prefetch

    def _publishable_lanes(self) -> list[int]:
        """The lanes a send may start on now: a send started now must be settled before the
        lease could pass to another instance (the renewal cadence keeps that window open)."""
        assert self._lanes is not None
        return self._lanes.leases.publishable(self.config.send_timeout_ms / 1000)

    async def _carry_out(self, decision: Decision, stop: anyio.Event) -> None:
        """Do what the passes decided instead of a fetch."""
        match decision:
            case Wait(seconds=seconds, for_news=False):
                with anyio.move_on_after(seconds):
                    await stop.wait()
            case Wait(seconds=seconds, for_news=True):
                with anyio.move_on_after(seconds):
                    await self._wake.wait()
                self._wake.clear()
            case ReplaceProducer():
                # Fresh sequences only once nothing is in flight on the old ones.
                await self._window.wait_empty()
                await self._producer.replace(stop)
            case ResolveHolds(lanes=lanes):
                await self._resolve_holds(lanes)

    async def _wait_for_news(self, prefetching: TaskGroup) -> None:
        """Wait for news, or a poll interval, also while batches are still in flight: their
        rows are left out of the fetches meanwhile, so a new event never waits for the
        batches before it to be recorded. The next fetch starts from the cursor, or below
        the lowest seq notified meanwhile: a late commit is read before any later row of
        its key. A full pass due soon has its bound read now."""
        if self._passes.take_bound_refresh(time.monotonic()):
            prefetching.start_soon(self._refresh_bound)
        with anyio.move_on_after(self.config.poll_interval_ms / 1000) as polling:
            await self._answered()
            await self._wake.wait()
            while not self._passes.asks_for_fetch(self._wake.take_news()):
                # Notifications of rows a fetch has read already: nothing to fetch for them.
                self._wake.clear()
                await self._wake.wait()
        if polling.cancelled_caught:
            # The safety net: what no notification announced (one lost with the listening
            # connection, a writer without the payload).
            self._passes.polled()

    # -- what the door did not decide -------------------------------------------------------
    def _holds_resolved(self, lanes: Sequence[int]) -> bool:
        """True when the held rows of every lane in ``lanes`` hold their keys where this
        relay's template says (a lane lost since must be resolved again when it is back)."""
        self._resolved_lanes &= set(lanes)
        return self._resolved_lanes.issuperset(lanes)

    async def _resolve_holds(self, lanes: Collection[int]) -> None:
        """Record where the held rows of these lanes hold their keys under this relay's
        template, before they are fetched (relay/sql.py, HELD_TO_RESOLVE): another instance,
        another template or an older relay may have decided it."""
        assert self._store is not None and self._lanes is not None
        new = sorted(set(lanes) - self._resolved_lanes)
        fences = dict(zip(*self._lanes.leases.fences_for(new), strict=True))
        try:
            resolved = await self._store.resolve_holds(fences)
        except DB_ERRORS as exc:
            log.warning(
                "could not resolve held rows; retrying", extra={"cause": unavailable_cause(exc)}
            )
            await anyio.sleep(backoff_ms(1, base_ms=200, cap_ms=2_000, rng=self._rng) / 1000)
            return
        if resolved:
            log.info(
                "held rows resolved under this relay's topic template", extra={"events": resolved}
            )
        self._resolved_lanes.update(new)

    async def _measure(self, seqs: list[int]) -> None:
        """Have the door measure rows stored before it (they are sent once measured, by the
        next pass). A row whose measurement fails on its own, again, while the others'
        succeed is quarantined without being read; anything else is tried again later."""
        assert self._store is not None
        parts = [seqs]
        failed: list[tuple[int, BaseException]] = []
        while parts:
            part = parts.pop()
            try:
                await self._store.measure(part)
            except DB_ERRORS as exc:
                if not perhaps_content(exc):
                    log.warning(
                        "could not measure rows stored before the door; retrying",
                        extra={"cause": unavailable_cause(exc)},
                    )
                    return
                if len(part) > 1:
                    middle = len(part) // 2
                    parts.extend((part[middle:], part[:middle]))
                else:
                    failed.append((part[0], exc))
        if len(failed) == len(seqs):
            return  # nothing measured: load, not a row
        for seq, first in failed:
            try:
                await self._store.measure([seq])  # again
            except DB_ERRORS:
                await self._quarantine_unfetchable(seq, first, UNMEASURABLE)

    async def _fetch_failed(self, plan: FetchPlan, exc: BaseException) -> None:
        """A fetch failed: when its rows' content could be why, narrow it to the row
        (relay/narrowing.py); otherwise, or when narrowing names none, wait a little."""
        cause = unavailable_cause(exc)
        if perhaps_content(exc):
            narrowing = Narrowing(plan.start, plan.limit)
            step = await self._narrow(plan.lanes, narrowing)
            if step.kind is StepKind.QUARANTINE:
                await self._quarantine_unfetchable(step.seq, exc, UNFETCHABLE)
                return
        if cause != self._fetch_failure_said:
            log.warning("fetch failed", extra={"cause": cause})
            self._fetch_failure_said = cause
        await anyio.sleep(backoff_ms(1, base_ms=200, cap_ms=2_000, rng=self._rng) / 1000)

    async def _narrow(self, lanes: frozenset[int], narrowing: Narrowing) -> Step:
        """Run the narrowing's statements until it names a row or gives up."""
        assert self._store is not None
        while (step := narrowing.step()).kind in (StepKind.PREFIX, StepKind.ALONE, StepKind.LIST):
            self.liveness.tick("fetch", self.config.statement_timeout_ms)
            try:
                if step.kind is StepKind.LIST:
                    narrowing.listed(await self._store.ready_seqs(lanes, step.start, step.limit))
                    continue
                await self._store.fetch_ready(lanes, step.start, step.limit)
                narrowing.fetched(True)
            except DB_ERRORS as exc:
                if not perhaps_content(exc):
                    return Step(StepKind.GIVE_UP)
                narrowing.fetched(False)
        return step

    async def _quarantine_unfetchable(
        self, seq: int, exc: BaseException, failure: FailureClass
    ) -> None:
        """Quarantine the row ``seq`` as ``failure`` without reading it; its SQLSTATE (never
        the server's text) is logged."""
        assert self._store is not None and self._lanes is not None
        lane_fences = dict(self._lanes.leases.fences)
        sqlstate = getattr(exc, "sqlstate", None) or ""
        cause = failure.name
        try:
            done = await self._store.quarantine_unfetchable(lane_fences, seq, cause)
        except DB_ERRORS as failed:
            log.warning(
                "could not quarantine a row that cannot be read; retrying",
                extra={"seq": seq, "cause": unavailable_cause(failed)},
            )
            return
        if done:
            self.metrics.quarantined.inc()
            self.metrics.failures.labels(cause).inc()
            self._resolved_lanes.clear()  # where it holds its key is resolved again
            log.error(
                "event quarantined: it cannot be read",
                extra={"seq": seq, "error_class": cause, "sqlstate": sqlstate},
            )

    async def _answered(self) -> None:
        """Return once the broker answered every batch handed over so far.

        Batching from load: while a request is out, new rows gather in the database and go
        out together in the next fetch, as a producer gathers records while its request is
        in flight, instead of one fetch, one batch and one bookkeeping transaction per
        event. Only the broker's answer is waited for, never the bookkeeping after it.
        """
        while self._unanswered:
            await self._unanswered[0].answered()
            self._unanswered.popleft()

    async def _fetch(self, plan: FetchPlan) -> Fetched:
        """Run one fetch: a full pass's first fetch reads the pass's bound before it; the
        rows in flight when the statement starts are left out of what it returns."""
        assert self._store is not None
        bound = None
        if plan.kind is FetchKind.OPENS_PASS:
            # At light load the pass's first fetch is its only one: its bound was read
            # while the loop waited, if it could be.
            bound = self._passes.take_spare_bound()
            if bound is None:
                bound = await self._pass_bound()
        # No row joins the window meanwhile that this fetch could read: rows are admitted
        # from earlier fetches, whose rows lie below its start.
        left_out, mark = self._passes.open_fetch(plan)
        met = self._passes.met_in_flight(plan, left_out)
        started_at = time.monotonic()
        try:
            rows = await self._store.fetch_ready(
                plan.lanes, plan.start, plan.limit, check_below=plan.check_below, in_flight=met
            )
        except BaseException:
            mark.close()
            raise
        return self._passes.fetched(
            plan,
            rows,
            mark=mark,
            left_out=left_out,
            bound=bound,
            started_at=started_at,
            met=frozenset(met),
        )

    async def _refresh_bound(self) -> None:
        bound = None
        try:
            bound = await self._pass_bound()
        except DB_ERRORS:
            pass  # the next pass reads its own
        finally:
            self._passes.bound_read(bound)

    async def _pass_bound(self) -> int | None:
        """The highest seq drawn so far, read before a full pass's first fetch; None (and a
        warning, once) when the relay's role may not read the sequence."""
        assert self._store is not None
        bound = await self._store.seq_allocated()
        if bound is None and not self._bound_unreadable_said:
            self._bound_unreadable_said = True
            log.warning(
                "cannot read the outbox sequence; a full pass may publish a late commit's "
                "next row before it: run `outbox-relay grant` again for the relay's role",
            )
        return bound

    async def _send(self, rows: list[OutboxRow], slot: Slot) -> Batch:
        """Put the rows in flight in ``slot`` and hand them to the producer."""
        assert self._lanes is not None
        fences = dict(zip(*self._lanes.leases.fences_for({r.lane for r in rows}), strict=True))
        # In flight from now, before the producer has them: a hand-over must not take these
        # lanes while a slow submit (metadata waits) is still going.
        self._window.admit(rows, slot)
        spans = self._tracing.start(rows, self._topics_of(rows))
        # Keys held since these rows were fetched are left out where the batches are built
        # (a batch built after a failure was held carries none of its keys), and the keys
        # of rows that fail here are held before it returns.
        submission = await self._producer.submit(rows, self._mapper.to_record, self._window)
        while self._unanswered and not self._unanswered[0].unanswered():
            self._unanswered.popleft()  # answered: kept no longer than the window holds
        self._unanswered.append(submission)
        self.signals.sent.signal(submission)
        return Batch(rows=rows, fences=fences, submission=submission, spans=spans)

    def _topics_of(self, rows: list[OutboxRow]) -> Iterator[str]:
        """The topics these rows go to (those that have one), for the publish span."""
        for row in rows:
            with contextlib.suppress(RecordRejected):
                yield self._mapper.topic_for(row)

    # -- acknowledge and record ------------------------------------------------------------
    async def _ack_loop(self, batches: MemoryObjectReceiveStream[Batch]) -> None:
        # Acknowledgements are awaited in submission order; recording them may overlap
        # (two statements at once), because the database write is the slowest step.
        # Batches settled while both statements run wait in ``settled``, and the next
        # statement records all of them that it may (may_join): nothing waits for company
        # when a batch comes alone, and under load one statement records several.
        settled_in, settled_out = anyio.create_memory_object_stream[Settled](math.inf)
        async with batches, anyio.create_task_group() as recorders:
            with settled_in:  # closed on the way out: the recorders write what is left, then end
                with settled_out:
                    for _ in range(_CONCURRENT_RECORDS):
                        recorders.start_soon(self._record_loop, settled_out.clone())
                while True:
                    self.liveness.tick("ack", _IDLE_TICK_MS)
                    with anyio.move_on_after(_IDLE_TICK_MS / 1000) as idle:
                        try:
                            batch = await batches.receive()
                        except anyio.EndOfStream:
                            return
                    if idle.cancelled_caught:
                        continue  # nothing in flight: idle, and alive
                    try:
                        outcome = await self._settle(batch)
                    except BaseException:
                        self._window.give_back_batch_slot()
                        raise
                    settled_in.send_nowait(Settled(batch, outcome))

    async def _record_loop(self, settled: MemoryObjectReceiveStream[Settled]) -> None:
        """Record settled batches until the stream ends: each statement takes the first
        waiting and every later one waiting that may join it."""
        carried: Settled | None = None
        async with settled:
            while True:
                if carried is None:
                    try:
                        carried = await settled.receive()
                    except anyio.EndOfStream:
                        return
                group, carried = [carried], None
                while True:
                    try:
                        waiting = settled.receive_nowait()
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                    if not may_join(group, waiting, self.config.batch_size):
                        carried = waiting
                        break
                    group.append(waiting)
                await self._conclude(group)

    async def _settle(self, batch: Batch) -> Outcome:
        """Wait for the batch's acknowledgements and sort its rows into published and failed."""
        assert self._lanes is not None
        submission = batch.submission
        # Wait for the broker, but never past the point where the lanes could pass to
        # another instance: a record still held then could land after the next owner's.
        lease_left_s = self._lanes.leases.valid_until - time.monotonic() - self._lease_guard_s
        within_s = max(0.0, min(2 * self.config.send_timeout_ms / 1000, lease_left_s))
        acknowledgements = await submission.acknowledgements(within_s=within_s)
        if submission.unanswered():
            self._producer.reset(
                "lease ending" if within_s >= lease_left_s else "broker did not answer in time"
            )
        outcome = sort_outcome(acknowledgements, submission.failures)
        with batch.spans.current():
            self._say_unexpected(
                [(len(rows), answer) for rows, answer in acknowledgements]
                + [(1, exc) for _, exc in submission.failures]
            )
        batch.spans.end(outcome.failed[0][1].label if outcome.failed else None)
        # The failed rows' keys are held already (Submission.acknowledgements): until the
        # failures are recorded, the database does not hold them back yet.
        if outcome.producer_broken:
            self._producer.sequences_lost()
        return outcome

    @staticmethod
    def _say_unexpected(answers: Sequence[tuple[int, object]]) -> None:
        """One line per kind of error nothing classifies (its type and where it was
        raised, contracts/unexpected.py), with how many of the batch's events it failed."""
        said: dict[tuple[type, str | None], tuple[BaseException, int]] = {}
        for events, answer in answers:
            if isinstance(answer, BaseException) and classify_failure(answer).label == UNEXPECTED:
                kind = (type(answer), raised_at(answer))
                first, counted = said.get(kind, (answer, 0))
                said[kind] = (first, counted + events)
        for exc, events in said.values():
            log_unexpected(log, "publish failed unexpectedly", exc, events=events)

    async def _conclude(self, group: list[Settled]) -> None:
        """Record the outcomes, then let the batches' rows and slots go."""
        try:
            await self._record(group)
        finally:
            for batch, outcome in group:
                self._window.release(batch.rows, (row for row, _ in outcome.failed))
        now = datetime.now(UTC)
        for _, outcome in group:
            self.signals.recorded.signal(outcome)
            if outcome.published:
                self.metrics.published.inc(outcome.published_count)
                self.metrics.latency.observe_many(
                    [
                        (now - row.created_at).total_seconds()
                        for published in outcome.published
                        for row in published.rows
                        if row.created_at is not None  # always, once published
                    ]
                )
            self._producer.note_outcome(
                published=bool(outcome.published),
                failed_retriably=any(
                    f.retriable and f not in NOT_BROKER_FAILURES for _, f in outcome.failed
                ),
            )
        if log.isEnabledFor(logging.DEBUG):
            # Counts only: a batch's keys, ids and contents are never logged.
            log.debug(
                "recorded",
                extra={
                    "batches": len(group),
                    "published": sum(outcome.published_count for _, outcome in group),
                    "failed": sum(len(outcome.failed) for _, outcome in group),
                },
            )

    async def _record(self, group: list[Settled]) -> None:
        assert self._store is not None and self._lanes is not None
        config = self.config
        failed = [failure for _, outcome in group for failure in outcome.failed]
        delays = [
            retry_delay_ms(
                failure,
                failure_streak=self._producer.failure_streak,
                attempts=row.attempts,
                base_ms=config.retry_base_ms,
                cap_ms=config.retry_cap_ms,
                rng=self._rng,
            )
            for row, failure in failed
        ]
        if delays:
            # Each failed row waits behind the cursor for its retry, and holds its key's
            # later rows back in the database: until it is due (and a poll interval more),
            # passes start from the beginning, as every pass did before cursor fetches.
            self._wake.request_full_passes_until(
                time.monotonic() + (max(delays) + config.poll_interval_ms) / 1000
            )
        fences: dict[int, int] = {}
        entries: list[ToRecord] = []
        for batch, outcome in group:
            fences.update(batch.fences)  # one fence per lane in a group (may_join)
            entries.extend(outcome.published)
        entries.extend(map(Delayed._make, zip(failed, delays, strict=True)))
        published_count = sum(outcome.published_count for _, outcome in group)
        written = await self._write_outcome(fences, entries)
        if written is None:
            # Past the lease the write would be fenced anyway: the rows go to the next
            # owner (or to ourselves after the next claim) for republishing.
            log.warning(
                "could not record acknowledgements before the lease ended; "
                "the events will be published again",
                extra={"events": published_count},
            )
            return
        recorded, unrecordable = written
        fenced = published_count - recorded.published - unrecordable
        if fenced:
            self.metrics.fenced.inc(fenced)
            log.warning(
                "lane changed owner while publishing; the new owner republishes",
                extra={"events": fenced},
            )
        if failed:
            ((batch, _),) = group  # a batch with failures is recorded alone (may_join)
            with batch.spans.current():  # its lines carry the batch's trace and span ids
                self._count_failures(failed, recorded.quarantined)

    async def _write_outcome(
        self, fences: dict[int, int], entries: list[ToRecord]
    ) -> tuple[Recorded, int] | None:
        """Record a batch's outcome: what was recorded and how many of its published rows
        the database refused to record; None when the lease ended first.

        One statement for the whole batch. When the database refuses it for a row's
        content (a value over a limit, a check), the batch is recorded in halves, down to
        single rows, so the others are recorded (a partition batch is halved into slices of
        consecutive offsets, never taken apart row by row); a row whose own outcome cannot
        be written is never sent again by this process (relay/passes.py) and said once.
        """
        published = quarantined = unrecordable = 0
        parts = [entries]
        while parts:
            part = parts.pop()
            try:
                recorded = await self._write_part(fences, part)
            except _RefusedForContent as refused:
                if rows_in(part) > 1:
                    first, second = halves(part)
                    parts.extend((second, first))  # the first half first
                    continue
                unrecordable += self._never_send_unrecordable(part[0], refused.sqlstate)
                continue
            if recorded is None:
                return None
            published += recorded.published
            quarantined += recorded.quarantined
        return Recorded(published, quarantined), unrecordable

    async def _write_part(self, fences: dict[int, int], part: list[ToRecord]) -> Recorded | None:
        """One statement for these rows' outcomes, retried while the database cannot be
        reached (said once per cause); None when the lease ended first."""
        assert self._store is not None and self._lanes is not None
        groups = [entry for entry in part if isinstance(entry, PublishedGroup)]
        failures = [entry for entry in part if isinstance(entry, Delayed)]
        attempt = 0
        said = ""
        while True:
            try:
                return await self._store.record_outcome(
                    fences,
                    groups,
                    [delayed.failed for delayed in failures],
                    [delayed.delay_ms for delayed in failures],
                    max_attempts=self.config.max_attempts,
                )
            except DB_ERRORS as exc:
                if refused_for_content(exc):
                    raise _RefusedForContent(getattr(exc, "sqlstate", None) or "") from exc
                cause = unavailable_cause(exc)
                if cause != said:
                    log.warning(
                        "could not record a batch's outcome; retrying", extra={"cause": cause}
                    )
                    said = cause
                if time.monotonic() > self._lanes.leases.valid_until:
                    return None
                attempt += 1
                await anyio.sleep(
                    backoff_ms(attempt, base_ms=100, cap_ms=2_000, rng=self._rng) / 1000
                )

    def _never_send_unrecordable(self, entry: ToRecord, sqlstate: str) -> int:
        """A row whose outcome the database refuses to record: this process never sends
        it again (it stays in the outbox, where the health sidecar sees it wait), and a
        failed one keeps its key held. Returns 1 for a published row, else 0."""
        row = entry.rows[0] if isinstance(entry, PublishedGroup) else entry.failed.row
        self._passes.never_send(row.seq)
        self.metrics.unrecordable.set(self._passes.never_sent)
        log.error(
            "the database refused to record this event's outcome; it is left out until the "
            "relay restarts",
            extra={
                "seq": row.seq,
                "sqlstate": sqlstate,
                "published": isinstance(entry, PublishedGroup),
            },
        )
        if isinstance(entry, PublishedGroup):
            return 1
        self._window.hold([row])  # never released: its failure is not recorded
        return 0

    def _count_failures(self, failed: list[FailedRow], quarantined: int) -> None:
        by_class = Counter(failure for _, failure in failed if failure is not LANE_LOST)
        for failure, count in by_class.items():
            if failure.retriable:
                self.metrics.retries.labels(failure.name).inc(count)
            else:
                self.metrics.failures.labels(failure.name).inc(count)
            # One line per batch and cause, not per event.
            log.warning(
                "publish failed",
                extra={
                    "error_class": failure.name,
                    "retriable": failure.retriable,
                    "events": count,
                },
            )
        if quarantined:
            self.metrics.quarantined.inc(quarantined)
            log.error("events quarantined", extra={"events": quarantined})
