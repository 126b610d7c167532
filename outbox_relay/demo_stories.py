"""The demo's three failure stories: each staged, watched on ``/health``, then recovered.

1. A worker dies holding a lease: ``scoring_jobs`` is stalled on an expired lease until the
   expiry sweep makes the job due again.
2. A legacy code path completes a job with plain SQL and writes no event:
   ``completion_outbox`` is stalled until the completion is replayed through the writer,
   which enqueues the missing event.
3. A poison event, larger than its topic accepts, written by a plain insert: the relay
   quarantines it, holds its key's later events and keeps every other key flowing;
   ``outbox`` is stalled on the quarantine until the cause is fixed (the topic's
   ``max.message.bytes`` raised) and ``outbox-relay redrive`` returns it, in key order.

A story waits for the sidecar's own report (the one ``/health`` serves) to show its
family stalled with its reason, leaves it on show for ``--story-hold-ms``, recovers, and
waits for the family to be within bounds again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import anyio
import asyncpg
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from contracts.errors import DatabaseUnavailable
from contracts.health import Classification, FamilyResult, HealthReport
from contracts.policy import Family
from pgconnect import connect
from relay.config import RelayConfig
from scoring.worker import expire_leases
from scoring.writer import EventDetails, complete_job

log = logging.getLogger("outbox_relay.demo")

# How long a story waits for health to show its stall, and then its recovery, before it
# says so and moves on (a demo must not hang on a busy machine).
STALL_TIMEOUT_S = 180.0
RECOVERY_TIMEOUT_S = 180.0
PAUSE_BETWEEN_STORIES_S = 5.0
# How long a story stopped by Ctrl-C may take to recover before the process exits.
STOP_RECOVERY_S = 15.0
# The dead worker's lease: short, so the stall shows soon.
DEAD_LEASE_MS = 2_000
# The legacy path's lease: long enough that it never expires before the plain UPDATE.
LEGACY_LEASE_MS = 60_000

# The poison story's own topic (its aggregatetype under the relay's topic template).
LEDGER = "ledger"
LEDGER_EVENT_TYPE = "ledger.entry.posted"
LEDGER_PARTITIONS = 3
SMALL_MAX_MESSAGE_BYTES = 8_192
FIXED_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default
POISON_MEMO_BYTES = 64 * 1024

# A legacy completion: the job's state changes and nothing else. Exactly what the writer
# exists to prevent (its transaction also enqueues the event).
_LEGACY_COMPLETE = """
UPDATE scoring_job_state
SET scoring_state = 'completed',
    result_ref = $2,
    completed_fencing_token = active_fencing_token,
    next_attempt_at_unix_ms = NULL,
    active_worker_ref = NULL,
    active_lease_ref = NULL,
    active_fencing_token = NULL,
    active_lease_expires_at_unix_ms = NULL,
    updated_at = clock_timestamp()
WHERE scoring_job_ref = $1 AND scoring_state = 'leased' AND active_fencing_token = $3
"""

# A plain insert, as any application may write the outbox; no writer checks its size.
_INSERT_LEDGER_EVENT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, $4::jsonb)
RETURNING id
"""

# Per key of this run: quarantined, held (pending, not quarantined) and published events.
_LEDGER_KEYS = """
SELECT key,
       (SELECT count(*) FROM outbox
        WHERE aggregatetype = $1 AND aggregateid = key AND quarantined_at IS NOT NULL),
       (SELECT count(*) FROM outbox
        WHERE aggregatetype = $1 AND aggregateid = key AND quarantined_at IS NULL),
       (SELECT count(*) FROM outbox_receipt WHERE aggregatetype = $1 AND aggregateid = key)
FROM pg_catalog.unnest($2::text[]) AS key
"""

# Where each event landed, in the order the demo wrote them.
_LANDED = """
SELECT written.ord, receipt.kafka_partition, receipt.kafka_offset
FROM pg_catalog.unnest($1::uuid[]) WITH ORDINALITY AS written(id, ord)
LEFT JOIN outbox_receipt AS receipt ON receipt.id = written.id
ORDER BY written.ord
"""


class HealthWatch(Protocol):
    """The sidecar as the demo watches it."""

    async def next_report(self) -> HealthReport:
        """The report of the next evaluation, as ``/health`` serves it."""
        ...


@dataclass(frozen=True)
class DemoSystem:
    """The relay's configuration and the sidecar of the process the demo runs in."""

    relay: RelayConfig
    health: HealthWatch


@dataclass(frozen=True)
class StoryContext:
    """What every story may use."""

    database_url: str | None = field(repr=False)
    run: str
    system: DemoSystem
    hold_s: float
    event: EventDetails
    claim_job: Callable[[asyncpg.Connection, int], Awaitable[tuple[str, int]]]


class Story(Protocol):
    """One failure: what it shows, how it is staged and how it is recovered."""

    title: str
    family: Family
    reason: str  # a word of the stalled reason /health gives for it
    happening: str
    look_at: str
    recovery: str

    async def start(self, context: StoryContext) -> None:
        """Stage the failure."""
        ...

    async def on_show(self, context: StoryContext) -> None:
        """While health reports it: anything more worth showing."""
        ...

    async def recover(self, context: StoryContext) -> None:
        """Do what the runbook says."""
        ...

    async def after(self, context: StoryContext) -> None:
        """Once the family is within bounds again: show the result."""
        ...


class QuietStory:
    """A story with nothing more to show while on show or after its recovery."""

    async def on_show(self, context: StoryContext) -> None:
        """Nothing more while on show."""

    async def after(self, context: StoryContext) -> None:
        """Nothing more after the recovery."""


def say(text: str) -> None:
    """A line for the person watching the demo (stdout; logs go to stderr)."""
    print(text, flush=True)


# -- story 1 -----------------------------------------------------------------------------------
class DeadWorker(QuietStory):
    """A worker dies holding its lease; the expiry sweep makes the job due again."""

    title = "a worker dies holding a lease"
    family = Family.SCORING_JOBS
    reason = "expired_lease_count"
    happening = (
        "A scoring worker claims a job and dies before finishing it. Its lease "
        f"({DEAD_LEASE_MS} ms) expires by the database clock; nobody owns the job."
    )
    look_at = (
        "/health: scoring_jobs:classification stalled, 'expired_lease_count 1 > "
        "max_expired_lease_count 0'; scoring_jobs:expired_lease_count. On /: the scoring_jobs row."
    )
    recovery = (
        "the expiry sweep (scoring.worker.expire_leases) ends the expired lease: the job is due "
        "again and a live worker completes it; scoring_jobs returns to within_bounds."
    )

    async def start(self, context: StoryContext) -> None:
        """Claim a job with a short lease and disconnect: the worker is gone."""
        conn = await connect(context.database_url)
        try:
            await context.claim_job(conn, DEAD_LEASE_MS)
        finally:
            await conn.close()
        say("  a worker claimed a job and died.")

    async def recover(self, context: StoryContext) -> None:
        """Run the expiry sweep once."""
        conn = await connect(context.database_url)
        try:
            expiry = await expire_leases(conn, limit=100, event=context.event)
        finally:
            await conn.close()
        say(
            f"  the expiry sweep made {len(expiry.rescheduled)} job(s) due again "
            f"and quarantined {len(expiry.quarantined)}."
        )


# -- story 2 -----------------------------------------------------------------------------------
@dataclass
class LegacyCompletion(QuietStory):
    """A completion written without its event, reconciled through the writer."""

    title = "a legacy code path completes a job without its event"
    family = Family.COMPLETION_OUTBOX
    reason = "missing_count"
    happening = (
        "An old code path marks a leased job completed with a plain UPDATE, outside the "
        "scoring writer, so no outbox event is written: downstream never hears of it. "
        "After grace_ms the completion check counts it."
    )
    look_at = (
        "/health: completion_outbox:classification stalled, 'missing_count 1 > "
        "max_missing_count 0'; completion_outbox:missing_count."
    )
    recovery = (
        "the same completion is replayed through the scoring writer (complete_job with the "
        "job's fencing token and result): the writer finds the job already completed with "
        "that result and enqueues only the missing event; completion_outbox returns to "
        "within_bounds."
    )
    job: tuple[str, int] | None = None

    def result_ref(self) -> str:
        assert self.job is not None
        return f"result-{self.job[0]}"

    async def start(self, context: StoryContext) -> None:
        """Claim a job and complete it by plain SQL."""
        conn = await connect(context.database_url)
        try:
            self.job = await context.claim_job(conn, LEGACY_LEASE_MS)
            job_ref, token = self.job
            await conn.execute(_LEGACY_COMPLETE, job_ref, self.result_ref(), token)
        finally:
            await conn.close()
        say("  a job was completed by plain SQL; it has no outbox event.")

    async def recover(self, context: StoryContext) -> None:
        """Replay the completion through the writer."""
        assert self.job is not None
        job_ref, token = self.job
        conn = await connect(context.database_url)
        try:
            outcome = await complete_job(
                conn,
                job_ref=job_ref,
                fencing_token=token,
                result_ref=self.result_ref(),
                payload={"score": 0.5},
                event=context.event,
            )
        finally:
            await conn.close()
        say(
            f"  the writer answered {outcome.completion.value} and "
            f"{outcome.enqueue.value} the event."
        )


# -- story 3 -----------------------------------------------------------------------------------
@dataclass
class PoisonEvent:
    """An event its topic cannot take: quarantined, its key held, the rest flowing."""

    title = "a poison event: larger than its topic accepts"
    family = Family.OUTBOX
    reason = "quarantined_count"
    happening = (
        f"An application writes ledger events with a plain INSERT. One is {POISON_MEMO_BYTES} "
        f"bytes; the topic accepts {SMALL_MAX_MESSAGE_BYTES} (max.message.bytes). The broker "
        "refuses it on every attempt, so after --max-attempts the relay quarantines it, holds "
        "the later events of its key (order) and keeps publishing every other key."
    )
    look_at = (
        "/health: outbox:classification stalled, 'quarantined_count 1 > max_quarantined_count "
        "0'; outbox:quarantined_count; relay stays within_bounds (held rows are not a relay "
        'stall). /metrics: outbox_relay_failed_events_total{error_class="record_too_large"}.'
    )
    recovery = (
        "fix the cause first (raise the topic's max.message.bytes), then "
        "`outbox-relay redrive --aggregatetype ledger --error-class record_too_large`: the "
        "event and the ones held behind it are published in key order; outbox returns to "
        "within_bounds."
    )
    ids: list[object] = field(default_factory=list)  # key a's events, in write order

    def keys(self, context: StoryContext) -> list[str]:
        return [f"account-{context.run}-{suffix}" for suffix in "abc"]

    def topic(self, context: StoryContext) -> str:
        return context.system.relay.topic_template.replace("{aggregatetype}", LEDGER)

    async def start(self, context: StoryContext) -> None:
        """Make the topic small, then write key a's entries 1-3 (2 is poison) and b, c."""
        await _set_max_message_bytes(context, self.topic(context), SMALL_MAX_MESSAGE_BYTES)
        poisoned, b, c = self.keys(context)
        conn = await connect(context.database_url)
        try:
            for entry in (1, 2, 3):
                memo = "x" * POISON_MEMO_BYTES if entry == 2 else "ok"
                self.ids.append(await _ledger_event(conn, poisoned, entry, memo))
                await _ledger_event(conn, b, entry, "ok")
                await _ledger_event(conn, c, entry, "ok")
        finally:
            await conn.close()
        say(f"  key a: entries 1-3, entry 2 is {POISON_MEMO_BYTES} bytes; keys b, c: 1-3.")

    async def on_show(self, context: StoryContext) -> None:
        """One more entry per key: a's is held, b's and c's are published."""
        poisoned, b, c = self.keys(context)
        conn = await connect(context.database_url)
        try:
            self.ids.append(await _ledger_event(conn, poisoned, 4, "ok"))
            await _ledger_event(conn, b, 4, "ok")
            await _ledger_event(conn, c, 4, "ok")
            with anyio.move_on_after(30):
                while True:
                    rows = await conn.fetch(_LEDGER_KEYS, LEDGER, [b, c])
                    if all(row[3] >= 4 for row in rows):
                        break
                    await anyio.sleep(0.5)
            rows = await conn.fetch(_LEDGER_KEYS, LEDGER, self.keys(context))
        finally:
            await conn.close()
        for suffix, (_key, quarantined, held, published) in zip("abc", rows, strict=True):
            say(
                f"  key {suffix}: {published} published, {quarantined} quarantined, "
                f"{held} pending behind it"
                if quarantined
                else f"  key {suffix}: {published} published, {held} pending"
            )

    async def recover(self, context: StoryContext) -> None:
        """Raise the topic's limit, then redrive with the real command."""
        topic = self.topic(context)
        await _set_max_message_bytes(context, topic, FIXED_MAX_MESSAGE_BYTES)
        say(f"  the topic's max.message.bytes is now {FIXED_MAX_MESSAGE_BYTES}.")
        command = ["redrive", "--aggregatetype", LEDGER, "--error-class", "record_too_large"]
        say(f"  $ outbox-relay {' '.join(command)}")
        env = dict(os.environ)
        if context.database_url:
            env["DATABASE_URL"] = context.database_url  # never on a command line
        done = await anyio.run_process(
            [sys.executable, "-m", "outbox_relay", *command], env=env, check=False
        )
        for line in done.stdout.decode(errors="replace").splitlines():
            say(f"    {line}")
        if done.returncode != 0:
            say(f"  redrive exited {done.returncode}")

    async def after(self, context: StoryContext) -> None:
        """Show where key a's entries landed: one partition, offsets in write order."""
        conn = await connect(context.database_url)
        try:
            with anyio.move_on_after(60):
                while True:
                    landed = await conn.fetch(_LANDED, self.ids)
                    if all(row[2] is not None for row in landed):
                        break
                    await anyio.sleep(0.5)
        finally:
            await conn.close()
        placed = [(row[0], row[1], row[2]) for row in landed]
        if any(offset is None for _, _, offset in placed):
            say("  key a: not every entry is published yet")
            return
        offsets = [offset for _, _, offset in placed]
        in_order = offsets == sorted(offsets) and len({p for _, p, _ in placed}) == 1
        say(
            f"  key a: entries 1-4 on partition {placed[0][1]} at offsets "
            f"{', '.join(map(str, offsets))}: "
            + ("in write order." if in_order else "NOT in write order.")
        )


async def _ledger_event(conn: asyncpg.Connection, key: str, entry: int, memo: str) -> object:
    payload = json.dumps({"account": key, "entry": entry, "memo": memo})
    return await conn.fetchval(_INSERT_LEDGER_EVENT, LEDGER, key, LEDGER_EVENT_TYPE, payload)


async def _set_max_message_bytes(context: StoryContext, topic: str, limit: int) -> None:
    """Create the topic with this limit, or set it on the existing topic (admin API)."""
    config = context.system.relay
    admin = AIOKafkaAdminClient(
        bootstrap_servers=config.kafka_bootstrap,
        client_id="outbox-relay-demo",
        request_timeout_ms=config.send_timeout_ms,
        **config.kafka_security.client_options(),
    )
    await admin.start()
    try:
        settings = {"max.message.bytes": str(limit)}
        # An existing topic answers TOPIC_ALREADY_EXISTS here; the alter below sets it.
        await admin.create_topics([NewTopic(topic, LEDGER_PARTITIONS, 1, topic_configs=settings)])
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, settings)])
    finally:
        await admin.close()


STORIES: tuple[Callable[[], Story], ...] = (DeadWorker, LegacyCompletion, PoisonEvent)


# -- staging -----------------------------------------------------------------------------------
def _result(report: HealthReport, family: Family) -> FamilyResult | None:
    return next((r for r in report.families if r.family is family), None)


async def _await_report(
    context: StoryContext, wanted: Callable[[HealthReport], bool], timeout_s: float
) -> HealthReport | None:
    """The first report that is ``wanted``, or None after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while True:
            report = await context.system.health.next_report()
            if wanted(report):
                return report
    return None


def _stalled_for(family: Family, reason: str) -> Callable[[HealthReport], bool]:
    def wanted(report: HealthReport) -> bool:
        result = _result(report, family)
        return (
            result is not None
            and result.classification is Classification.STALLED
            and any(reason in text for text in result.reasons)
        )

    return wanted


def _within_bounds(family: Family) -> Callable[[HealthReport], bool]:
    def wanted(report: HealthReport) -> bool:
        result = _result(report, family)
        return result is not None and result.classification is Classification.WITHIN_BOUNDS

    return wanted


def _all_within_bounds(report: HealthReport) -> bool:
    return report.classification is Classification.WITHIN_BOUNDS


async def stage(
    context: StoryContext, stories: Sequence[Callable[[], Story]], *, warm_up_s: float
) -> None:
    """Wait for a healthy system, then stage each story in turn and recover it."""
    say("\nThe steady workload is running; waiting until every family is within bounds.")
    if await _await_report(context, _all_within_bounds, warm_up_s) is None:
        say("Not every family is within bounds yet; staging the stories anyway.")
    for number, make in enumerate(stories, 1):
        await _tell(context, number, len(stories), make())


async def _tell(context: StoryContext, number: int, of: int, story: Story) -> None:
    """One story: announce, stage, watch it stall, hold, recover, watch it recover."""
    family = story.family.value
    say(f"\n=== Story {number}/{of}: {story.title} ===")
    say(f"What happens: {story.happening}")
    say(f"Look at:      {story.look_at}")
    say(f"Recovery:     {story.recovery}")
    log.info("demo story staged", extra={"story": number, "family": family})
    await story.start(context)
    recovered = False
    try:
        report = await _await_report(
            context, _stalled_for(story.family, story.reason), STALL_TIMEOUT_S
        )
        result = None if report is None else _result(report, story.family)
        if result is None:
            say(f"  /health did not show {family} stalled within {STALL_TIMEOUT_S:.0f} s.")
        else:
            say(f"  /health: {family} is stalled: {'; '.join(result.reasons)}")
            log.info("demo story on show", extra={"story": number, "family": family})
        await story.on_show(context)
        await anyio.sleep(context.hold_s)
        say("Recovering:")
        await story.recover(context)
        recovered = True
    finally:
        if not recovered:
            # Stopped mid-story (Ctrl-C): recover first, so the next run starts clean
            # instead of with an expired lease, a missing event or a small topic.
            with anyio.CancelScope(shield=True), anyio.move_on_after(STOP_RECOVERY_S):
                say("Stopping mid-story: recovering it first.")
                await story.recover(context)
    if await _await_report(context, _within_bounds(story.family), RECOVERY_TIMEOUT_S):
        say(f"  /health: {family} is within_bounds again.")
        log.info("demo story recovered", extra={"story": number, "family": family})
    else:
        say(f"  /health did not show {family} within_bounds in {RECOVERY_TIMEOUT_S:.0f} s.")
    await story.after(context)
    await anyio.sleep(min(context.hold_s, PAUSE_BETWEEN_STORIES_S))


# -- the end -----------------------------------------------------------------------------------
async def farewell(database_url: str | None, system: DemoSystem, stop: anyio.Event) -> None:
    """When the demo stops: say which services are still running and how to stop them."""
    await stop.wait()
    with anyio.CancelScope(shield=True), anyio.move_on_after(5):
        running = []
        if await _postgres_answers(database_url):
            running.append("PostgreSQL")
        if await _kafka_answers(system.relay.kafka_bootstrap):
            running.append("Kafka")
        if running:
            say(
                "\nThe demo stopped its relay, sidecar and workload. Still running: "
                f"{' and '.join(running)} (services the demo uses, not ones it started): "
                "`make services-down` stops them; the next `make demo` uses them again."
            )
        else:
            say("\nThe demo stopped; no database or broker it used is still answering.")


async def _postgres_answers(database_url: str | None) -> bool:
    with anyio.move_on_after(2):
        try:
            conn = await connect(database_url, timeout=2)
        except DatabaseUnavailable:
            return False
        await conn.close()
        return True
    return False


async def _kafka_answers(bootstrap: str) -> bool:
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not port.isdigit():
        return False
    with anyio.move_on_after(2):
        try:
            stream = await anyio.connect_tcp(host.strip("[]"), int(port))
        except OSError:
            return False
        with contextlib.suppress(OSError):
            await stream.aclose()
        return True
    return False
