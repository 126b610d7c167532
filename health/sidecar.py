"""The health sidecar: evaluates on an interval, caches the report, serves it over HTTP.

It never needs the database to start: the pool opens no connection up front, so a database
that is unreachable, refuses the login or is not migrated yet is served as ``unknown``
with a secret-free reason while ``/livez`` stays 200. While the database is in such a
state the sidecar retries with a doubling back-off (from the evaluation interval up to
``database_retry_max_ms``), serves the last answer as current in between, and logs each
change of the database's state once rather than every retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from types import TracebackType
from typing import Protocol, Self

import asyncpg
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from contracts import __version__
from contracts.health import Classification, HealthReport
from contracts.policy import Family
from health import schema
from health.config import SidecarConfig
from health.evaluate import evaluate_pool, reissue, unknown_report
from health.families.completion_tracker import CompletionTracker
from health.families.relay import while_starting
from health.history import History
from health.http import HTTPServer, Request, Response, problem
from health.metrics import HealthCollector, HealthCounters
from health.notify_queue import read_queue_usage
from health.probing import CONNECT_ERRORS, NOT_MIGRATED
from health.render.document import encode_json, health_document
from health.render.page import status_page
from health.rules import mark_stale
from pgconnect import pool_options
from pgconnect.schema import SCHEMA_BEHIND, SchemaNeeds, ShortfallLog

logger = logging.getLogger("health")

HEALTH_JSON = "application/health+json"
_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"
_POOL_SIZE = 2
_PAGE_POLICY = (
    "Content-Security-Policy",
    "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'",
)
# The sidecar's sessions: read-only, every probe on its index whatever the statistics say,
# each statement with parameters on its cached generic plan, no JIT, no parallel workers
# (docs/health.md, "How the completion check scales", says why each). No bitmap scans and
# no sorts: the pending outbox rows are then read in write-time order by a plain index
# scan, which marks the entries of rows the relay deleted as dead, so the next probe steps
# over them (docs/health.md, "What the probes read"). Behind a transaction pooler only
# application_name reaches the server, and the sidecar's role is read-only by its grants.
SIDECAR_SESSION_SETTINGS = {
    "application_name": "outbox-relay-health",
    "default_transaction_read_only": "on",
    "enable_bitmapscan": "off",
    "enable_seqscan": "off",
    "enable_sort": "off",
    "jit": "off",
    "max_parallel_workers_per_gather": "0",
    "plan_cache_mode": "force_generic_plan",
}
# The longest a stopping sidecar waits for its connections to close before dropping them.
_CLOSE_TIMEOUT_S = 0.5
_NOT_MIGRATED_STATE = "database is not migrated: run `outbox-relay migrate`"


class RelayProbe(Protocol):
    """What the sidecar asks an in-process relay; both calls must be cheap and never block."""

    def live(self) -> bool:
        """The relay's loops are ticking."""
        ...

    def ready(self) -> bool:
        """The relay can do its job now (database and broker reachable, lanes acquired).

        True implies its lane round has run at least once: that ends ``starting``.
        """
        ...

    def waiting_for(self) -> str | None:
        """What the database lacks before the relay may start (None: nothing): one line."""
        ...


class HealthSidecar:
    """Evaluates health every ``policy.evaluation.interval_ms`` and serves it until cancelled."""

    def __init__(
        self,
        config: SidecarConfig,
        *,
        registry: CollectorRegistry,
        relay: RelayProbe | None = None,
        published: Callable[[], int] | None = None,
    ) -> None:
        """``relay``: the relay in this process, if any; ``published``: its published-events
        counter, read at each evaluation for the status page's publish rate."""
        self._config = config
        policy = config.policy
        self._registry = registry
        self._relay = relay
        settings = policy.evaluation
        self._interval = settings.interval_ms / 1000
        self._timeout = settings.timeout_ms / 1000
        self._server = HTTPServer(
            config.listen,
            self._handle,
            io_timeout=config.http_io_timeout_ms / 1000,
            max_connections=config.http_max_connections,
        )
        self._counters = HealthCounters()
        # The cluster's NOTIFY queue, as last read (None: not read, or the read failed).
        self._queue_usage: float | None = None
        self._collector = HealthCollector(
            self.report,
            self._counters,
            policy.enabled_families(),
            notification_queue_usage=lambda: self._queue_usage,
        )
        self._pool: asyncpg.Pool | None = None
        # Incremental completion_outbox state: in memory only, never logged or served.
        self._completion = CompletionTracker(
            recheck_period_ms=config.completion_recheck_period_ms,
            session_plans=not config.transaction_pooler,
        )
        self._last: tuple[HealthReport, float] | None = None
        # What the database must hold before the families are probed (health/schema.py);
        # None once it held it: a migration level does not go back.
        self._schema_needs: SchemaNeeds | None = schema.NEEDS
        self._schema_said = ShortfallLog()
        self._schema_behind: str | None = None  # what the schema lacks, while it does
        # The in-process relay's published-events counter, read at each evaluation for the
        # status page's publish rate; None without a relay in this process.
        self._published = published
        # The status page's chart: aggregates of the last minutes, in memory only.
        self._history = History(interval_ms=settings.interval_ms, publishing=published is not None)
        # Each family's classification as last logged (outages are logged as one line).
        self._logged: dict[Family, Classification] = {}
        # Why the database cannot be evaluated now (None: it can), and the back-off.
        self._database_problem: str | None = None
        self._retry_max = config.database_retry_max_ms / 1000
        self._retry_delay = 0.0
        self._retry_at: float | None = None
        self._last_tick: float | None = None
        # Until the in-process relay has had one chance to claim its lanes (it was ready
        # once, or the relay family's heartbeat bound has passed since start), a stalled
        # relay family is served as unknown/starting.
        self._relay_starting = relay is not None and policy.relay is not None
        self._started_at: float | None = None
        self._evaluated = asyncio.Condition()

    @property
    def address(self) -> tuple[str, int]:
        """The bound HTTP address (the real port when 0 was asked for)."""
        return self._server.address

    async def __aenter__(self) -> Self:
        # Bind first: a taken port is a start-up error, not something to retry.
        await self._server.__aenter__()
        try:
            # min_size=0: nothing connects here, so a database that is down at start
            # shows up as unknown health instead of a crash; the pool reconnects itself.
            self._pool = await asyncpg.create_pool(
                self._config.database_url,
                min_size=0,
                max_size=_POOL_SIZE,
                # Connecting gets half the evaluation's budget: a database that never
                # answers is then named (unavailable: timed out) and backed off, instead
                # of the whole evaluation timing out on the connection attempt.
                timeout=self._timeout / 2,
                command_timeout=self._timeout,
                # No session state to reset on release (settings come with the login,
                # SET LOCAL ends with its transaction, no LISTEN, no session locks): one
                # round trip less per evaluation.
                **pool_options(
                    SIDECAR_SESSION_SETTINGS,
                    transaction_pooler=self._config.transaction_pooler,
                    session_state=False,
                ),
            )
            self._registry.register(self._collector)
        except BaseException:
            await self._close_pool()
            await self._server.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(KeyError):  # registration failed in __aenter__
            self._registry.unregister(self._collector)
        await self._server.close()
        await self._close_pool()

    async def _close_pool(self) -> None:
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        try:
            # A server that answers closes at once; one whose path stalled never does, and
            # must not hold the process past its drain timeout.
            await asyncio.wait_for(pool.close(), min(self._timeout, _CLOSE_TIMEOUT_S))
        except TimeoutError:
            pool.terminate()

    async def run(self) -> None:
        """Evaluate and serve until cancelled; if either loop dies the other is stopped too."""
        loop = asyncio.get_running_loop()
        self._last_tick = loop.time()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._evaluate_forever(), name="health-evaluate")
            tasks.create_task(self._server.serve_forever(), name="health-http")

    async def _evaluate_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            self._last_tick = started
            if self._retry_at is not None and started < self._retry_at:
                self._serve_again()  # backing off: no attempt this tick
            else:
                await self.evaluate_once()
            self._last_tick = loop.time()
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    async def evaluate_once(self) -> HealthReport:
        """Run one evaluation now, cache it and return it."""
        if self._pool is None:
            raise RuntimeError("enter the sidecar before evaluating")
        unreachable: str | None = None
        try:
            async with asyncio.timeout(self._timeout):
                report, unreachable = await evaluate_pool(
                    self._pool,
                    self._config.policy,
                    receipt_retention_ms=self._config.receipt_retention_ms,
                    completion=self._completion,
                    schema=self._schema_needs,
                )
        except TimeoutError:
            report = unknown_report(self._config.policy, "evaluation timed out")
        self._schema_state(report)
        if self._still_starting():
            report = while_starting(report)
        if any(result.evidence is None for result in report.families):
            # Any probe error: the incremental state may have missed something; start over.
            self._completion.reset()
        not_migrated = any(NOT_MIGRATED in result.reasons for result in report.families)
        self._database_state(unreachable or (_NOT_MIGRATED_STATE if not_migrated else None))
        if self._config.policy.enabled_families():  # database-wide, like the families' gauges
            self._queue_usage = None if unreachable else await self._read_queue_usage()
        self._record(report)
        async with self._evaluated:
            self._evaluated.notify_all()
        return report

    async def _read_queue_usage(self) -> float | None:
        """The NOTIFY queue's usage now; None when it cannot be read (the families' own
        probes say why the database cannot be evaluated)."""
        assert self._pool is not None
        try:
            async with asyncio.timeout(self._timeout), self._pool.acquire() as conn:
                return await read_queue_usage(conn)
        except CONNECT_ERRORS:
            return None

    def _schema_state(self, report: HealthReport) -> None:
        """Say what the schema lacks (once, and again at most once a minute while it lasts);
        stop checking once an evaluation got past the check. An evaluation that reached
        neither (the database unreachable) changes nothing."""
        if self._schema_needs is None:
            return
        behind = next(
            (r.reasons[1] for r in report.families if r.reasons[:1] == (SCHEMA_BEHIND,)), None
        )
        if behind is None and all(r.evidence is None for r in report.families):
            return
        self._schema_behind = behind
        if self._schema_said.due(behind):
            if behind is None:
                logger.info("health schema ready; the families are probed")
            else:
                logger.warning(
                    "health %s: %s; every family is unknown until then", SCHEMA_BEHIND, behind
                )
        if behind is None:
            self._schema_needs = None

    def _still_starting(self) -> bool:
        """Whether the in-process relay has yet to have its first chance to claim lanes."""
        if not self._relay_starting:
            return False
        assert self._relay is not None and self._config.policy.relay is not None  # see __init__
        now = asyncio.get_running_loop().time()
        if self._started_at is None:
            self._started_at = now
        grace = self._config.policy.relay.max_heartbeat_age_ms / 1000
        if self._relay.ready() or now - self._started_at > grace:
            self._relay_starting = False
        return self._relay_starting

    def _database_state(self, problem: str | None) -> None:
        """Log a change of the database's state once, and schedule the next attempt."""
        loop = asyncio.get_running_loop()
        if problem is None:
            if self._database_problem is not None:
                logger.info("health database reachable again")
            self._database_problem, self._retry_at, self._retry_delay = None, None, 0.0
            return
        if problem != self._database_problem:
            # The reason is built from error kinds only: never the URL or driver text.
            logger.warning("health %s; retrying with back-off up to %g s", problem, self._retry_max)
        if self._database_problem is None:
            self._retry_delay = self._interval
        else:
            self._retry_delay = max(self._interval, min(2 * self._retry_delay, self._retry_max))
        self._database_problem = problem
        self._retry_at = loop.time() + self._retry_delay

    def _serve_again(self) -> None:
        # The last answer is still the truth until the next attempt: serve it as current
        # (it is unknown) rather than let it turn stale and lose its reason.
        if self._last is not None:
            self._last = (reissue(self._last[0]), asyncio.get_running_loop().time())

    def _record(self, report: HealthReport) -> None:
        self._last = (report, asyncio.get_running_loop().time())
        self._history.record(
            report, published=self._published() if self._published is not None else None
        )
        self._counters.evaluations += 1
        for result in report.families:
            if result.evidence is None:
                self._counters.probe_failures[result.family] += 1
            if self._database_problem is not None or self._schema_behind is not None:
                continue  # one line says it for every family (_database_state, _schema_state)
            if self._logged.get(result.family) is not result.classification:
                self._logged[result.family] = result.classification
                # Reasons carry field names and numbers only, never identities.
                level = (
                    logging.INFO
                    if result.classification is Classification.WITHIN_BOUNDS
                    else logging.WARNING
                )
                logger.log(
                    level,
                    "health %s is %s%s",
                    result.family.value,
                    result.classification.value,
                    f": {'; '.join(result.reasons)}" if result.reasons else "",
                )

    async def next_report(self) -> HealthReport:
        """Wait for the next evaluation to finish and return its report."""
        async with self._evaluated:
            await self._evaluated.wait()
        report = self.report()
        assert report is not None  # an evaluation just finished
        return report

    def report(self) -> HealthReport | None:
        """The cached report as served now: every family unknown once the evidence is too old."""
        if self._last is None:
            return None
        report, at = self._last
        age_ms = int((asyncio.get_running_loop().time() - at) * 1000)
        return mark_stale(report, age_ms, self._config.policy.evaluation.max_evidence_age_ms)

    def live(self) -> bool:
        """The evaluation loop ticks (its iterations are bounded) and the relay says it is live."""
        if self._last_tick is None:
            return False
        window = 2 * (self._interval + self._timeout)
        ticking = asyncio.get_running_loop().time() - self._last_tick <= window
        return ticking and (self._relay is None or self._relay.live())

    def ready(self) -> bool:
        """The relay can work, the schema holds what the probes read, and every
        readiness-gating family is within bounds."""
        return not self._not_ready_causes(self.report())

    async def _handle(self, request: Request) -> Response:
        if request.path == "/livez":
            if self.live():
                return Response(200, _TEXT, b"ok\n")
            return problem(503, "a loop of this process stopped ticking")
        if request.path == "/readyz":
            return self._readyz()
        if request.path == "/health":
            report = self.report()
            # fail exactly when /readyz says 503, whatever this process runs
            causes = self._not_ready_causes(report)
            document = health_document(
                report, release=__version__, policy=self._config.policy, not_ready=causes
            )
            return Response(503 if causes else 200, HEALTH_JSON, encode_json(document))
        if request.path == "/metrics":
            return Response(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        if request.path == "/":
            page = status_page(
                self.report(),
                live=self.live(),
                ready=self.ready(),
                policy=self._config.policy,
                history=self._history,
                runbook_url=self._config.runbook_url,
            )
            # The page needs nothing but itself: say so, so a browser refuses any script
            # or fetch even if something slipped past the escaping.
            return Response(200, _HTML, page.encode("utf-8"), headers=(_PAGE_POLICY,))
        return problem(404, "unknown path; see /, /livez, /readyz, /health, /metrics")

    def _readyz(self) -> Response:
        causes = self._not_ready_causes(self.report())
        if not causes:
            return Response(200, _TEXT, b"ready\n")
        return problem(503, "not ready: " + ", ".join(causes))

    def _not_ready_causes(self, report: HealthReport | None) -> list[str]:
        """Why this process is not ready, one phrase each; empty exactly when :meth:`ready`."""
        causes = []
        if self._relay is not None and not self._relay.ready():
            waiting = self._relay.waiting_for()
            causes.append(f"relay not ready ({waiting})" if waiting else "relay not ready")
        if self._schema_behind is not None:
            # Whatever the families gate: a process below its schema does not work.
            causes.append(f"{SCHEMA_BEHIND} ({self._schema_behind})")
        if report is None:
            causes.append("no health evaluation yet")
        elif report.readiness is not Classification.WITHIN_BOUNDS:
            causes.extend(
                f"{r.family.value} {r.classification.value}"
                for r in report.families
                if r.gates_readiness and r.classification is not Classification.WITHIN_BOUNDS
            )
        return causes
