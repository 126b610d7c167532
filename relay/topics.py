"""What the relay knows of each topic: its partitions, whether the broker lacks it, and the
largest record batch it accepts.

A missing topic must cost only its own rows. aiokafka's ``partitions_for`` waits up to the
request timeout for a topic it does not know, and the publisher would wait once per row of
such a topic on every pass: every other key behind them stalled. Here a lookup runs on its
own task. A submission waits for a topic's *first* lookup at most :data:`FIRST_LOOKUP_WAIT_S`
(a known topic answers in one metadata round trip); past that its rows fail as
``topic_lookup`` (retriable, no attempt spent) while the lookup goes on. A lookup that saw
the broker answer without the topic for a whole send timeout leaves a *negative entry*:
rows for that topic then fail at once as ``unknown_topic``, which spends an attempt, so they
are quarantined after ``--max-attempts`` like any permanent failure. While the entry exists
a single metadata round re-checks it every :data:`MISSING_RECHECK_S` in the background, so
a topic created later is found again.

Writers choose topics, so everything kept per topic is bounded, each on its own:

- the topics tracked (:data:`MAX_TRACKED_TOPICS`): the one the relay has not asked for
  longest is forgotten (its partitions, limit, and the producer's metadata for it) when a
  new one would pass the bound;
- the negative entries (:data:`MAX_MISSING_TOPICS`, each trusted for
  :data:`MISSING_TTL_S` after the broker last answered without the topic), apart from the
  tracked topics: rows spread over more missing topics than are tracked still end as
  ``unknown_topic``, instead of losing their entry to the other topics' rows and coming
  back as ``topic_lookup`` for ever;
- the lookups running at once (:data:`MAX_LOOKUPS`): a lookup runs to its end even when its
  topic is forgotten meanwhile (else a rotation over many topics would cancel every one of
  them before it could answer), and a topic beyond the bound waits as ``topic_lookup``
  for a free one.

The batch limit: a partition batch larger than the topic's ``max.message.bytes`` is refused
whole. Each topic's limit is read with describe-configs (the relay needs DescribeConfigs on
its topics), cached, refreshed every :data:`LIMIT_REFRESH_S` and at once when the broker
refuses a batch as too large; until it is known, and when it cannot be read, batches are at
most :data:`MAX_BATCH_BYTES` and a refusal halves the topic's batch size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as kafka_errors
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from relay.config import RelayConfig
from relay.errors import TopicLookupPending, TopicNotFound

log = logging.getLogger(__name__)

# The relay's own cap on a partition batch: large enough to amortise a request, small
# enough that one slow batch holds little.
MAX_BATCH_BYTES = 256 * 1024
# The smallest batch size a refusal may halve a topic's down to.
_MIN_BATCH_BYTES = 1024
FIRST_LOOKUP_WAIT_S = 1.0
MISSING_RECHECK_S = 2.0
LIMIT_REFRESH_S = 60.0
_METADATA_ROUND_S = 0.2
# Topics the catalog (and the producer's metadata requests) keep at once.
MAX_TRACKED_TOPICS = 1_000
# Negative entries kept at once, and how long one stands without the broker confirming it.
MAX_MISSING_TOPICS = 10_000
MISSING_TTL_S = 600.0
# Lookups running at once; their topics are in the producer's metadata requests too.
MAX_LOOKUPS = 1_000
_MAX_MESSAGE_BYTES = "max.message.bytes"

TopicAnswer = list[int] | BaseException


class _Limit:
    """A topic's ``max.message.bytes`` (None: not known) and when it was last read."""

    __slots__ = ("batch_bytes", "max_message_bytes", "read_at")

    def __init__(self) -> None:
        self.max_message_bytes: int | None = None
        self.batch_bytes = MAX_BATCH_BYTES
        self.read_at = float("-inf")


class TopicCatalog:
    """Partitions, negative entries and batch limits per topic, looked up off the send path."""

    def __init__(self, config: RelayConfig) -> None:
        self._config = config
        self._client: Any = None
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._admin_lock = asyncio.Lock()
        # topic -> when the broker was last seen without it, the oldest first
        self._missing: OrderedDict[str, float] = OrderedDict()
        self._lookups: dict[str, asyncio.Task[BaseException | None]] = {}
        self._describing: dict[str, asyncio.Task[None]] = {}
        self._limits: dict[str, _Limit] = {}
        self._sorted: dict[tuple[str, frozenset[int]], list[int]] = {}
        self._used: OrderedDict[str, None] = OrderedDict()  # least recently resolved first

    def attach(self, producer: AIOKafkaProducer) -> None:
        """Look topics up through this producer's metadata from now on (a new producer)."""
        self._cancel(self._lookups)
        self._producer = producer
        self._client = producer.client

    # -- partitions ------------------------------------------------------------------------
    async def resolve(self, topics: Collection[str]) -> dict[str, TopicAnswer]:
        """Each topic's sorted partitions, or why its rows cannot be sent now."""
        answers: dict[str, TopicAnswer] = {}
        started: list[str] = []
        now = time.monotonic()
        self._track(topics)
        for topic in topics:
            partitions = self._known(topic)
            if partitions is not None:
                answers[topic] = partitions
                if self._limit_due(topic, now):
                    started.append(topic)  # wait for a first read of its limit, briefly
                continue
            missing_since = self._missing_since(topic, now)
            if (
                topic not in self._lookups
                and len(self._lookups) < MAX_LOOKUPS
                and (missing_since is None or now - missing_since >= MISSING_RECHECK_S)
            ):
                self._look_up(topic, recheck=missing_since is not None)
                if missing_since is None:
                    started.append(topic)
        waits = [self._lookups.get(t) or self._describing.get(t) for t in started]
        pending = [task for task in waits if task is not None and not task.done()]
        if pending:
            wait_s = min(FIRST_LOOKUP_WAIT_S, self._config.send_timeout_ms / 1000)
            await asyncio.wait(pending, timeout=wait_s)
        for topic in topics:
            if topic not in answers:
                answers[topic] = self._answer(topic)
        return answers

    @property
    def tracked(self) -> int:
        """How many topics the catalog keeps."""
        return len(self._used)

    @property
    def missing(self) -> int:
        """How many negative entries the catalog keeps."""
        return len(self._missing)

    def _missing_since(self, topic: str, now: float) -> float | None:
        """When the broker was last seen without ``topic``; None when it never was, or so
        long ago that the entry no longer stands."""
        since = self._missing.get(topic)
        if since is not None and now - since > MISSING_TTL_S:
            del self._missing[topic]
            return None
        return since

    def _note_missing(self, topic: str) -> None:
        if topic not in self._missing:
            log.warning("topic does not exist", extra={"topic": topic})
        self._missing[topic] = time.monotonic()
        self._missing.move_to_end(topic)
        while len(self._missing) > MAX_MISSING_TOPICS:
            self._missing.popitem(last=False)

    def _track(self, topics: Collection[str]) -> None:
        """Mark these topics used now; forget the least recently used beyond the bound."""
        for topic in topics:
            self._used[topic] = None
            self._used.move_to_end(topic)
        forgotten = []
        while len(self._used) > max(MAX_TRACKED_TOPICS, len(topics)):
            topic, _ = self._used.popitem(last=False)
            forgotten.append(topic)
            self._limits.pop(topic, None)
            reading = self._describing.pop(topic, None)
            if reading is not None:
                reading.cancel()
            # A running lookup goes on (its answer is the negative entry, kept apart); a
            # finished one's failure is for nobody now.
            lookup = self._lookups.get(topic)
            if lookup is not None and lookup.done():
                del self._lookups[topic]
        if forgotten:
            gone = set(forgotten)
            self._sorted = {key: value for key, value in self._sorted.items() if key[0] not in gone}
            if self._client is not None:
                # The producer asks the broker for metadata of every topic it knows: the
                # tracked ones, and those still being looked up.
                self._client.set_topics(
                    [*self._used, *(t for t in self._lookups if t not in self._used)]
                )

    def _known(self, topic: str) -> list[int] | None:
        partitions = self._client.cluster.partitions_for_topic(topic)
        if not partitions:
            return None
        self._missing.pop(topic, None)
        key = (topic, frozenset(partitions))
        ordered = self._sorted.get(key)
        if ordered is None:
            if len(self._sorted) > 10_000:
                self._sorted.clear()
            ordered = self._sorted[key] = sorted(partitions)
        return ordered

    def _answer(self, topic: str) -> TopicAnswer:
        partitions = self._known(topic)
        if partitions is not None:
            return partitions
        if topic in self._missing:
            return TopicNotFound(topic)
        lookup = self._lookups.get(topic)
        if lookup is not None and lookup.done():
            del self._lookups[topic]
            failure = lookup.result()
            if failure is not None:
                return failure
        return TopicLookupPending(topic)

    def _look_up(self, topic: str, *, recheck: bool) -> None:
        task = asyncio.ensure_future(self._metadata_for(topic, recheck=recheck))
        self._lookups[topic] = task
        task.add_done_callback(lambda done: self._lookup_done(topic, done, recheck=recheck))

    def _lookup_done(
        self, topic: str, task: asyncio.Task[BaseException | None], *, recheck: bool
    ) -> None:
        # A first lookup's failure stays for the next resolve of its topic to report, while
        # the topic is tracked; anything else is in the caches (a recheck's failure leaves
        # the negative entry as it was).
        if self._lookups.get(topic) is not task:
            return
        reported = (
            not recheck
            and not task.cancelled()
            and task.result() is not None
            and topic in self._used
        )
        if not reported:
            del self._lookups[topic]

    async def _metadata_for(self, topic: str, *, recheck: bool) -> BaseException | None:
        """Ask the broker until it has the topic; a missing topic becomes a negative entry
        once the broker answered without it for a send timeout (one round for a recheck).

        The window runs from the broker's first answer, not from the lookup's start: after
        a stall as long as the window, that first answer is often the one that makes the
        broker create the topic, which it then needs a moment for."""
        client = self._client
        try:
            client.add_topic(topic)
            window_s = 0.0 if recheck else self._config.send_timeout_ms / 1000
            started = time.monotonic()
            first_answer: float | None = None
            while True:
                answered = bool(await client.force_metadata_update())
                now = time.monotonic()
                if answered and first_answer is None:
                    first_answer = now
                if client.cluster.partitions_for_topic(topic):
                    self._missing.pop(topic, None)
                    self._limit_due(topic, time.monotonic())
                    reading = self._describing.get(topic)
                    if reading is not None:
                        await asyncio.wait([reading])  # never cancels the read
                    return None
                if topic in client.cluster.unauthorized_topics:
                    denied: BaseException = kafka_errors.TopicAuthorizationFailedError(topic)
                    return denied
                if first_answer is None:
                    if now - started >= window_s:
                        unreachable: BaseException = kafka_errors.KafkaConnectionError(
                            "no metadata from the broker"
                        )
                        return unreachable
                elif now - first_answer >= window_s:
                    self._note_missing(topic)
                    return None
                await asyncio.sleep(_METADATA_ROUND_S)
        except Exception as exc:  # reported to the submission that asks next
            return exc

    # -- batch limits ----------------------------------------------------------------------
    def batch_bytes(self, topic: str) -> int:
        """The largest partition batch to build for ``topic``."""
        limit = self._limits.get(topic)
        return MAX_BATCH_BYTES if limit is None else limit.batch_bytes

    def refused_as_too_large(self, topic: str, batch_bytes: int) -> None:
        """The broker refused a batch of ``batch_bytes`` as too large: build smaller ones
        at once and read the topic's limit again."""
        limit = self._limits.setdefault(topic, _Limit())
        limit.batch_bytes = max(_MIN_BATCH_BYTES, min(limit.batch_bytes, batch_bytes // 2))
        limit.read_at = float("-inf")
        self._describe(topic)

    def _limit_due(self, topic: str, now: float) -> bool:
        """Start a read of the topic's limit when it was never read or is stale; True
        when it was never read."""
        limit = self._limits.get(topic)
        if limit is not None and now - limit.read_at < LIMIT_REFRESH_S:
            return False
        self._describe(topic)
        return limit is None

    def _describe(self, topic: str) -> None:
        if topic in self._describing:
            return
        task = asyncio.ensure_future(self._read_limit(topic))
        self._describing[topic] = task
        task.add_done_callback(lambda _: self._describing.pop(topic, None))

    async def _read_limit(self, topic: str) -> None:
        limit = self._limits.setdefault(topic, _Limit())
        limit.read_at = time.monotonic()  # also on failure: retried at the next refresh
        try:
            value = await self._describe_max_message_bytes(topic)
        except Exception as exc:  # no DescribeConfigs right, broker away: keep the cap
            log.warning(
                "could not read the topic's max.message.bytes; batches stay at the default cap",
                extra={"topic": topic, "error_class": type(exc).__name__},
            )
            if self._admin is not None:
                admin, self._admin = self._admin, None
                with contextlib.suppress(Exception):
                    await admin.close()
            return
        if value is not None:
            limit.max_message_bytes = value
            limit.batch_bytes = max(_MIN_BATCH_BYTES, min(MAX_BATCH_BYTES, value))

    async def _describe_max_message_bytes(self, topic: str) -> int | None:
        admin = await self._admin_client()
        resource = ConfigResource(ConfigResourceType.TOPIC, topic, {_MAX_MESSAGE_BYTES: None})
        for response in await admin.describe_configs([resource]):
            for error_code, _message, _type, name, entries in response.resources:
                if name != topic:
                    continue
                error = kafka_errors.for_code(error_code)
                if error is not kafka_errors.NoError:
                    raise error()
                for entry in entries:
                    if entry[0] == _MAX_MESSAGE_BYTES and entry[1] is not None:
                        return int(entry[1])
        return None

    async def _admin_client(self) -> AIOKafkaAdminClient:
        # Reads of two topics' limits start together: without the lock each made its own
        # admin client and only the last one was ever closed.
        async with self._admin_lock:
            return await self._open_admin_client()

    async def _open_admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            config = self._config
            admin = AIOKafkaAdminClient(
                bootstrap_servers=config.kafka_bootstrap,
                client_id=f"{config.instance_id}-admin",
                request_timeout_ms=config.send_timeout_ms,
                **config.kafka_security.client_options(),
            )
            try:
                await admin.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await admin.close()
                raise
            self._admin = admin
        return self._admin

    # -- life cycle ------------------------------------------------------------------------
    async def close(self) -> None:
        """Stop every lookup and the admin client."""
        self._cancel(self._lookups)
        self._cancel(self._describing)
        if self._admin is not None:
            admin, self._admin = self._admin, None
            with contextlib.suppress(Exception):
                await admin.close()

    @staticmethod
    def _cancel(tasks: dict[str, Any]) -> None:
        for task in list(tasks.values()):
            task.cancel()
        tasks.clear()
