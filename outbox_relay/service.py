"""``outbox-relay run``: the relay and the health sidecar as named tasks in one process.

If either dies the other is stopped and the process exits non-zero with a log line;
SIGTERM or SIGINT stops claiming work, waits for in-flight acknowledgements (bounded by
the drain timeout), records them, hands the lanes back and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from functools import partial

import anyio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from contracts import __version__
from health.sidecar import HealthSidecar
from outbox_relay.demo import DemoSystem, run_demo_workload
from outbox_relay.open_schema import check_schema_creators
from outbox_relay.settings import ServiceSettings
from outbox_relay.transport import PATHS, POSTGRES
from relay.engine import Relay
from relay.metrics import RelayMetrics

log = logging.getLogger("outbox_relay")


async def run_service(settings: ServiceSettings) -> int:
    """Run until a signal; returns the process exit code."""
    registry = CollectorRegistry()
    register_process_metrics(registry)
    config = settings.relay
    _say_unverified_transport(settings, registry)
    relay = None
    if config is not None:
        relay = Relay(config, RelayMetrics.register(registry, backlog=not settings.relay_only))
        relay.metrics.ready.set_function(partial(_as_gauge, relay.ready))
    stop = anyio.Event()
    sidecar = HealthSidecar(
        settings.sidecar,
        registry=registry,
        relay=relay,
        published=partial(_count, relay.metrics.published) if relay is not None else None,
    )
    # Read once at start; the relay claims no lane before (outbox_relay/open_schema.py).
    schema_checked = anyio.Event()
    async with sidecar, anyio.create_task_group() as tasks:
        tasks.start_soon(_watch_signals, stop, tasks.cancel_scope, relay is not None)
        tasks.start_soon(
            partial(
                check_schema_creators,
                settings.database_url,
                refuse=settings.refuse_open_schema,
                transaction_pooler=settings.transaction_pooler,
                retry_max_s=settings.sidecar.database_retry_max_ms / 1000,
                checked=schema_checked,
            ),
            name="schema-creators",
        )
        tasks.start_soon(sidecar.run, name="health")
        if relay is not None:
            tasks.start_soon(
                _relay_then_stop, relay, stop, tasks.cancel_scope, schema_checked, name="relay"
            )
        if settings.demo is not None and config is not None:
            # The demo stages its stories against this process's own relay and sidecar.
            tasks.start_soon(
                run_demo_workload,
                settings.database_url,
                settings.demo,
                DemoSystem(relay=config, health=sidecar),
                stop,
                name="demo",
            )
        host, port = settings.listen
        log.info(
            "started",
            extra={
                "relay": relay is not None,
                "relay_only": settings.relay_only,
                "listen": f"{host}:{port}",
                "instance_id": config.instance_id if config else None,
                # uvloop's, or the standard library's (outbox_relay/runtime.py)
                "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            },
        )
    log.info("stopped")
    return 0


def _say_unverified_transport(settings: ServiceSettings, registry: CollectorRegistry) -> None:
    """One warning line for the paths used without certificate verification, and a gauge
    per path this process uses (1: not verified)."""
    gauge = Gauge(
        "outbox_relay_unverified_transport",
        "1 when this network path is used without verifying the other end's certificate "
        "(PostgreSQL over TCP without sslmode verify-ca/verify-full, Kafka without TLS; "
        "Unix sockets and loopback addresses excepted)",
        ["path"],
        registry=registry,
    )
    unverified = {found.path: found.reason for found in settings.unverified_transport}
    for path in PATHS if settings.relay is not None else (POSTGRES,):
        gauge.labels(path).set(1 if path in unverified else 0)
    if unverified:
        log.warning(
            "connections without certificate verification: "
            "an attacker on the network path can read or change them",
            extra={f"{path}_transport": reason for path, reason in unverified.items()},
        )


def register_process_metrics(registry: CollectorRegistry) -> None:
    """The platform's usual series (process, Python, garbage collector) and the release."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Gauge(
        "outbox_relay_build_info",
        "Always 1; the release this process runs.",
        ["version"],
        registry=registry,
    ).labels(version=__version__).set(1)


def _count(counter: Counter) -> int:
    """A counter's value now, read through its public ``collect``."""
    return next(
        int(sample.value)
        for metric in counter.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


def _as_gauge(check: Callable[[], bool]) -> float:
    return 1.0 if check() else 0.0


async def _relay_then_stop(
    relay: Relay, stop: anyio.Event, scope: anyio.CancelScope, schema_checked: anyio.Event
) -> None:
    await relay.run(stop, may_claim=schema_checked)
    scope.cancel()


async def _watch_signals(stop: anyio.Event, scope: anyio.CancelScope, draining: bool) -> None:
    """First signal: stop (the relay drains, then cancels the rest). Second: stop now."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("stopping", extra={"signal": signal.Signals(signum).name})
            if stop.is_set() or not draining:
                scope.cancel()
                return
            stop.set()
