"""The soak: the whole system on services of its own, under a seeded fault schedule, then
an audit of Kafka against the writers' ledger and of ``/health`` against the schedule.

``python -m tests.soak.run --seconds 600 [--seed N] [--base-port 25000] [--report docs]``
(``make soak``). The pytest test in ``test_soak.py`` runs the same with two minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from scoring.worker import enqueue_job, expire_leases
from tests.soak.audit import AuditResult, Committed, Record, audit
from tests.soak.health_truth import HealthSample, HealthVerdict, LivezSample, judge
from tests.soak.schedule import MIN_SHARE, WORKER_LEASE_S, Fault, FaultKind, build_schedule
from tests.soak.scoring_worker import DATABASE_ERRORS, EVENT
from tests.soak.services import REPO, Ports, SoakServices
from tests.support.faultproxy import FaultProxy
from tests.support.kafka import create_topics
from tests.support.processes import RelayProcess, Relays

log = logging.getLogger("soak")

NAMESPACE = "soak"
AGGREGATE_TYPES = ("order", "account")
JOB_TOPIC = f"{NAMESPACE}.scoring_job"
TOPICS = (*(f"{NAMESPACE}.{t}" for t in AGGREGATE_TYPES), JOB_TOPIC)
HOT_TABLES = ("outbox", "outbox_receipt", "scoring_job_state", "relay_lane", "relay_instance")

# Bounds a healthy soak stays inside with room, and faults push outside: a broker down
# for 14 s leaves events pending longer than 10 s.
POLICY = """
[outbox]
max_pending_count = 20000
max_pending_age_ms = 10000
max_quarantined_count = 0
gates_readiness = true

[scoring_jobs]
max_active_job_count = 5000
max_active_job_age_ms = 120000
max_quarantined_job_count = 1000000   # permanent failures are part of the workload
max_expired_lease_count = 0
gates_readiness = true

[completion_outbox]
grace_ms = 10000
lookback_ms = 3600000
max_missing_count = 0
gates_readiness = true

[relay]
max_heartbeat_age_ms = 10000
max_unowned_lane_count = 0
max_publish_stall_ms = 10000
max_blocking_transaction_age_ms = 30000
gates_readiness = true

[evaluation]
interval_ms = 1000
timeout_ms = 2000
max_evidence_age_ms = 5000
"""

# The harness's own sessions name themselves, so the terminate fault can tell them apart.
HARNESS_SESSION = {"application_name": "soak-harness"}

CREATE_AGGREGATE = (
    "CREATE TABLE IF NOT EXISTS soak_aggregate (id text PRIMARY KEY, version int NOT NULL)"
)
# The key's counter, under the key's row lock until commit: the commit order of one key.
BUMP = """
INSERT INTO soak_aggregate AS a (id, version) VALUES ($1, 1)
ON CONFLICT (id) DO UPDATE SET version = a.version + 1
RETURNING version
"""
INSERT_EVENT = """
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
VALUES ($1, $2, $3, 'changed', $4::jsonb)
"""
VERSION_OF = "SELECT version FROM soak_aggregate WHERE id = $1"
# The relay's sessions: its pool names itself 'outbox-relay', its LISTEN connection has no
# name. Everything else on the soak database names itself (the harness, the workers, the
# sidecar). The sessions are listed first and terminated in a second statement: within one
# WHERE the planner may call pg_terminate_backend before the name test and end every
# session, this one included.
RELAY_SESSIONS = """
SELECT pid, application_name = '' AS listen FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
  AND application_name IN ('outbox-relay', '')
"""
TERMINATE = "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) AS pid"
LEASED_BY = """
SELECT count(*) FROM scoring_job_state WHERE scoring_state = 'leased' AND active_worker_ref = $1
"""
TERMINAL_JOBS = """
SELECT scoring_job_ref FROM scoring_job_state WHERE scoring_state IN ('completed', 'quarantined')
"""
ACTIVE_JOBS = """
SELECT count(*) FROM scoring_job_state WHERE scoring_state IN ('queued', 'leased', 'retry_scheduled')
"""
DEAD_TUPLES = """
SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = ANY($1::text[])
"""


@dataclass
class SoakConfig:
    seconds: float
    seed: int
    base_port: int = 25000
    relays: int = 3
    workers: int = 3
    writers: int = 6
    keys_per_writer: int = 20
    events_per_second: float = 60.0
    jobs_per_second: float = 4.0
    drain_timeout_s: float = 120.0


@dataclass
class FaultRecord:
    fault: Fault
    started: float | None = None
    ended: float | None = None
    note: str = ""
    failed: bool = False  # it raised while being applied: the run does not count


@dataclass
class SoakResult:
    config: SoakConfig
    commit: str
    faults: list[FaultRecord]
    audit: AuditResult
    health: HealthVerdict
    samples: list[HealthSample]
    publish_per_second: list[tuple[float, int]]
    backlog: list[tuple[float, int | None]]
    peak_rss_kib: dict[str, int]
    dead_tuples: dict[str, tuple[int, int]]
    elapsed_s: float
    drained: bool
    doubtful_commits: int = 0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and the end
    unexpected_exits: list[str] = field(default_factory=list)
    load_s: float | None = None  # seconds of load; more than config.seconds when faults overran
    background_errors: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        """Why the run itself proves too little: a fault that did not happen, a ledger or a
        job table implausibly empty for the configured rates, health barely sampled."""
        c = self.config
        problems = [
            f"fault {i} {r.fault.kind.value} failed to apply: {r.note}"
            for i, r in enumerate(self.faults)
            if r.failed
        ]
        applied = sum(1 for r in self.faults if r.started is not None and not r.failed)
        if applied != len(self.faults):
            problems.append(f"faults applied: {applied} of {len(self.faults)} scheduled")
        events = MIN_SHARE * c.events_per_second * c.seconds
        if self.audit.events < events:
            problems.append(
                f"events committed: {self.audit.events}, fewer than {events:.0f} "
                f"({MIN_SHARE} x {c.events_per_second:g}/s x {c.seconds:.0f} s)"
            )
        jobs = max(1.0, MIN_SHARE * c.jobs_per_second * c.seconds)
        if self.audit.terminal_jobs < jobs:
            problems.append(
                f"terminal scoring jobs: {self.audit.terminal_jobs}, fewer than {jobs:.0f} "
                f"({MIN_SHARE} x {c.jobs_per_second:g}/s x {c.seconds:.0f} s)"
            )
        samples = MIN_SHARE * c.seconds
        if len(self.samples) < samples:
            problems.append(f"/health samples: {len(self.samples)}, fewer than {samples:.0f}")
        problems += self.background_errors
        return problems

    @property
    def passed(self) -> bool:
        return (
            self.audit.passed
            and self.health.passed
            and self.drained
            and not self.unexpected_exits
            and not self.problems
        )


@dataclass
class _Slot:
    """One relay position: its current process and whether it should answer /livez."""

    index: int
    port: int
    bootstrap: str
    process: RelayProcess | None = None
    incarnation: int = 0
    live: bool = False
    live_since: float = 0.0


@dataclass
class _Worker:
    ref: str
    process: subprocess.Popen[bytes]


class Soak:
    """One run; ``await run()`` does everything and returns the result."""

    def __init__(self, config: SoakConfig, work_dir: Path) -> None:
        self.config = config
        self.work = work_dir
        self.ports = Ports(config.base_port)
        self.services = SoakServices(self.ports)
        self.url = self.services.postgres.url("soak")
        self.faults = build_schedule(
            config.seed, config.seconds, relays=config.relays, workers=config.workers
        )
        self.fault_records = [FaultRecord(f) for f in self.faults]
        self.t0 = 0.0
        self.t0_ms = 0
        self.stop_writing = asyncio.Event()
        self.stop_all = asyncio.Event()
        self.reaper_paused = False
        self.ledger_path = work_dir / "ledger.jsonl"
        self.records: dict[tuple[str, int, int], Record] = {}
        self.first_seen: Counter[int] = Counter()
        self.seen_ids: set[str] = set()
        self.samples: list[HealthSample] = []
        self.livez: list[LivezSample] = []
        self.backlog: list[tuple[float, int | None]] = []
        self.peak_rss: dict[str, int] = {}
        self.slots: list[_Slot] = []
        self.workers: list[_Worker] = []
        self.doubtful = 0
        self.load_at_start = 0.0
        self.unexpected_exits: list[str] = []
        self.proxy: FaultProxy | None = None
        self.relays: Relays | None = None
        self.late_s = 0.0  # how far faults that overran pushed the later ones back

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- set-up ---------------------------------------------------------------------------
    async def _prepare_database(self) -> None:
        admin = await asyncpg.connect(self.services.postgres.url())
        try:
            await admin.execute("CREATE DATABASE soak")
        finally:
            await admin.close()
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "outbox_relay", "migrate"],
            env={**os.environ, "DATABASE_URL": self.url},
            check=True,
            capture_output=True,
            timeout=120,
        )
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(CREATE_AGGREGATE)
        finally:
            await conn.close()
        await create_topics(self.services.kafka.bootstrap, TOPICS, partitions=6)

    def _start_relay(self, slot: _Slot) -> None:
        assert self.relays is not None
        slot.incarnation += 1
        slot.process = self.relays.start(
            f"relay{slot.index}-{slot.incarnation}",
            slot.bootstrap,
            HEALTH_LISTEN_ADDR=f"127.0.0.1:{slot.port}",
        )
        slot.live = True
        slot.live_since = self.now()

    def _start_worker(self, index: int) -> _Worker:
        ref = f"worker-{index}-{uuid.uuid4().hex[:6]}"
        log_file = (self.work / f"{ref}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.soak.scoring_worker",
                self.url,
                ref,
                str(int(WORKER_LEASE_S * 1000)),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        log_file.close()
        return _Worker(ref, process)

    # -- workload -------------------------------------------------------------------------
    async def _writer(self, index: int, ledger: Any) -> None:
        rng = random.Random(f"{self.config.seed}-writer-{index}")
        keys = [f"k{index}-{i}" for i in range(self.config.keys_per_writer)]
        pace = self.config.writers / self.config.events_per_second
        conn: asyncpg.Connection | None = None
        while not self.stop_writing.is_set():
            key = rng.choice(keys)
            aggregatetype = AGGREGATE_TYPES[hash(key) % len(AGGREGATE_TYPES)]
            event_id = str(uuid.uuid4())
            version: int | None = None
            try:
                if conn is None:
                    conn = await asyncpg.connect(
                        self.url, timeout=5, server_settings=HARNESS_SESSION
                    )
                async with conn.transaction():
                    version = int(await conn.fetchval(BUMP, key))
                    await conn.execute(
                        INSERT_EVENT, event_id, aggregatetype, key, json.dumps({"n": version})
                    )
            except DATABASE_ERRORS:
                if conn is not None:
                    conn.terminate()
                conn = None
                if version is None:
                    await asyncio.sleep(0.5)
                    continue
                # The commit's fate is unknown: this writer alone writes this key, so the
                # key's counter says whether it happened.
                self.doubtful += 1
                if not await self._committed(key, version):
                    continue
            assert version is not None
            topic = f"{NAMESPACE}.{aggregatetype}"
            ledger.write(
                json.dumps({"id": event_id, "key": key, "n": version, "topic": topic}) + "\n"
            )
            ledger.flush()
            await asyncio.sleep(rng.expovariate(1 / pace))
        if conn is not None:
            await conn.close()

    async def _committed(self, key: str, version: int) -> bool:
        while True:
            try:
                conn = await asyncpg.connect(self.url, timeout=5, server_settings=HARNESS_SESSION)
                try:
                    return await conn.fetchval(VERSION_OF, key) == version
                finally:
                    await conn.close()
            except DATABASE_ERRORS:
                await asyncio.sleep(0.5)

    async def _with_db(self, what: str, fn: Any) -> Any:
        """Run ``fn(conn)`` on a fresh connection; None (logged) when the database is away."""
        try:
            conn = await asyncpg.connect(self.url, timeout=5, server_settings=HARNESS_SESSION)
            try:
                return await fn(conn)
            finally:
                await conn.close()
        except DATABASE_ERRORS as exc:
            log.info("%s: %s: %s", what, type(exc).__name__, exc)
            return None

    async def _enqueuer(self) -> None:
        n = 0
        pending: list[str] = []
        while not self.stop_writing.is_set():
            pending.append(f"job-{n:07d}")
            n += 1

            async def enqueue(conn: asyncpg.Connection) -> bool:
                while pending:
                    await enqueue_job(conn, job_ref=pending[0], request_ref="soak", max_attempts=3)
                    pending.pop(0)
                return True

            await self._with_db("enqueue", enqueue)
            await asyncio.sleep(1 / self.config.jobs_per_second)

    async def _reaper(self) -> None:
        while not self.stop_all.is_set():
            await asyncio.sleep(2.0)
            if not self.reaper_paused:
                await self._with_db("reaper", lambda c: expire_leases(c, limit=500, event=EVENT))

    async def _consumer(self) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.services.kafka.bootstrap,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            partitions = [TopicPartition(t, p) for t in TOPICS for p in range(6)]
            consumer.assign(partitions)
            await consumer.seek_to_beginning(*partitions)
            while not self.stop_all.is_set():
                try:
                    batches = await consumer.getmany(timeout_ms=500)
                except Exception as exc:  # the broker restarts under it: read on
                    log.debug("consumer: %s", type(exc).__name__)
                    await asyncio.sleep(1)
                    continue
                for chunk in batches.values():
                    for r in chunk:
                        self._keep(r)
        finally:
            await consumer.stop()

    def _keep(self, r: Any) -> None:
        at = (r.topic, r.partition, r.offset)
        if at in self.records:
            return
        headers = dict(r.headers)
        event_id = headers["id"].decode()
        value = json.loads(r.value) if r.value is not None else None
        n = value.get("n") if isinstance(value, dict) and r.topic != JOB_TOPIC else None
        self.records[at] = Record(
            r.topic, r.partition, r.offset, r.key.decode(), event_id, n, r.timestamp
        )
        if event_id not in self.seen_ids:
            self.seen_ids.add(event_id)
            self.first_seen[int(self.now())] += 1

    async def _caught_up(self) -> bool:
        """Whether the consumer holds every record up to the topics' current ends."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.services.kafka.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(t, p) for t in TOPICS for p in range(6)]
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        held = Counter((r.topic, r.partition) for r in self.records.values())
        return all(held[(tp.topic, tp.partition)] >= end for tp, end in ends.items())

    # -- watching -------------------------------------------------------------------------
    async def _get(self, port: int, path: str) -> tuple[int, bytes] | None:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
            try:
                writer.write(
                    f"GET {path} HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n".encode()
                )
                raw = await asyncio.wait_for(reader.read(), 3)
            finally:
                writer.close()
        except (OSError, TimeoutError):
            return None
        head, _, body = raw.partition(b"\r\n\r\n")
        try:
            return int(head.split()[1]), body
        except (IndexError, ValueError):
            return None

    async def _sampler(self) -> None:
        while not self.stop_all.is_set():
            tick = asyncio.create_task(asyncio.sleep(1.0))
            t = self.now()
            answer = await self._get(self.ports.http(0), "/health")
            families: dict[str, tuple[str, tuple[str, ...]]] | None = None
            pending: int | None = None
            if answer is not None:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    checks = json.loads(answer[1])["checks"]
                    families = {
                        name.split(":")[0]: (c[0]["classification"], tuple(c[0]["reasons"]))
                        for name, c in checks.items()
                        if name.endswith(":classification")
                    }
                    if "outbox:pending_count" in checks:
                        pending = int(checks["outbox:pending_count"][0]["observedValue"])
            self.samples.append(HealthSample(t, families))
            self.backlog.append((t, pending))
            for slot in self.slots:
                if slot.process is None:
                    continue
                code = slot.process.process.poll()
                if slot.live and code is not None:
                    # A relay that ends without being told to is a finding, not a fault.
                    slot.live = False
                    self.unexpected_exits.append(
                        f"relay{slot.index}-{slot.incarnation} exited by itself with code "
                        f"{code} at {t:.0f}s"
                    )
                live = await self._get(slot.port, "/livez")
                expected = slot.live and t - slot.live_since > 15
                self.livez.append(
                    LivezSample(
                        t, f"relay{slot.index}", live is not None and live[0] == 200, expected
                    )
                )
            await tick

    def _processes(self) -> dict[str, int]:
        pids = {
            f"relay{s.index}-{s.incarnation}": s.process.process.pid
            for s in self.slots
            if s.process
        }
        pids.update({w.ref.rsplit("-", 1)[0]: w.process.pid for w in self.workers})
        if self.sidecar is not None:
            pids["sidecar"] = self.sidecar.process.pid
        broker = self.services.kafka.pid()
        if broker:
            pids["kafka broker"] = broker
        return pids

    async def _rss(self) -> None:
        while not self.stop_all.is_set():
            for name, pid in self._processes().items():
                peak = _vm_hwm(pid)
                if peak:
                    self.peak_rss[name] = max(self.peak_rss.get(name, 0), peak)
            total = sum(_vm_rss(pid) for pid in self.services.postgres.pids())
            self.peak_rss["postgres (all processes)"] = max(
                self.peak_rss.get("postgres (all processes)", 0), total
            )
            await asyncio.sleep(2.0)

    # -- faults ---------------------------------------------------------------------------
    async def _faults(self) -> None:
        # A fault that overran its window (a broker slow to come back) pushes the later ones
        # back by as much, so each still gets its quiet gap to recover in; the load runs on
        # by as much too (_run), so every scheduled fault happens, under load.
        for record in self.fault_records:
            fault = dataclasses.replace(record.fault, start=record.fault.start + self.late_s)
            delay = fault.start - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            record.started = self.now()
            log.info(
                "fault %s (target %d) at %.1fs", fault.kind.value, fault.target, record.started
            )
            try:
                record.note = await self._apply(fault)
            except Exception as exc:
                record.note = f"fault failed: {type(exc).__name__}: {exc}"
                record.failed = True
                log.exception("fault %s failed", fault.kind.value)
            record.ended = self.now()
            self.late_s += max(0.0, record.ended - fault.end)

    async def _until_end(self, fault: Fault) -> None:
        await asyncio.sleep(max(0.0, fault.end - self.now()))

    async def _apply(self, fault: Fault) -> str:
        kind = fault.kind
        if kind is FaultKind.RELAY_KILL:
            slot = self.slots[fault.target]
            assert slot.process is not None
            slot.live = False
            slot.process.process.kill()
            await self._until_end(fault)
            self._start_relay(slot)
            return f"relay{slot.index} killed, started again"
        if kind is FaultKind.RELAY_FREEZE:
            slot = self.slots[fault.target]
            assert slot.process is not None
            slot.live = False
            slot.process.process.send_signal(signal.SIGSTOP)
            await self._until_end(fault)
            slot.process.process.send_signal(signal.SIGCONT)
            slot.live = True
            slot.live_since = self.now() - 14  # /livez is due again within a second
            return f"relay{slot.index} stopped {fault.window:.0f}s"
        if kind is FaultKind.POSTGRES_RESTART:
            await asyncio.to_thread(self.services.postgres.stop)
            await self._until_end(fault)
            await self.services.start_again(self.services.postgres)
            return "postgres restarted"
        if kind is FaultKind.BROKER_RESTART:
            await asyncio.to_thread(self.services.kafka.stop)
            await self._until_end(fault)
            await self.services.start_again(self.services.kafka)
            return "broker restarted"
        if kind is FaultKind.KAFKA_PATH:
            assert self.proxy is not None
            self.proxy.stall()
            await self._until_end(fault)
            cut = self.proxy.cut()
            self.proxy.heal()
            return f"relay0's path stalled {fault.window:.0f}s, {cut} connections cut"
        if kind is FaultKind.TERMINATE_BACKENDS:

            async def terminate(conn: asyncpg.Connection) -> str:
                sessions = await conn.fetch(RELAY_SESSIONS)
                ended = await conn.fetchval(TERMINATE, [row["pid"] for row in sessions])
                listening = sum(1 for row in sessions if row["listen"])
                return f"{ended} relay sessions terminated ({listening} of them the LISTEN one)"

            note = await self._with_db("terminate", terminate)
            await self._until_end(fault)
            return note or "database unreachable"
        if kind is FaultKind.WORKER_KILL:
            worker = self.workers[fault.target]
            self.reaper_paused = True
            held = 0
            for _ in range(50):
                held = (
                    await self._with_db("lease", lambda c: c.fetchval(LEASED_BY, worker.ref)) or 0
                )
                if held:
                    break
                await asyncio.sleep(0.1)
            worker.process.kill()
            await self._until_end(fault)
            self.reaper_paused = False
            self.workers[fault.target] = self._start_worker(fault.target)
            return f"{worker.ref} killed holding {held} lease(s)"
        raise AssertionError(kind)

    # -- the run --------------------------------------------------------------------------
    sidecar: RelayProcess | None = None

    async def run(self) -> SoakResult:
        started = time.monotonic()
        self.load_at_start = os.getloadavg()[0]
        try:
            # Inside the try: a service that fails to start must not leave the one started
            # before it running on the soak's port (tests/soak/test_start_failure.py).
            await self.services.start()
            return await self._run(started)
        finally:
            self.stop_all.set()
            if self.relays is not None:
                for slot in self.slots:
                    if slot.process is not None and slot.process.process.poll() is None:
                        slot.process.process.send_signal(signal.SIGCONT)
                self.relays.kill_all()
            for worker in self.workers:
                worker.process.kill()
                worker.process.wait(timeout=30)
            if self.proxy is not None:
                self.proxy.close()
            self.services.close()

    async def _run(self, started: float) -> SoakResult:
        await self._prepare_database()
        self.proxy = FaultProxy(*self.services.kafka.proxy_route()).start()
        self.relays = Relays(self.url, NAMESPACE, self.work)
        bootstraps = [self.proxy.listen] + [self.services.kafka.bootstrap] * (
            self.config.relays - 1
        )
        self.t0 = time.monotonic()
        self.t0_ms = int(time.time() * 1000)
        self.slots = [
            _Slot(i, self.ports.http(i + 1), bootstraps[i]) for i in range(self.config.relays)
        ]
        for slot in self.slots:
            self._start_relay(slot)
        policy = self.work / "soak-policy.toml"
        policy.write_text(POLICY)
        self.sidecar = self.relays.start(
            "sidecar",
            self.services.kafka.bootstrap,
            "--no-relay",
            OUTBOX_RELAY_POLICY=str(policy),
            HEALTH_LISTEN_ADDR=f"127.0.0.1:{self.ports.http(0)}",
        )
        self.workers = [self._start_worker(i) for i in range(self.config.workers)]
        background = [
            asyncio.create_task(self._consumer(), name="consumer"),
            asyncio.create_task(self._sampler(), name="health sampler"),
            asyncio.create_task(self._rss(), name="memory sampler"),
            asyncio.create_task(self._reaper(), name="lease reaper"),
        ]
        with self.ledger_path.open("w") as ledger:
            load = [
                asyncio.create_task(self._writer(i, ledger)) for i in range(self.config.writers)
            ]
            load.append(asyncio.create_task(self._enqueuer()))
            faults = asyncio.create_task(self._faults())
            await asyncio.sleep(max(0.0, self.config.seconds - self.now()))
            # The schedule ends its last fault's recovery allowance before the planned end;
            # faults that overran pushed that back by late_s, and the load lasts as much
            # longer, so the last recovery is still judged under load and inside sampling.
            await faults
            await asyncio.sleep(max(0.0, self.config.seconds + self.late_s - self.now()))
            self.stop_writing.set()
            load_s = self.now()
            await asyncio.gather(*load)
        drained = await self._drain()
        rows = await self._with_db("terminal", lambda c: c.fetch(TERMINAL_JOBS))
        terminal = {row["scoring_job_ref"] for row in rows or []}
        dead = await self._with_db("dead tuples", lambda c: c.fetch(DEAD_TUPLES, list(HOT_TABLES)))
        self.stop_all.set()
        ended = await asyncio.gather(*background, return_exceptions=True)
        # Each ends only when told to: one that died early (the sampler, the consumer) left
        # the judges with less than the run, which must not pass for a clean result.
        background_errors = [
            f"the {task.get_name()} died: {type(outcome).__name__}: {outcome}"
            for task, outcome in zip(background, ended, strict=True)
            if isinstance(outcome, BaseException)
        ]
        ledger_entries = [
            Committed(**json.loads(line)) for line in self.ledger_path.read_text().splitlines()
        ]
        # Health and duplicates are judged against when each fault really began and ended.
        happened = [
            Fault(r.fault.kind, r.started, r.ended - r.started, r.fault.target)
            for r in self.fault_records
            if r.started is not None and r.ended is not None
        ]
        result = audit(
            ledger_entries,
            self.records.values(),
            job_topic=JOB_TOPIC,
            terminal_jobs=terminal,
            faults=happened,
            run_started_ms=self.t0_ms,
        )
        verdict = judge(self.samples, self.livez, happened)
        with (self.work / "records.jsonl").open("w") as dump:
            for r in sorted(self.records.values(), key=lambda r: (r.topic, r.partition, r.offset)):
                at = round((r.timestamp_ms - self.t0_ms) / 1000, 3)
                dump.write(json.dumps({**r.__dict__, "at": at}) + "\n")
        with (self.work / "health.jsonl").open("w") as samples:
            for s in self.samples:
                samples.write(json.dumps({"t": round(s.t, 1), "families": s.families}) + "\n")
        return SoakResult(
            config=self.config,
            commit=_commit(),
            faults=self.fault_records,
            audit=result,
            health=verdict,
            samples=self.samples,
            publish_per_second=sorted(self.first_seen.items()),
            backlog=self.backlog,
            peak_rss_kib=dict(self.peak_rss),
            dead_tuples={r["relname"]: (r["n_live_tup"], r["n_dead_tup"]) for r in dead or []},
            elapsed_s=time.monotonic() - started,
            drained=drained,
            doubtful_commits=self.doubtful,
            load=(self.load_at_start, os.getloadavg()[0]),
            unexpected_exits=self.unexpected_exits,
            load_s=load_s,
            background_errors=background_errors,
        )

    async def _drain(self) -> bool:
        """Until the outbox and the job queue are empty and the consumer read everything."""
        deadline = time.monotonic() + self.config.drain_timeout_s
        while time.monotonic() < deadline:
            left = await self._with_db(
                "drain",
                lambda c: c.fetchval(f"SELECT (SELECT count(*) FROM outbox) + ({ACTIVE_JOBS})"),
            )
            if left == 0 and await self._caught_up():
                return True
            await asyncio.sleep(1.0)
        return False


def _vm(pid: int, field_name: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _vm_hwm(pid: int) -> int:
    return _vm(pid, "VmHWM:")


def _vm_rss(pid: int) -> int:
    return _vm(pid, "VmRSS:")


def _commit() -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--base-port", type=int, default=25000)
    parser.add_argument("--report", type=Path, default=None, help="write soak.md and the plot here")
    args = parser.parse_args(argv)
    seed = args.seed
    if seed is None:
        seed = (
            int(os.environ["SOAK_SEED"])
            if os.environ.get("SOAK_SEED")
            else random.randrange(1 << 31)
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    from tests.soak.report import summary_lines, write_report

    print(f"soak: seed {seed}, {args.seconds:.0f} s", flush=True)
    work = Path(os.environ.get("SOAK_WORK_DIR") or _temp_dir())
    result = asyncio.run(Soak(SoakConfig(args.seconds, seed, args.base_port), work).run())
    for line in summary_lines(result):
        print(line)
    if args.report is not None:
        write_report(result, args.report)
    return 0 if result.passed else 1


def _temp_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="outbox-relay-soak-work-")


if __name__ == "__main__":
    sys.exit(main())
