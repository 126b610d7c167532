"""Per-key order, checked as a consumer sees it: writers that count each key's commits,
and the check of what reached a topic against them.

Commit order comes from the writers, never from the relay: every event carries its
aggregate's version, bumped under the aggregate's row lock in the event's own transaction,
so within one key the versions 1, 2, 3, … are the commit order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncpg
from aiokafka.structs import ConsumerRecord

_INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, 'changed', $3::jsonb)
"""

# The aggregate the events belong to; a test database gets it on first use.
CREATE_AGGREGATE = """
CREATE TABLE IF NOT EXISTS fault_aggregate (id text PRIMARY KEY, version int NOT NULL)
"""

# Bumping the version takes the aggregate's row lock until commit: writers of one key
# serialise here, which is exactly what the relay's per-key order promise assumes.
BUMP_VERSION = """
INSERT INTO fault_aggregate AS a (id, version) VALUES ($1, 1)
ON CONFLICT (id) DO UPDATE SET version = a.version + 1
RETURNING version
"""


class OrderViolation(AssertionError):
    """Per-key order broke: the failure the fault scenarios exist to find."""


@dataclass
class Writer:
    """Commits events under their aggregate's lock and remembers each key's last version."""

    conn: asyncpg.Connection
    namespace: str
    committed: dict[str, int] = field(default_factory=dict)
    topics: dict[str, str] = field(default_factory=dict)  # key -> topic its events go to

    async def prepare(self) -> None:
        await self.conn.execute(CREATE_AGGREGATE)

    async def commit(self, *events: tuple[str, str] | tuple[str, str, int]) -> list[int]:
        """One transaction of events (aggregatetype, key[, padding bytes]); their versions."""
        versions: dict[str, int] = {}
        numbers = []
        async with self.conn.transaction():
            for event in events:
                aggregatetype, key = event[0], event[1]
                padding = event[2] if len(event) > 2 else 0
                version = int(await self.conn.fetchval(BUMP_VERSION, key))
                payload = {"n": version, "pad": "x" * padding}
                await self.conn.execute(_INSERT, aggregatetype, key, json.dumps(payload))
                versions[key] = version
                numbers.append(version)
                self.topics[key] = f"{self.namespace}.{aggregatetype}"
        self.committed.update(versions)
        return numbers

    def committed_on(self, topic: str) -> dict[str, int]:
        """Each key of ``topic`` with its latest committed version."""
        return {k: n for k, n in self.committed.items() if self.topics[k] == topic}


@dataclass(frozen=True)
class Seen:
    """One record of a key as a consumer saw it: the writer's version and the event id."""

    n: int
    id: bytes


def key_histories(records: Iterable[ConsumerRecord[bytes, bytes]]) -> dict[str, list[Seen]]:
    """Each key's records in log order (a key lives in one partition)."""
    histories: dict[str, list[Seen]] = {}
    for record in records:
        assert record.key is not None and record.value is not None
        seen = Seen(json.loads(record.value)["n"], dict(record.headers)["id"])
        histories.setdefault(record.key.decode(), []).append(seen)
    return histories


def order_violations(histories: dict[str, list[Seen]], committed: dict[str, int]) -> list[str]:
    """What breaks the promise, per key: (a) first occurrences (deduplicated by id) not in
    commit order or incomplete; (b) the last record not the latest committed event."""
    problems = []
    for key, latest in sorted(committed.items()):
        seen = histories.get(key, [])
        ids: set[bytes] = set()
        firsts = []
        for record in seen:
            if record.id not in ids:
                ids.add(record.id)
                firsts.append(record.n)
        sequence = [record.n for record in seen]
        if firsts != list(range(1, latest + 1)):
            problems.append(
                f"{key}: first occurrences {firsts}, committed 1..{latest} (topic: {sequence})"
            )
        if not seen or seen[-1].n != latest:
            last = seen[-1].n if seen else None
            problems.append(
                f"{key}: last record is version {last}, latest committed is {latest} "
                f"(topic: {sequence})"
            )
    return problems


def assert_per_key_order(
    records: Iterable[ConsumerRecord[bytes, bytes]], committed: dict[str, int]
) -> dict[str, list[int]]:
    """Raise OrderViolation naming every broken key; return each key's observed versions."""
    histories = key_histories(records)
    problems = order_violations(histories, committed)
    if problems:
        raise OrderViolation("; ".join(problems))
    return {key: [s.n for s in seen] for key, seen in histories.items()}
