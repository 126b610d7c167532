"""Debezium's PostgreSQL connector with its outbox EventRouter, on Kafka Connect standalone.

The peer that a team would otherwise deploy for the relay's job. Its jars come from Maven
Central (pom.xml beside this module) into .services/debezium-lib, fetched once. Each run
gets a replication slot and a publication of its own, on the outbox table only, in a
database of its own; the slot is always dropped at the end, because a leftover slot
keeps PostgreSQL's WAL forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
POM = Path(__file__).resolve().parent / "debezium" / "pom.xml"
LOG4J2 = Path(__file__).resolve().parent / "debezium" / "log4j2.properties"
LIB = REPO / ".services" / "debezium-lib"
CONNECTOR_NAME = "outbox-bench"

# The heap and collector of Kafka's own start scripts (kafka-run-class.sh), smaller maximum.
JVM_OPTS = (
    "-Xms256m",
    "-Xmx1g",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-Djava.awt.headless=true",
)

# Named SQL. The publication covers the outbox table only, so the slot decodes nothing else.
CREATE_PUBLICATION = "CREATE PUBLICATION {publication} FOR TABLE outbox"
# Created before the backlog is written, so the catch-up reads it from WAL like a connector
# that was down; pgoutput is PostgreSQL's built-in logical decoding output plugin.
CREATE_SLOT = "SELECT pg_create_logical_replication_slot($1, 'pgoutput')"
# A stopped worker's walsender may linger a moment; the slot can be dropped once it is free.
SLOT_ACTIVE_PID = "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1"
DROP_SLOT = "SELECT pg_drop_replication_slot($1)"
TERMINATE_BACKEND = "SELECT pg_terminate_backend($1)"
# Slots left by an interrupted earlier run of this benchmark (name prefix below): free, and
# in a database nobody is connected to, so a run going on elsewhere (its slot is free while
# it writes the backlog, over a connection of its own) keeps its slot.
LEFTOVER_SLOTS = """
SELECT s.slot_name FROM pg_replication_slots AS s
WHERE s.slot_name LIKE 'outbox_bench_%' AND NOT s.active
  AND NOT EXISTS (SELECT 1 FROM pg_stat_activity AS a WHERE a.datname = s.database)
"""


class DebeziumUnavailable(RuntimeError):
    """The peer cannot run here (no Java, Maven or jars); the comparison says so."""


def pom_stamp() -> str:
    """A digest of the pom: the jars are fetched again only when it changed."""
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def ensure_classpath() -> Path:
    """Fetch the Debezium and Kafka Connect jars once (idempotent; skipped when present)."""
    stamp_file = LIB / ".pom.sha256"
    if stamp_file.is_file() and stamp_file.read_text().strip() == pom_stamp():
        return LIB
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            raise DebeziumUnavailable(f"{tool} not found: the Debezium peer needs a JDK and Maven")
    shutil.rmtree(LIB, ignore_errors=True)
    LIB.parent.mkdir(parents=True, exist_ok=True)
    log = LIB.parent / "debezium-mvn.log"
    with log.open("w") as out:
        done = subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-f",
                str(POM),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={LIB}",
                "-DincludeScope=runtime",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0 or not any(LIB.glob("debezium-connector-postgres-*.jar")):
        raise DebeziumUnavailable(f"mvn dependency:copy-dependencies failed; see {log}")
    stamp_file.write_text(pom_stamp() + "\n")
    return LIB


@dataclass(frozen=True)
class PeerDatabase:
    """Where the connector reads: one database, its slot and its publication."""

    host: str
    port: int
    user: str
    password: str
    dbname: str
    slot: str
    publication: str
    sslmode: str = "prefer"


def peer_database(database_url: str, slot: str) -> PeerDatabase:
    """The connector's view of a libpq URL; the publication is named after the slot.

    TLS as the relay's asyncpg connection has it: the URL's ``sslmode``, else
    ``PGSSLMODE``, else ``prefer`` (libpq's default, and Debezium's), so every system pays
    for the same connection (docs/benchmarks.md, "TLS to PostgreSQL").
    """
    parts = urlsplit(database_url)
    sslmode = parse_qs(parts.query).get("sslmode", [os.environ.get("PGSSLMODE", "prefer")])
    return PeerDatabase(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        dbname=parts.path.lstrip("/") or "postgres",
        slot=slot,
        publication=f"{slot}_pub",
        sslmode=sslmode[-1],
    )


def worker_properties(bootstrap: str, workdir: Path, rest_port: int) -> dict[str, str]:
    """The standalone worker: what a user tuning Connect's producer for latency sets."""
    return {
        "bootstrap.servers": bootstrap,
        # The EventRouter's key is aggregateid and its value the payload as JSON text: plain
        # strings on the wire, as the relay writes them (docs/benchmarks.md, settings).
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "header.converter": "org.apache.kafka.connect.storage.SimpleHeaderConverter",
        "offset.storage.file.filename": str(workdir / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://127.0.0.1:{rest_port}",
        # Every jar is on the class path; there is no plugin directory to scan.
        "plugin.discovery": "only_scan",
        # The relay's delivery guarantees: acks=all and idempotence, no waiting to fill a
        # batch (linger 0), batches up to the relay's own 256 KiB, and five requests in
        # flight (ordered, because idempotent) instead of Connect's cautious default of one.
        "producer.acks": "all",
        "producer.enable.idempotence": "true",
        "producer.linger.ms": "0",
        "producer.batch.size": str(256 * 1024),
        "producer.max.in.flight.requests.per.connection": "5",
    }


def connector_properties(
    db: PeerDatabase, topic_prefix: str, *, poll_interval_ms: int
) -> dict[str, str]:
    """The PostgreSQL connector and the outbox EventRouter, mapped to our outbox table."""
    return {
        "name": CONNECTOR_NAME,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": db.host,
        "database.port": str(db.port),
        "database.user": db.user,
        "database.password": db.password,
        "database.dbname": db.dbname,
        "database.sslmode": db.sslmode,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": db.slot,
        "publication.name": db.publication,
        # The publication (outbox only) and the slot are made before the backlog is written.
        "publication.autocreate.mode": "disabled",
        # Stream changes only: the outbox table is an event log, not state to snapshot.
        "snapshot.mode": "no_data",
        "table.include.list": "public.outbox",
        "tombstones.on.delete": "false",
        # The latency knob: how long the task waits for the next change when its queue is
        # empty (default 500 ms). 1 ms and 10 ms are what a user tuning for latency sets.
        "poll.interval.ms": str(poll_interval_ms),
        # Debezium's defaults, stated: up to 2,048 changes handed to Connect per poll and
        # 8,192 queued between the replication stream and the task.
        "max.batch.size": "2048",
        "max.queue.size": "8192",
        "transforms": "outbox",
        "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.table.field.event.id": "id",
        "transforms.outbox.table.field.event.key": "aggregateid",
        "transforms.outbox.table.field.event.payload": "payload",
        "transforms.outbox.route.by.field": "aggregatetype",
        # The relay's topic template for the benchmark: <namespace>.<aggregatetype>.
        "transforms.outbox.route.topic.replacement": f"{topic_prefix}.${{routedByValue}}",
        # The event type travels as a header, as the relay's ce_type does.
        "transforms.outbox.table.fields.additional.placement": "type:header:ce_type",
    }


def render_properties(values: dict[str, str]) -> str:
    """Java properties text; backslashes escaped, the only character our values need."""
    return "".join(
        f"{key}={value.replace(chr(92), chr(92) * 2)}\n" for key, value in values.items()
    )


async def prepare_slot(conn: asyncpg.Connection, db: PeerDatabase) -> None:
    """The publication on the outbox table and the logical slot the connector will read."""
    await conn.execute(CREATE_PUBLICATION.format(publication=db.publication))
    await conn.fetchval(CREATE_SLOT, db.slot)


async def drop_slot(admin: asyncpg.Connection, slot: str, *, timeout: float = 60.0) -> None:
    """Drop the slot, ending its walsender if it outlives the worker."""
    deadline = time.monotonic() + timeout
    while True:
        row = await admin.fetchrow(SLOT_ACTIVE_PID, slot)
        if row is None:
            return
        if row["active_pid"] is None:
            with contextlib.suppress(asyncpg.UndefinedObjectError, asyncpg.ObjectInUseError):
                await admin.fetchval(DROP_SLOT, slot)
        elif time.monotonic() > deadline:
            await admin.fetchval(TERMINATE_BACKEND, row["active_pid"])
        await asyncio.sleep(0.2)


async def drop_leftover_slots(admin: asyncpg.Connection) -> list[str]:
    """Drop this benchmark's slots that an interrupted run left behind."""
    dropped = []
    for record in await admin.fetch(LEFTOVER_SLOTS):
        await drop_slot(admin, record["slot_name"])
        dropped.append(record["slot_name"])
    return dropped


class ConnectStandalone:
    """One Kafka Connect standalone worker running the connector, as a child process."""

    def __init__(
        self,
        workdir: Path,
        worker: dict[str, str],
        connector: dict[str, str],
        rest_port: int,
    ) -> None:
        self._workdir = workdir
        self._worker = worker
        self._connector = connector
        self._rest_port = rest_port
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        return self._process.pid if self._process else None

    def start(self) -> None:
        """Start the worker (it starts the connector from its properties file)."""
        lib = ensure_classpath()
        self._workdir.mkdir(parents=True, exist_ok=True)
        worker_file = self._workdir / "worker.properties"
        connector_file = self._workdir / "connector.properties"
        worker_file.write_text(render_properties(self._worker))
        connector_file.write_text(render_properties(self._connector))
        connector_file.chmod(0o600)  # it holds the database password
        logs = self._workdir / "logs"
        logs.mkdir(exist_ok=True)
        with (logs / "stdout.log").open("ab") as out:
            self._process = subprocess.Popen(
                [
                    "java",
                    *JVM_OPTS,
                    f"-Dconnect.logs.dir={logs}",
                    f"-Dlog4j2.configurationFile={LOG4J2}",
                    "-cp",
                    f"{lib}/*",
                    "org.apache.kafka.connect.cli.ConnectStandalone",
                    str(worker_file),
                    str(connector_file),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self._workdir,
                env={**os.environ},
            )

    def running(self) -> bool:
        """The JVM has not exited."""
        return self._process is not None and self._process.poll() is None

    def task_state(self) -> str | None:
        """The connector task's state from the worker's REST API, None until it answers."""
        url = f"http://127.0.0.1:{self._rest_port}/connectors/{CONNECTOR_NAME}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                status = json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None
        tasks = status.get("tasks") or []
        return str(tasks[0].get("state")) if tasks else None

    async def wait_running(self, timeout: float = 180.0) -> None:
        """Until the task runs; a worker that dies or a task that fails raises at once."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise DebeziumUnavailable(f"Connect exited: {self.first_error()}")
            state = await asyncio.to_thread(self.task_state)
            if state == "RUNNING":
                return
            if state == "FAILED":
                raise DebeziumUnavailable(f"connector task failed: {self.first_error()}")
            await asyncio.sleep(0.5)
        raise DebeziumUnavailable(f"connector not running after {timeout:.0f} s")

    def first_error(self) -> str:
        """The first ERROR line of Connect's log (Connect hides password values), and where."""
        log = self._workdir / "logs" / "connect.log"
        try:
            errors = [line for line in log.read_text().splitlines() if "ERROR" in line]
        except OSError:
            errors = []
        # This one is logged for any role without the REPLICATION attribute, superusers too.
        errors = [line for line in errors if "roles LOGIN and REPLICATION" not in line]
        return f"{errors[0][:300] if errors else 'no ERROR line'} (log: {log})"

    def peak_rss_mb(self) -> float | None:
        """The JVM's peak resident set so far (VmHWM), in MB."""
        return peak_rss_mb(self.pid)

    async def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM (Connect stops its task and commits offsets), SIGKILL if it hangs."""
        process = self._process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


def peak_rss_mb(pid: int | None) -> float | None:
    """A live process' peak resident set (VmHWM) in MB, None when it is gone."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
