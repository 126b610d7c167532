"""Every metric docs/monitoring's rules and dashboard name is one a running relay and
sidecar export on /metrics, every exported metric is on the dashboard, and docs/health.md
lists only metrics that exist."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from tests.support.http import get
from tests.support.monitoring_kit import PROMETHEUS_SERIES, dashboard_exprs, metric_names, rules
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
HEALTH_DOC = REPO / "docs" / "health.md"


@pytest_asyncio.fixture
async def scrape(
    database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> AsyncIterator[str]:
    """/metrics of `outbox-relay run` once its sidecar has finished an evaluation."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_RELAY_TOPIC_TEMPLATE": f"{topic_namespace}.{{aggregatetype}}",
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outbox_relay",
        "run",
        "--policy",
        str(REPO / "docs" / "policy.demo.toml"),
        "--listen",
        f"127.0.0.1:{port}",
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        text = ""
        async with asyncio.timeout(120):
            while "outbox_relay_health_last_evaluation_timestamp_seconds " not in text:
                await asyncio.sleep(0.5)
                try:
                    text = (await get(("127.0.0.1", port), "/metrics")).text
                except OSError:
                    continue
        yield text
    finally:
        process.terminate()
        await process.wait()


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


def exported_names(text: str) -> tuple[set[str], set[str]]:
    """Every series name a scrape can carry (declared families and their samples), and the
    families."""
    names: set[str] = set()
    families: set[str] = set()
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):
            # A counter's creation time, parsed as a family of its own: not a metric.
            names.add(family.name)
            continue
        families.add(family.name)
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names, families


async def test_every_metric_the_kit_names_is_exported(scrape: str) -> None:
    exported, families = exported_names(scrape)
    named_by_rules = {name for rule in rules() for name in metric_names(rule["expr"])}
    named_by_dashboard = {name for expr in dashboard_exprs() for name in metric_names(expr)}
    assert named_by_rules - exported - PROMETHEUS_SERIES == set()
    assert named_by_dashboard - exported - PROMETHEUS_SERIES == set()
    # The other way: every family the product exports is on the dashboard, and so are the
    # process collectors' memory, CPU and restarts.
    own = {family for family in families if family.startswith("outbox_relay_")}
    on_dashboard = {
        family
        for family in own
        if any(name == family or name.startswith(family + "_") for name in named_by_dashboard)
    }
    assert own - on_dashboard == set()
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total"} <= exported
    assert {"process_resident_memory_bytes", "process_start_time_seconds"} <= named_by_dashboard
    assert "outbox_relay_build_info" in families
    # And docs/health.md lists only metrics that exist.
    documented = set(re.findall(r"`(outbox_relay_[a-z_]+)", HEALTH_DOC.read_text()))
    assert documented - exported == set()
