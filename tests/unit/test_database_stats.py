"""What the sustained-load benchmarks read of PostgreSQL (bench/database_stats.py): statements
named and their cost between two readings, and PostgreSQL's processes told apart by whom
they serve."""

from __future__ import annotations

import os
import socket
import time

import pytest

from bench import database_stats
from bench.database_stats import (
    CpuTotals,
    client_of,
    group_of,
    statement_costs,
    statement_name,
)
from relay import sql


@pytest.mark.parametrize(
    ("query", "name"),
    [
        (sql.FETCH_READY, "relay: fetch (FETCH_READY)"),
        (sql.RECORD_PUBLISHED, "relay: acknowledgement (RECORD_PUBLISHED)"),
        (sql.RECORD_REPUBLISHED, "relay: acknowledgement (RECORD_PUBLISHED)"),
        (sql.PRUNE_RECEIPTS, "relay: prune receipts"),
        (sql.SEQ_ALLOCATED, "relay: pass bound (SEQ_ALLOCATED)"),
        (sql.RENEW_LANES, "relay: lanes (renew/claim/release)"),
        (sql.HEARTBEAT_WITH_TEMPLATE, "relay: heartbeat"),
        ("INSERT INTO outbox (aggregatetype, aggregateid) VALUES ($1, $2)", "writers: insert"),
        ("SELECT   1\n  FROM   somewhere_else", "SELECT 1 FROM somewhere_else"),
    ],
)
def test_statements_are_named_by_what_they_are(query: str, name: str) -> None:
    assert statement_name(query) == name


def _reading(queryid: int, query: str, calls: int, total_ms: float) -> dict[str, object]:
    return {
        "query": query,
        "calls": calls,
        "total_ms": total_ms,
        "rows": calls,
        "blocks": 10 * calls,
        "dirtied": 0,
        "wal_bytes": 100 * calls,
    }


def test_a_statements_cost_is_the_difference_of_two_readings_most_expensive_first() -> None:
    before = {1: _reading(1, sql.FETCH_READY, 100, 50.0), 2: _reading(2, sql.PRUNE_RECEIPTS, 5, 9)}
    after = {
        1: _reading(1, sql.FETCH_READY, 300, 150.0),
        2: _reading(2, sql.PRUNE_RECEIPTS, 5, 9),  # not called in between: left out
        3: _reading(3, sql.RECORD_PUBLISHED, 50, 20.0),  # first seen: counts whole
        4: _reading(4, sql.RECORD_REPUBLISHED, 10, 400.0),  # the same name adds up
    }
    costs = statement_costs(before, after)
    assert [(c.name, c.calls, c.total_ms) for c in costs] == [
        ("relay: acknowledgement (RECORD_PUBLISHED)", 60, 420.0),
        ("relay: fetch (FETCH_READY)", 200, 100.0),
    ]
    shown = costs[1].as_dict()
    assert shown["mean_ms"] == 0.5 and shown["blocks_per_call"] == 10.0


def test_a_statement_whose_counters_were_reset_in_between_counts_what_it_did_since() -> None:
    before = {1: _reading(1, sql.FETCH_READY, 5000, 900.0)}
    after = {1: _reading(1, sql.FETCH_READY, 120, 30.0)}  # reset, then 120 calls
    costs = statement_costs(before, after)
    assert [(c.name, c.calls, c.total_ms) for c in costs] == [
        ("relay: fetch (FETCH_READY)", 120, 30.0)
    ]


@pytest.mark.parametrize(
    ("facts", "group"),
    [
        ({"kind": "client backend", "client": "writers"}, "writers"),
        ({"kind": "client backend", "client": "relay", "application": "anything"}, "relay"),
        ({"kind": "client backend", "application": "outbox-relay"}, "relay"),
        ({"kind": "client backend", "application": "outbox-relay-health"}, "sidecar"),
        ({"kind": "client backend"}, "other"),
        ({"kind": "autovacuum worker"}, "autovacuum"),
        ({"kind": "client backend", "own": True}, None),
        ({"kind": "client backend", "here": False}, None),  # another database's
        ({"kind": "autovacuum worker", "here": False}, None),
        ({"kind": "walwriter", "here": False, "cluster": True}, "cluster"),
        ({"kind": "autovacuum launcher", "here": False, "cluster": True}, "cluster"),
    ],
)
def test_each_process_is_counted_for_whom_it_serves(
    facts: dict[str, object], group: str | None
) -> None:
    arguments: dict[str, object] = {
        "here": True,
        "cluster": False,
        "application": "",
        "client": None,
        "own": False,
    } | facts
    assert group_of(**arguments) == group  # type: ignore[arg-type]


def test_a_backends_client_is_found_by_the_port_of_its_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        try:
            port = client.getsockname()[1]
            assert client_of(port, {os.getpid(): "relay"}) == "relay"
            assert client_of(port, {1: "sidecar"}) is None
        finally:
            client.close()
            accepted.close()


def test_cpu_counts_each_process_from_its_first_sample() -> None:
    totals = CpuTotals()
    totals.take([(os.getpid(), "me")])
    assert totals.snapshot() == {"me": 0.0}  # present at the first sample: a baseline
    burnt = time.process_time() + 0.2
    while time.process_time() < burnt:
        pass  # 0.2 s of CPU, however busy the machine
    totals.take([(os.getpid(), "me"), (2**22 + 1, "gone")])  # no such pid: not counted
    assert totals.snapshot()["me"] >= 0.15  # /proc counts in clock ticks
    assert "gone" not in totals.snapshot()
    assert database_stats.GROUPS[-1] == "cluster"
