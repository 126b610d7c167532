"""The health sidecar: evaluates on an interval, caches the report, serves it over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Protocol, Self

import asyncpg
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from contracts import __version__
from contracts.health import Classification, HealthReport
from contracts.policy import Policy
from health.evaluate import evaluate, unknown_report
from health.families.completion_tracker import RECHECK_PERIOD_MS, CompletionTracker
from health.http import HTTPServer, Request, Response, problem
from health.metrics import HealthCollector, HealthCounters
from health.render import encode_json, health_document, report_status, status_page
from health.rules import mark_stale

logger = logging.getLogger("health")

HEALTH_JSON = "application/health+json"
_TEXT = "text/plain; charset=utf-8"
_HTML = "text/html; charset=utf-8"
_POOL_SIZE = 2


class RelayProbe(Protocol):
    """What the sidecar asks an in-process relay; both calls must be cheap and never block."""

    def live(self) -> bool:
        """The relay's loops are ticking."""
        ...

    def ready(self) -> bool:
        """The relay can do its job now (database and broker reachable, lanes acquired)."""
        ...


class HealthSidecar:
    """Evaluates health every ``policy.evaluation.interval_ms`` and serves it until cancelled."""

    def __init__(
        self,
        *,
        database_url: str | None,
        policy: Policy,
        listen: tuple[str, int],
        registry: CollectorRegistry,
        relay: RelayProbe | None = None,
        receipt_retention_ms: int | None = None,
        http_io_timeout: float = 2.0,
        http_max_connections: int = 256,
        completion_recheck_period_ms: int = RECHECK_PERIOD_MS,
    ) -> None:
        self._database_url = database_url
        self._policy = policy
        self._registry = registry
        self._relay = relay
        self._receipt_retention_ms = receipt_retention_ms
        settings = policy.evaluation
        self._interval = settings.interval_ms / 1000
        self._timeout = settings.timeout_ms / 1000
        self._server = HTTPServer(
            listen,
            self._handle,
            io_timeout=http_io_timeout,
            max_connections=http_max_connections,
        )
        self._counters = HealthCounters()
        self._collector = HealthCollector(self.report, self._counters, policy.enabled_families())
        self._pool: asyncpg.Pool | None = None
        # Incremental completion_outbox state: in memory only, never logged or served.
        self._completion = CompletionTracker(recheck_period_ms=completion_recheck_period_ms)
        self._last: tuple[HealthReport, float] | None = None
        self._last_tick: float | None = None
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
                self._database_url,
                min_size=0,
                max_size=_POOL_SIZE,
                timeout=self._timeout,
                command_timeout=self._timeout,
                server_settings={
                    "application_name": "outbox-relay-health",
                    "default_transaction_read_only": "on",
                },
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
            await asyncio.wait_for(pool.close(), self._timeout)
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
            await self.evaluate_once()
            self._last_tick = loop.time()
            await asyncio.sleep(max(0.0, self._interval - (loop.time() - started)))

    async def evaluate_once(self) -> HealthReport:
        """Run one evaluation now, cache it and return it."""
        if self._pool is None:
            raise RuntimeError("enter the sidecar before evaluating")
        try:
            async with asyncio.timeout(self._timeout):
                report = await evaluate(
                    self._pool,
                    self._policy,
                    receipt_retention_ms=self._receipt_retention_ms,
                    completion=self._completion,
                )
        except TimeoutError:
            report = unknown_report(self._policy, "evaluation timed out")
        if any(result.evidence is None for result in report.families):
            # Any probe error: the incremental state may have missed something; start over.
            self._completion.reset()
        self._record(report)
        async with self._evaluated:
            self._evaluated.notify_all()
        return report

    def _record(self, report: HealthReport) -> None:
        previous = (
            {r.family: r.classification for r in self._last[0].families} if self._last else {}
        )
        self._last = (report, asyncio.get_running_loop().time())
        self._counters.evaluations += 1
        for result in report.families:
            if result.evidence is None:
                self._counters.probe_failures[result.family] += 1
            if previous.get(result.family) is not result.classification:
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
        return mark_stale(report, age_ms, self._policy.evaluation.max_evidence_age_ms)

    def live(self) -> bool:
        """The evaluation loop ticks (its iterations are bounded) and the relay says it is live."""
        if self._last_tick is None:
            return False
        window = 2 * (self._interval + self._timeout)
        ticking = asyncio.get_running_loop().time() - self._last_tick <= window
        return ticking and (self._relay is None or self._relay.live())

    def ready(self) -> bool:
        """The relay can work and every readiness-gating family is within bounds."""
        report = self.report()
        if report is None or report.readiness is not Classification.WITHIN_BOUNDS:
            return False
        return self._relay is None or self._relay.ready()

    async def _handle(self, request: Request) -> Response:
        if request.path == "/livez":
            if self.live():
                return Response(200, _TEXT, b"ok\n")
            return problem(503, "a loop of this process stopped ticking")
        if request.path == "/readyz":
            return self._readyz()
        if request.path == "/health":
            report = self.report()
            document = health_document(report, release=__version__)
            status = 503 if report_status(report) == "fail" else 200
            return Response(status, HEALTH_JSON, encode_json(document))
        if request.path == "/metrics":
            return Response(200, CONTENT_TYPE_LATEST, generate_latest(self._registry))
        if request.path == "/":
            page = status_page(self.report(), live=self.live(), ready=self.ready())
            return Response(200, _HTML, page.encode("utf-8"))
        return problem(404, "unknown path; see /, /livez, /readyz, /health, /metrics")

    def _readyz(self) -> Response:
        if self.ready():
            return Response(200, _TEXT, b"ready\n")
        causes = []
        if self._relay is not None and not self._relay.ready():
            causes.append("relay not ready")
        report = self.report()
        if report is None:
            causes.append("no health evaluation yet")
        else:
            causes.extend(
                f"{r.family.value} {r.classification.value}"
                for r in report.families
                if r.gates_readiness and r.classification is not Classification.WITHIN_BOUNDS
            )
        return problem(503, "not ready: " + ", ".join(causes))
