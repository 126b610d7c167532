"""The rendered manifests, run as processes against the real PostgreSQL and broker: the
Job's steps, the sidecar and three relays run exactly their containers' commands and
environment (names verbatim; values from the example overlay's ConfigMaps and Secret,
addresses pointed at this machine's services, each pod under its own part's role), and
answer their probes on the declared port. The Job migrates and grants; the relays publish;
the sidecar classifies; with a stalled scoring queue the relays stay ready and only the
sidecar says stalled. Every metric an alert rule reads is in the four processes' scrapes, and
promtool evaluates the rules and the dashboard's backlog panel over them: one stall is one
firing alert, the backlog is the table's."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
import yaml

from tests.deploy.conftest import EXAMPLE, MIGRATE_JOB, one
from tests.deploy.pods import Cluster, Pod, make_roles, run_once, running
from tests.support import promtool
from tests.support.http import get
from tests.support.monitoring_kit import ALERTS, DASHBOARD, metric_names

NAMESPACE = "scoring-test"
BACKLOG_PANEL = "Pending events"
# The scrapes, held this long for promtool: longer than any rule's `for:` and range.
HOLD_S = 45 * 60


async def _status(pod: Pod, path: str) -> int | None:
    assert pod.port is not None
    try:
        return (await get(("127.0.0.1", pod.port), path)).status
    except OSError:
        return None


async def _until(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def _health(pod: Pod) -> dict[str, Any]:
    assert pod.port is not None
    reply = await get(("127.0.0.1", pod.port), "/health")
    document: dict[str, Any] = json.loads(reply.body)
    return document


def _classification(document: Mapping[str, Any], family: str) -> str | None:
    checks = document.get("checks", {}).get(f"{family}:classification")
    return checks[0]["observedValue"] if checks else None


async def _scrape(pods: list[Pod]) -> list[str]:
    texts = []
    for pod in pods:
        assert pod.port is not None
        texts.append((await get(("127.0.0.1", pod.port), "/metrics")).body.decode())
    return texts


async def _targets(
    pods: list[Pod], rendered: list[dict[str, Any]], seconds: float
) -> list[promtool.Target]:
    """Two scrapes of each pod ``seconds`` apart, labelled as the PodMonitor labels them:
    its job label (the pod's app.kubernetes.io/name), the namespace, the pod labels it copies
    (app.kubernetes.io/instance as app_kubernetes_io_instance), the address and the pod."""
    first = await _scrape(pods)
    await asyncio.sleep(seconds)
    last = await _scrape(pods)
    at = time.time()
    monitor = one(rendered, "PodMonitor", "outbox-relay")["spec"]
    targets = []
    for pod, a, b in zip(pods, first, last, strict=True):
        workload = pod.name.rsplit("-", 1)[0]
        labels = one(rendered, "Deployment", workload)["spec"]["template"]["metadata"]["labels"]
        copied = {
            re.sub(r"[^a-zA-Z0-9_]", "_", name): labels[name]
            for name in monitor.get("podTargetLabels", [])
        }
        target = {
            "job": labels[monitor["jobLabel"]],
            "namespace": NAMESPACE,
            **copied,
            "instance": f"{pod.name}:8080",
            "pod": pod.name,
        }
        targets.append(promtool.Target(target, a, b, seconds, at))
    return targets


def _scrape_interval_s(rendered: list[dict[str, Any]]) -> int:
    (endpoint,) = one(rendered, "PodMonitor", "outbox-relay")["spec"]["podMetricsEndpoints"]
    interval = re.fullmatch(r"(\d+)s", endpoint["interval"])
    assert interval, endpoint
    return int(interval.group(1))


def _judge(
    rendered: list[dict[str, Any]],
    targets: list[promtool.Target],
    firing: dict[str, int],
    workdir: Path,
    queries: list[dict[str, Any]] | None = None,
) -> None:
    """promtool says exactly these alerts fire over the targets' series (and the queries
    give their samples)."""
    judged = promtool.firing_check(
        ALERTS,
        targets,
        firing=firing,
        interval_s=_scrape_interval_s(rendered),
        hold_s=HOLD_S,
        queries=queries or [],
        directory=workdir,
    )
    assert judged.returncode == 0, judged.stdout + judged.stderr


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _backlog_queries(pending: int) -> list[dict[str, Any]]:
    """The dashboard's backlog panel as promtool expression tests: the sidecar's gauge is the
    table's count; the relay's own backlog gauge is not exported by relay-only processes."""
    dashboard = json.loads(DASHBOARD.read_text())
    (panel,) = [p for p in dashboard["panels"] if p.get("title") == BACKLOG_PANEL]
    expected = {
        "outbox_relay_outbox_pending_events": [
            {"labels": f'{{namespace="{NAMESPACE}"}}', "value": pending}
        ],
        "outbox_relay_pending_events": [],
    }
    queries = []
    for target in panel["targets"]:
        expr = target["expr"]
        for variable, value in (("$job", "outbox-relay"), ("$namespace", NAMESPACE)):
            expr = expr.replace(variable, value)
        expr = expr.replace("$install", ".*")
        (name,) = metric_names(expr)
        queries.append({"expr": expr, "exp_samples": expected[name]})
    assert len(queries) == len(expected)
    return queries


_LANES_SHARED = """
SELECT CASE WHEN count(*) = 64 THEN count(DISTINCT owner_id) END
FROM relay_lane WHERE lease_expires_at > now()
"""
# Statements of this database, by one role, that summarise the whole outbox or read the
# scoring queue or the server's sessions and locks: what a family's probe or a backlog
# gauge costs. (The relay's own counts, of the rows it just recorded and of the live
# instances it shares lanes with, are its work, not these.)
_DATABASE_WIDE_READS = """
SELECT coalesce(sum(s.calls), 0)
FROM pg_stat_statements s
JOIN pg_roles r ON r.oid = s.userid
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND r.rolname = $1
  AND (s.query ILIKE '%count(*) FILTER (WHERE%'
       OR s.query ILIKE '%pg_stat_activity%'
       OR s.query ILIKE '%pg_locks%'
       OR s.query ILIKE '%scoring_job_state%')
"""
_HEALTH_SESSIONS = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND usename = $1
  AND application_name = 'outbox-relay-health'
"""
_STALLED_JOB = """
INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,
                               max_attempts, created_at, updated_at)
VALUES ('job-stuck', 'request-stuck', 'queued', 3,
        clock_timestamp() - interval '20 minutes', clock_timestamp() - interval '20 minutes')
"""
# Pending, but not due for an hour: a backlog that stays put while the relays run.
_HELD_EVENTS = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, next_attempt_at)
SELECT 'held', 'key-' || n, 'test.held', '{}'::jsonb, clock_timestamp() + interval '1 hour'
FROM generate_series(1, $1) AS n
"""
_EVENTS = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', 'order-' || n, 'test.published', jsonb_build_object('n', n)
FROM generate_series(1, $1) AS n
"""


@pytest.mark.timeout(600)
async def test_the_manifests_run_as_processes_and_the_kit_reads_them_once(
    rendered: list[dict[str, Any]],
    image: dict[str, Any],
    empty_database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> None:
    database = urlsplit(empty_database_url).path.lstrip("/")
    cluster = Cluster(
        rendered,
        image,
        database_env=EXAMPLE / "database.env",
        server_url=empty_database_url,
        # Not the overlay's: this machine's broker, topics of this test only.
        settings={
            "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{topic_namespace}.{{aggregatetype}}",
            "OUTBOX_RELAY_ALLOWED_TOPICS": rf"{re.escape(topic_namespace)}\..*",
        },
        suffix=f"_{uuid.uuid4().hex[:8]}",
        workdir=tmp_path,
    )
    admin = await asyncpg.connect(empty_database_url)
    await admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    roles = await make_roles(admin, cluster, database)
    try:
        # The Job: each step in order, each must succeed.
        for step in cluster.pods("Job", MIGRATE_JOB):
            code, output = await run_once(step)
            assert code == 0, (step.argv[1:], output)
        assert await admin.fetchval("SELECT count(*) FROM outbox_relay_migration") >= 5
        relay_role = cluster.roles["relay-url"]
        assert await admin.fetchval(
            "SELECT has_table_privilege($1, 'outbox', 'DELETE')", relay_role
        )
        assert not await admin.fetchval(
            "SELECT has_table_privilege($1, 'outbox', 'DELETE')", cluster.roles["sidecar-url"]
        )
        held = 25

        (sidecar,) = cluster.pods("Deployment", "outbox-relay-sidecar")
        relays = cluster.pods("Deployment", "outbox-relay", replicas=3)
        async with AsyncExitStack() as stack:
            for pod in [sidecar, *relays]:
                await stack.enter_async_context(running(pod, tmp_path))
            for pod in relays:
                await _until(lambda p=pod: _is(p, "/readyz", 200), f"{pod.name} ready")
            await _until(lambda: _is(sidecar, "/livez", 200), "the sidecar live")
            # The image's HEALTHCHECK, run with each pod's environment, finds its server.
            for pod in [sidecar, *relays]:
                check = Pod(pod.name, image["healthcheck"], pod.env, pod.port)
                assert await run_once(check) == (0, ""), pod.name

            # Three relays publish: once the lanes are shared, each records some events.
            await _until(
                lambda: _count_is(admin, _LANES_SHARED, 3), "the lanes shared by three relays"
            )
            events = 300
            await admin.execute(_EVENTS, events)
            await _until(
                lambda: _count_is(admin, "SELECT count(*) FROM outbox_receipt", events),
                "every event published",
            )
            instances = [p.env["OUTBOX_RELAY_INSTANCE_ID"] for p in relays]
            await _until(lambda: _published_by_each(admin, instances), "every relay publishing")
            await admin.execute(_HELD_EVENTS, held)
            await _until(lambda: _pending_seen(sidecar, held), "the sidecar seeing the backlog")
            # A writer's transaction stays open across the scrapes, so that every measurement
            # has a value (an age is left out while there is nothing to measure).
            writer = await asyncpg.connect(empty_database_url)
            try:
                await writer.execute("BEGIN")
                await writer.execute(_EVENTS, 1)
                await _until(
                    lambda: _measured(sidecar, "relay:oldest_blocking_transaction_age"),
                    "the sidecar seeing the open writer",
                )
                # The sidecar classifies every family. Every metric a rule reads is in the
                # scrapes of the deployed shape; nothing fires; the backlog is the table's.
                await _until(lambda: _within(sidecar), "the sidecar within bounds")
                targets = await _targets([sidecar, *relays], rendered, seconds=2.0)
            finally:
                await writer.close()  # its transaction rolls back
            exported = {"up"} | {name for t in targets for name in promtool.series_names(t.last)}
            unread = {
                rule["alert"]: sorted(metric_names(rule["expr"]) - exported)
                for rule in _rules()
                if metric_names(rule["expr"]) - exported
            }
            assert unread == {}
            pending = await admin.fetchval(
                "SELECT count(*) FROM outbox WHERE quarantined_at IS NULL"
            )
            assert pending == held
            _judge(rendered, targets, {}, tmp_path, _backlog_queries(pending))

            # A stalled scoring queue: the sidecar says so, the relays stay ready.
            await admin.execute(_STALLED_JOB)
            await _until(
                lambda: _says(sidecar, "scoring_jobs", "stalled"), "the sidecar saying stalled"
            )
            for pod in relays:
                assert await _status(pod, "/readyz") == 200, pod.name
                assert await _status(pod, "/livez") == 200, pod.name
                document = await _health(pod)
                assert _classification(document, "scoring_jobs") is None
            targets = await _targets([sidecar, *relays], rendered, seconds=2.0)
            _judge(rendered, targets, {"OutboxRelayScoringJobsStalled": 1}, tmp_path)
            # Gone from discovery: without the sidecar no family is judged, and that fires;
            # without anything, the relays' absence fires too.
            _judge(rendered, targets[1:], {"OutboxRelayHealthAbsent": 1}, tmp_path)
            _judge(
                rendered,
                [],
                {"OutboxRelayHealthAbsent": 1, "OutboxRelayRelaysAbsent": 1},
                tmp_path,
            )

            # The relays read no database-wide state: PostgreSQL's own statement counts
            # show none of the whole-table or whole-server reads under the relays' role,
            # while the sidecar's role made them.
            reads = {
                role: await admin.fetchval(_DATABASE_WIDE_READS, cluster.roles[role])
                for role in ("relay-url", "sidecar-url")
            }
            assert reads["relay-url"] == 0 and reads["sidecar-url"] > 0, reads
            # Nor does a relay keep a health session: it has nothing to evaluate.
            sessions = {
                role: await admin.fetchval(_HEALTH_SESSIONS, cluster.roles[role])
                for role in ("relay-url", "sidecar-url")
            }
            assert sessions["relay-url"] == 0 and sessions["sidecar-url"] > 0, sessions
            for text in await _scrape(relays):
                for name in ("outbox_relay_pending_events", "outbox_relay_health_classification{"):
                    assert name not in text
    finally:
        for role in roles:
            await admin.execute(f'DROP OWNED BY "{role}" CASCADE')
        await admin.execute(f'ALTER DATABASE "{database}" OWNER TO CURRENT_USER')
        for role in roles:
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
        await admin.close()


async def _is(pod: Pod, path: str, status: int) -> bool:
    return await _status(pod, path) == status


async def _count_is(conn: asyncpg.Connection, query: str, expected: int) -> bool:
    return bool(await conn.fetchval(query) == expected)


async def _published_by_each(conn: asyncpg.Connection, instances: list[str]) -> bool:
    rows = await conn.fetch(
        "SELECT instance_id, published_total FROM relay_instance WHERE instance_id = ANY($1)",
        instances,
    )
    return len(rows) == len(instances) and all(row["published_total"] > 0 for row in rows)


async def _within(pod: Pod) -> bool:
    try:
        document = await _health(pod)
    except (OSError, ValueError):
        return False
    families = ("outbox", "scoring_jobs", "completion_outbox", "relay")
    return all(_classification(document, f) == "within_bounds" for f in families)


async def _measured(pod: Pod, check: str) -> bool:
    try:
        checks = (await _health(pod))["checks"].get(check)
    except (OSError, ValueError):
        return False
    return bool(checks) and checks[0].get("observedValue") is not None


async def _pending_seen(pod: Pod, pending: int) -> bool:
    try:
        checks = (await _health(pod))["checks"].get("outbox:pending_count")
    except (OSError, ValueError):
        return False
    return bool(checks) and checks[0]["observedValue"] == pending


async def _says(pod: Pod, family: str, classification: str) -> bool:
    try:
        return _classification(await _health(pod), family) == classification
    except (OSError, ValueError):
        return False
