"""A rolling upgrade under load, both ways, from the previous release (release/previous.toml,
checked out with ``git worktree``) to this checkout.

The previous release runs as deploy/ runs it (two relays ``run --relay-only``, one sidecar
``run --no-relay``) with writers committing events steadily, each insert's latency
measured. Then either ``migrate`` with the new code and the new processes started, or the
new processes started first and ``migrate`` after them (the schema gate must make that
safe: not ready, no lane claimed, nothing fetched, then publishing once migrated). Then the
old processes are stopped. Read back from the broker: nothing lost, each key's order kept;
every writer's largest insert latency at most 1 s; no family ``stalled`` unless a value is
over its bound, and none ``within_bounds`` from a sidecar whose schema is behind.

Between the two releases lies at least one migration the new code reads: this checkout's
own when it ships one, else one planted for the test (tests/support/release.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.kafka import read_topic
from tests.support.migration_rules import violations
from tests.support.order import Writer, assert_per_key_order
from tests.support.processes import FAST_RELAY
from tests.support.release import (
    NextRelease,
    code_at,
    migrations_of,
    next_release,
    previous_release,
    worktree,
)
from tests.support.running import Code, Running, run_verb, running
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

MAX_INSERT_LATENCY_S = 1.0
WRITERS = 2
KEYS_PER_WRITER = 40
WRITE_EVERY_S = 0.01  # each writer: about 100 events/s while the upgrade runs
AGGREGATE = "upgrade"

# Realistic bounds: a relay hand-over may leave lanes unowned for a moment (that is over
# its bound, and allowed); nothing may be stalled on evidence within its bounds.
POLICY = """
[outbox]
max_pending_count = 100000
max_pending_age_ms = 30000
max_quarantined_count = 0
gates_readiness = true

[scoring_jobs]
max_active_job_count = 1000
max_active_job_age_ms = 600000
max_quarantined_job_count = 0
max_expired_lease_count = 0
gates_readiness = true

[completion_outbox]
grace_ms = 30000
lookback_ms = 86400000
max_missing_count = 0
gates_readiness = true

[relay]
max_heartbeat_age_ms = 10000
max_unowned_lane_count = 0
max_publish_stall_ms = 10000
max_blocking_transaction_age_ms = 60000
gates_readiness = false

[evaluation]
interval_ms = 500
timeout_ms = 2000
max_evidence_age_ms = 5000
"""
_BOUNDS = dict(re.findall(r"^(max_\w+) = (\d+)$", POLICY, re.M))
# "<what> <value>[ ms] > <bound name> <bound>[ ms]", as every stalled reason reads.
_OVER = re.compile(r".* (?P<value>-?\d+)(?: ms)? > (?P<bound>max_\w+) (?P<limit>\d+)(?: ms)?")

_LEVEL = "SELECT coalesce(max(version), 0) FROM outbox_relay_migration"


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The previous release's code, checked out beside this checkout."""
    with worktree(previous_release().commit, tmp_path_factory.mktemp("previous") / "tree") as tree:
        yield tree


@dataclass
class Writers:
    """Writers committing events on keys of their own, each insert timed."""

    conns: list[asyncpg.Connection]
    namespace: str
    writers: list[Writer] = field(default_factory=list)
    latencies: list[list[float]] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        self.writers = [Writer(conn, self.namespace) for conn in self.conns]
        await self.writers[0].prepare()
        self.latencies = [[] for _ in self.writers]
        await asyncio.gather(*(self._write(n) for n in range(len(self.writers))))

    async def _write(self, n: int) -> None:
        writer, latencies = self.writers[n], self.latencies[n]
        i = 0
        while not self.stop.is_set():
            key = f"w{n}-key-{i % KEYS_PER_WRITER}"
            started = time.perf_counter()
            await writer.commit((AGGREGATE, key))
            latencies.append(time.perf_counter() - started)
            i += 1
            await asyncio.sleep(WRITE_EVERY_S)

    def committed(self) -> dict[str, int]:
        return {k: v for writer in self.writers for k, v in writer.committed.items()}


@dataclass
class Seen:
    """One /health document of a sidecar, with the migration level read after it."""

    sidecar: str
    needs: int
    level_after: int
    document: dict[str, Any]


@dataclass
class HealthWatch:
    """Reads every running sidecar's /health twice a second for the whole upgrade."""

    admin: asyncpg.Connection
    sidecars: dict[str, tuple[Running, int]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            for name, (sidecar, needs) in list(self.sidecars.items()):
                document = await sidecar.health()
                if document is None:
                    continue
                # Read after the document: it was evaluated no later than this.
                level = await self.admin.fetchval(_LEVEL)
                self.seen.append(Seen(name, needs, level, document))
            await asyncio.sleep(0.5)

    def problems(self) -> list[str]:
        found = []
        for seen in self.seen:
            for key, (check,) in seen.document.get("checks", {}).items():
                if not key.endswith(":classification"):
                    continue
                family, classification = key.partition(":")[0], check["observedValue"]
                if classification == "within_bounds" and seen.level_after < seen.needs:
                    found.append(
                        f"{seen.sidecar}: {family} within_bounds on a schema at "
                        f"{seen.level_after:04d} < {seen.needs:04d}"
                    )
                if classification == "stalled":
                    found.extend(
                        f"{seen.sidecar}: {family} stalled for {reason!r}"
                        for reason in check["reasons"]
                        if not _over_its_bound(reason)
                    )
        return found


def _over_its_bound(reason: str) -> bool:
    """Whether a stalled reason names a value strictly over its bound in the policy."""
    found = _OVER.fullmatch(reason)
    return (
        found is not None
        and _BOUNDS.get(found["bound"]) == found["limit"]
        and int(found["value"]) > int(found["limit"])
    )


@contextlib.asynccontextmanager
async def _watched(watch: HealthWatch) -> AsyncIterator[None]:
    task = asyncio.create_task(watch.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _status(process: Running, path: str, expected: int) -> bool:
    return await process.status(path) == expected


async def _all_ready(processes: list[Running]) -> bool:
    return all([await _status(p, "/readyz", 200) for p in processes])


@dataclass
class Upgrade:
    """The processes of one upgrade, started the way deploy/ starts them."""

    url: str
    bootstrap: str
    namespace: str
    directory: Path
    stack: AsyncExitStack

    def _relay_env(self, instance: str) -> dict[str, str]:
        return {
            **FAST_RELAY,
            "DATABASE_URL": self.url,
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
            "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{self.namespace}.{{aggregatetype}}",
            "OUTBOX_RELAY_INSTANCE_ID": instance,
        }

    def _sidecar_env(self) -> dict[str, str]:
        policy = self.directory / "policy.toml"
        policy.write_text(POLICY)
        return {
            "DATABASE_URL": self.url,
            "OUTBOX_RELAY_POLICY": str(policy),
            "OUTBOX_RELAY_RECEIPT_RETENTION_MS": "604800000",
        }

    async def start(self, release: str, code: Code) -> tuple[Running, list[Running]]:
        """A sidecar and two relays of ``code``."""
        sidecar = await self.stack.enter_async_context(
            running(
                f"{release}-sidecar",
                ["run", "--no-relay"],
                self._sidecar_env(),
                self.directory,
                code,
            )
        )
        relays = [
            await self.stack.enter_async_context(
                running(
                    f"{release}-relay-{i}",
                    ["run", "--relay-only"],
                    self._relay_env(f"{release}-relay-{i}"),
                    self.directory,
                    code,
                )
            )
            for i in range(2)
        ]
        return sidecar, relays


async def _migrate(url: str, code: Code) -> None:
    exit_code, output = await run_verb(["migrate"], {"DATABASE_URL": url}, code)
    assert exit_code == 0, output


@pytest.mark.parametrize("new_first", [False, True], ids=["migrate-first", "new-processes-first"])
async def test_a_rolling_upgrade_under_load_loses_nothing_and_keeps_each_keys_order(
    new_first: bool,
    previous_tree: Path,
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> None:
    url = empty_database_url
    previous = code_at(previous_tree, "previous release")
    new = next_release(migrations_of(previous_tree), tmp_path)
    if new.planted is not None:
        assert violations(new.planted) == []
    await _migrate(url, previous)  # the previous release, installed
    admin = await asyncpg.connect(url)
    conns = [await asyncpg.connect(url) for _ in range(WRITERS)]
    writers = Writers(conns, topic_namespace)
    # A connection of its own: it reads while the test's flow uses `admin`.
    watch = HealthWatch(await asyncpg.connect(url))
    try:
        before = await admin.fetchval(_LEVEL)
        assert before < new.relay_level, "no migration between the releases that the new code reads"
        async with AsyncExitStack() as stack:
            upgrade = Upgrade(url, kafka_bootstrap, topic_namespace, tmp_path, stack)
            old_sidecar, old_relays = await upgrade.start("old", previous)
            await wait_until(
                lambda: _all_ready([old_sidecar, *old_relays]),
                what="the previous release ready",
                timeout=60,
            )
            # The upgrade starts from a previous release at work: its sidecar sees its relays.
            await wait_until(lambda: _relays_seen(old_sidecar), what="the relays seen", timeout=30)
            watch.sidecars["old-sidecar"] = (old_sidecar, 0)
            writing = asyncio.create_task(writers.run())
            async with _watched(watch):
                await asyncio.sleep(2)
                if new_first:
                    new_sidecar, new_relays = await upgrade.start("new", new.code)
                    watch.sidecars["new-sidecar"] = (new_sidecar, new.sidecar_level)
                    await _waits_for_its_schema(admin, before, new, new_sidecar, new_relays)
                    await _migrate(url, new.code)
                else:
                    await _migrate(url, new.code)
                    new_sidecar, new_relays = await upgrade.start("new", new.code)
                    watch.sidecars["new-sidecar"] = (new_sidecar, new.sidecar_level)
                await wait_until(
                    lambda: _all_ready([new_sidecar, *new_relays]),
                    what="the new release ready",
                    timeout=60,
                )
                await _publishing(admin, [f"new-relay-{i}" for i in range(2)])
                for old in old_relays:
                    assert await old.stop() == 0, old.name
                del watch.sidecars["old-sidecar"]
                assert await old_sidecar.stop() == 0
                await asyncio.sleep(2)  # the new release alone, under load
                writers.stop.set()
                await writing
                await wait_until(lambda: _drained(admin), what="every event published", timeout=60)
                await asyncio.sleep(1)  # the sidecar's view of the drained outbox
            for process in [new_sidecar, *new_relays]:
                assert not process.logged("fetch failed"), process.name
        after = await admin.fetchval(_LEVEL)
    finally:
        writers.stop.set()
        for conn in [admin, watch.admin, *conns]:
            await conn.close()

    committed = writers.committed()
    events = sum(committed.values())
    records = await read_topic(kafka_bootstrap, f"{topic_namespace}.{AGGREGATE}")
    assert_per_key_order(records, committed)  # nothing lost, every key in commit order
    largest = [max(latencies) for latencies in writers.latencies]
    # The figures the note quotes (pytest -s shows them).
    print(
        f"upgrade {'new processes first' if new_first else 'migrate first'}: "
        f"{events} events committed, {len(records)} records read, migrations "
        f"{before:04d} -> {after:04d}{' (planted)' if new.planted else ''}, largest insert "
        f"latency per writer {', '.join(f'{s * 1000:.0f} ms' for s in largest)}"
    )
    assert after >= new.relay_level
    assert all(s <= MAX_INSERT_LATENCY_S for s in largest), largest
    assert watch.problems() == []
    assert {s.sidecar for s in watch.seen} == {"old-sidecar", "new-sidecar"}


async def _waits_for_its_schema(
    admin: asyncpg.Connection,
    level: int,
    new: NextRelease,
    sidecar: Running,
    relays: list[Running],
) -> None:
    """The new processes on the old schema: live, the relays not ready, no lane claimed,
    nothing fetched; the sidecar, if its probes read a newer migration too, not ready and
    its families unknown with reason schema_behind."""
    await wait_until(lambda: _all_live([sidecar, *relays]), what="the new release live", timeout=30)
    await asyncio.sleep(3)  # several polls of the schema and lease rounds
    for relay in relays:
        reply = await relay.get("/readyz")
        assert reply is not None and reply.status == 503, relay.name
        # "lacks migration 0009" or "lacks migrations 0009, 0010": the first one missing
        assert re.search(rf"lacks migrations? {level + 1:04d}\b", reply.text), reply.text
    names = [r.name for r in relays]
    assert (
        await admin.fetchval(
            "SELECT count(*) FROM relay_instance WHERE instance_id = ANY($1)", names
        )
        == 0
    )
    assert (
        await admin.fetchval("SELECT count(*) FROM relay_lane WHERE owner_id = ANY($1)", names) == 0
    )
    if level >= new.sidecar_level:
        return
    assert await sidecar.status("/readyz") == 503
    document = await sidecar.health()
    assert document is not None and document["status"] == "fail"
    for key, (check,) in document["checks"].items():
        if key.endswith(":classification"):
            assert check["observedValue"] == "unknown", (key, check)
            assert check["reasons"][0] == "schema_behind", (key, check)


async def _relays_seen(sidecar: Running) -> bool:
    document = await sidecar.health()
    checks = (document or {}).get("checks", {}).get("relay:classification")
    return bool(checks) and checks[0]["observedValue"] == "within_bounds"


async def _all_live(processes: list[Running]) -> bool:
    return all([await _status(p, "/livez", 200) for p in processes])


async def _publishing(admin: asyncpg.Connection, instances: list[str]) -> None:
    async def each_published() -> bool:
        rows = await admin.fetch(
            "SELECT instance_id FROM relay_instance WHERE instance_id = ANY($1) "
            "AND published_total > 0",
            instances,
        )
        return len(rows) == len(instances)

    await wait_until(each_published, what="every new relay publishing", timeout=60)


async def _drained(admin: asyncpg.Connection) -> bool:
    return await admin.fetchval("SELECT count(*) FROM outbox") == 0
