"""What PostgreSQL says about one database while a benchmark runs on it: the outbox's and the
receipts' sizes, dead tuples and autovacuum runs, each statement's cost from
pg_stat_statements, and the CPU of the database's own processes by who they serve.

Every figure is scoped to the benchmark's database, so other databases on the same shared
server (other people's tests) do not land in it: pg_stat_statements rows of this database
only, and the CPU of the backends and autovacuum workers that pg_stat_activity places in it,
read from /proc. The cluster's shared processes (WAL writer, checkpointer, background
writer) serve every database of the cluster; they are counted apart.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.peers.measure import process_cpu

TABLES = ("outbox", "outbox_receipt")

# One row per table: sizes in bytes (heap, every index, everything with TOAST), the
# statistics collector's tuple counts and how often (auto)vacuum and analyze ran.
TABLE_STATS = """
SELECT s.relname AS name,
       pg_catalog.pg_relation_size(s.relid) AS heap_bytes,
       pg_catalog.pg_indexes_size(s.relid) AS index_bytes,
       pg_catalog.pg_total_relation_size(s.relid) AS total_bytes,
       s.n_live_tup AS live, s.n_dead_tup AS dead,
       s.n_tup_ins AS inserted, s.n_tup_del AS deleted,
       s.autovacuum_count AS autovacuums, s.autoanalyze_count AS autoanalyzes,
       s.vacuum_count AS vacuums
FROM pg_catalog.pg_stat_user_tables s
WHERE s.relname = ANY($1::text[])
"""

INDEX_STATS = """
SELECT s.indexrelname AS name, pg_catalog.pg_relation_size(s.indexrelid) AS bytes,
       s.idx_scan AS scans, s.idx_tup_read AS tuples_read
FROM pg_catalog.pg_stat_user_indexes s
WHERE s.relname = ANY($1::text[])
"""

# This database's statements; one queryid may have several rows (users, top level or not).
STATEMENTS = """
SELECT s.queryid, min(s.query) AS query, sum(s.calls)::bigint AS calls,
       sum(s.total_exec_time) AS total_ms, sum(s.rows)::bigint AS rows,
       sum(s.shared_blks_hit + s.shared_blks_read)::bigint AS blocks,
       sum(s.shared_blks_dirtied)::bigint AS dirtied, sum(s.wal_bytes)::bigint AS wal_bytes
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
GROUP BY s.queryid
"""

# Every process of the cluster pg_stat_activity knows: this database's backends and
# autovacuum workers, and the cluster's own processes (no database).
ACTIVITY = """
SELECT a.pid, a.datname = current_database() AS here, a.datid IS NULL AS cluster,
       coalesce(a.application_name, '') AS application, coalesce(a.backend_type, '') AS kind,
       a.client_port AS port
FROM pg_catalog.pg_stat_activity a
"""

FETCH_STATEMENT = "relay: fetch (FETCH_READY)"
RECORD_STATEMENT = "relay: acknowledgement (RECORD_PUBLISHED)"
# The statements of this product and of the benchmark, told apart by a fragment of their
# text: the first rule that matches names a statement.
STATEMENT_NAMES = (
    ("AS duplicate", FETCH_STATEMENT),
    ("moved AS (", RECORD_STATEMENT),
    ("DELETE FROM outbox_receipt", "relay: prune receipts"),
    ("outbox_seq_seq", "relay: pass bound (SEQ_ALLOCATED)"),
    ("failed AS (", "relay: record failure"),
    ("UPDATE relay_lane", "relay: lanes (renew/claim/release)"),
    ("INSERT INTO relay_instance", "relay: heartbeat"),
    ("oldest_ready_created_at", "sidecar: relay family probe"),
    ("FROM relay_instance", "relay: live instances"),
    ("RowExclusiveLock", "relay: oldest writer"),
    ("pending_count", "sidecar: outbox probe"),
    ("INSERT INTO outbox ", "writers: insert"),
    ("INSERT INTO outbox(", "writers: insert"),
    ("scoring_job_state", "sidecar: scoring job probes"),
    ("FROM outbox", "sidecar/relay: outbox probe"),
    ("pg_notify", "notify"),
    ("LISTEN", "relay: listen"),
    ("pg_stat_statements", "benchmark: statements"),
    ("pg_stat_user_", "benchmark: table stats"),
    ("pg_stat_activity", "benchmark/relay: activity"),
)


def statement_name(query: str) -> str:
    """A short name for a statement: the product's own by a fragment of its text, any
    other by its first words."""
    for fragment, name in STATEMENT_NAMES:
        if fragment in query:
            return name
    text = re.sub(r"\s+", " ", query).strip()
    return text[:60] + ("…" if len(text) > 60 else "")


@dataclass(frozen=True)
class StatementCost:
    """One statement's work between two readings of pg_stat_statements."""

    name: str
    calls: int
    total_ms: float
    rows: int
    blocks: int
    dirtied: int
    wal_bytes: int

    def as_dict(self) -> dict[str, Any]:
        """As a figures file keeps it."""
        per_call = max(self.calls, 1)
        return {
            "name": self.name,
            "calls": self.calls,
            "total_ms": round(self.total_ms, 2),
            "mean_ms": round(self.total_ms / per_call, 4),
            "rows": self.rows,
            "blocks_per_call": round(self.blocks / per_call, 1),
            "dirtied": self.dirtied,
            "wal_bytes": self.wal_bytes,
        }


Reading = Mapping[int, Mapping[str, Any]]  # queryid -> its row of STATEMENTS


def statement_costs(before: Reading, after: Reading) -> list[StatementCost]:
    """The work of each statement between two readings, the most expensive first; a
    statement first seen in ``after`` counts whole, one that vanished (evicted) not at all.
    One whose calls fell had its counters reset in between (``pg_stat_statements_reset()``
    on a shared cluster resets every database's): it counts what it did since, in whole."""
    costs: dict[str, StatementCost] = {}
    for queryid, now in after.items():
        was = before.get(queryid, {})
        if (now["calls"] or 0) < (was.get("calls") or 0):
            was = {}

        def delta(key: str, now: Mapping[str, Any] = now, was: Mapping[str, Any] = was) -> Any:
            return (now[key] or 0) - (was.get(key) or 0)

        if delta("calls") <= 0:
            continue
        name = statement_name(str(now["query"]))
        old = costs.get(name)
        cost = StatementCost(
            name,
            int(delta("calls")),
            float(delta("total_ms")),
            int(delta("rows")),
            int(delta("blocks")),
            int(delta("dirtied")),
            int(delta("wal_bytes")),
        )
        if old is not None:  # statements of one name (several texts) add up
            cost = StatementCost(
                name,
                old.calls + cost.calls,
                old.total_ms + cost.total_ms,
                old.rows + cost.rows,
                old.blocks + cost.blocks,
                old.dirtied + cost.dirtied,
                old.wal_bytes + cost.wal_bytes,
            )
        costs[name] = cost
    return sorted(costs.values(), key=lambda c: c.total_ms, reverse=True)


async def read_statements(conn: asyncpg.Connection) -> dict[int, dict[str, Any]]:
    """pg_stat_statements of this database now, by queryid."""
    return {int(row["queryid"]): dict(row) for row in await conn.fetch(STATEMENTS)}


async def table_stats(conn: asyncpg.Connection) -> dict[str, dict[str, Any]]:
    """The outbox's and the receipts' sizes and counters now, by table, with the size of
    each of their indexes under ``indexes``."""
    tables = {row["name"]: dict(row) for row in await conn.fetch(TABLE_STATS, list(TABLES))}
    for table in tables.values():
        table.pop("name")
        table["indexes"] = {}
    for row in await conn.fetch(INDEX_STATS, list(TABLES)):
        owner = "outbox_receipt" if row["name"].startswith("outbox_receipt") else "outbox"
        if owner in tables:
            tables[owner]["indexes"][row["name"]] = int(row["bytes"])
    return tables


async def ensure_extensions(conn: asyncpg.Connection) -> list[str]:
    """pg_stat_statements (and pgstattuple, for the index statistics at the end) in this
    database; what could not be had, one phrase each (the server must preload
    pg_stat_statements: ``shared_preload_libraries``, a restart, then CREATE EXTENSION)."""
    missing = []
    for extension in ("pg_stat_statements", "pgstattuple"):
        try:
            await conn.execute(f"CREATE EXTENSION IF NOT EXISTS {extension}")
        except asyncpg.PostgresError as exc:
            missing.append(f"{extension}: {type(exc).__name__}")
    if "pg_stat_statements" not in " ".join(missing):
        try:
            await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
        except asyncpg.PostgresError as exc:  # created, but not preloaded
            missing.append(f"pg_stat_statements not preloaded ({type(exc).__name__})")
    return missing


# pgstattuple on every index of the outbox: its pages, its live and dead index tuples
# (dead: LP_DEAD, marked by a scan that met a deleted row), its free space.
INDEX_TUPLES = """
SELECT i.indexrelid::regclass::text AS name, t.table_len AS bytes,
       t.tuple_count AS live, t.dead_tuple_count AS dead, t.free_percent AS free_percent
FROM pg_catalog.pg_index i
CROSS JOIN LATERAL pgstattuple(i.indexrelid) t
WHERE i.indrelid = 'outbox'::regclass
  AND (SELECT amname FROM pg_catalog.pg_am a JOIN pg_catalog.pg_class c ON c.relam = a.oid
       WHERE c.oid = i.indexrelid) = 'btree'
ORDER BY 1
"""


async def index_tuples(conn: asyncpg.Connection) -> list[dict[str, Any]]:
    """Each btree index of the outbox as pgstattuple reads it (empty without pgstattuple)."""
    try:
        return [dict(row) for row in await conn.fetch(INDEX_TUPLES)]
    except asyncpg.PostgresError:
        return []


# -- CPU of the database's processes ---------------------------------------------------------

GROUPS = ("relay", "sidecar", "writers", "autovacuum", "other", "cluster")


def group_of(
    *, here: bool, cluster: bool, application: str, kind: str, client: str | None, own: bool
) -> str | None:
    """Whom a PostgreSQL process serves: ``client``, the group of the process at the other
    end of its connection when known (the benchmark's writers, the relay's process, the
    sidecar's), else the relay's and the sidecar's sessions by their application_name; this
    database's autovacuum workers; the cluster's shared processes. None for other
    databases' processes and the benchmark's own monitoring session."""
    if cluster and not here:
        return "cluster" if kind and kind != "client backend" else None
    if not here or own:
        return None
    if kind == "autovacuum worker":
        return "autovacuum"
    if client is not None:
        return client
    if application == "outbox-relay":
        return "relay"
    if application == "outbox-relay-health":
        return "sidecar"
    return "other"


def _socket_inodes(pid: int) -> set[str]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    links = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            links.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


def client_of(port: int, clients: Mapping[int, str]) -> str | None:
    """The group of the local process (one of ``clients``: pid -> group) whose TCP socket
    has local port ``port``, the client end of a backend's connection; None when none has."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            text = Path(table).read_text()
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 9 and int(fields[1].rpartition(":")[2], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for pid, group in clients.items():
        if inodes & _socket_inodes(pid):
            return group
    return None


@dataclass
class CpuTotals:
    """CPU seconds of processes by group, accumulated by sampling (every second or so):
    each process counts from its first sample (its whole life when it started after the
    first sample), up to its last one (a process that ends between two samples loses at
    most one interval)."""

    totals: dict[str, float] = field(default_factory=dict)
    _last: dict[int, tuple[str, float]] = field(default_factory=dict)
    _started: bool = False

    def take(self, processes: Iterable[tuple[int, str | None]]) -> None:
        """Account one sample of (pid, group) pairs; a None group is not counted."""
        seen: dict[int, tuple[str, float]] = {}
        for pid, group in processes:
            if group is None or (cpu := process_cpu(pid)) is None:
                continue
            seen[pid] = (group, cpu.own)
            if pid in self._last:
                used = cpu.own - self._last[pid][1]
            else:  # born since the first sample: its whole life is in the window
                used = cpu.own if self._started else 0.0
            self.totals[group] = self.totals.get(group, 0.0) + used
        self._last = seen
        self._started = True

    def snapshot(self) -> dict[str, float]:
        """The totals so far, by group."""
        return dict(self.totals)


@dataclass
class DatabaseCpu(CpuTotals):
    """:class:`CpuTotals` of one database's PostgreSQL processes by :func:`group_of`."""

    writer_pids: set[int] = field(default_factory=set)  # the writers' backends
    own_pids: set[int] = field(default_factory=set)  # the benchmark's monitoring backends
    clients: dict[int, str] = field(default_factory=dict)  # client OS pid -> group
    _client_of_backend: dict[int, str | None] = field(default_factory=dict)

    async def sample(self, conn: asyncpg.Connection) -> None:
        """Read pg_stat_activity and each process's CPU; add what each used since the last
        sample to its group."""
        rows = await conn.fetch(ACTIVITY)
        pairs = []
        for row in rows:
            pid = int(row["pid"])
            client = "writers" if pid in self.writer_pids else None
            if client is None and row["here"] and row["port"] is not None:
                if pid not in self._client_of_backend:
                    self._client_of_backend[pid] = client_of(int(row["port"]), self.clients)
                client = self._client_of_backend[pid]
            group = group_of(
                here=bool(row["here"]),
                cluster=bool(row["cluster"]),
                application=row["application"],
                kind=row["kind"],
                client=client,
                own=pid in self.own_pids,
            )
            pairs.append((pid, group))
        self.take(pairs)
