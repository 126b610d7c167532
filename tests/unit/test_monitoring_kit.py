"""docs/monitoring: the alerting rules parse, every family and the relay have alerts, every
runbook link lands on an anchor of docs/operations.md, and every metric the rules and the
dashboard name is one a running relay and sidecar really export on /metrics (and every
exported metric is on the dashboard)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from prometheus_client.parser import text_string_to_metric_families

from contracts.policy import Family
from tests.faults.harness import free_port
from tests.health.httpclient import get

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "docs" / "monitoring" / "dashboard.json"
RUNBOOK = REPO / "docs" / "operations.md"
HEALTH_DOC = REPO / "docs" / "health.md"

# Series Prometheus itself records for every scrape target, not exported by the product.
PROMETHEUS_SERIES = frozenset({"up"})

# -- a PromQL metric-name extractor (what the rules and panels read) ---------------------------
_STRINGS = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_NAME = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![a-zA-Z0-9_:])(?!\s*\()")
_KEYWORDS = frozenset(
    {"bool", "and", "or", "unless", "offset", "inf", "nan", "by", "without", "on", "ignoring"}
    | {"group_left", "group_right"}
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (functions, labels and keywords left out)."""
    text = _STRINGS.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    return {name for name in _NAME.findall(text) if name.lower() not in _KEYWORDS}


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('up{job="outbox-relay"} == 0', {"up"}),
        (
            "histogram_quantile(0.99, sum by (le) (rate(a_bucket[5m]))) > 0.025",
            {"a_bucket"},
        ),
        ("time() - b_seconds > 60", {"b_seconds"}),
        ('sum by (instance, family) (increase(c_total{family=~"o.t"}[10m])) > 1e3', {"c_total"}),
        ("max(x) == bool 1 and on (instance) y offset 5m", {"x", "y"}),
        ("rate(d_total[1m]) / ignoring (code) group_left e", {"d_total", "e"}),
    ],
)
def test_the_extractor_finds_metric_names_only(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_every_rule_is_complete_and_its_runbook_link_lands() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    groups = document["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', RUNBOOK.read_text()))
    names = []
    for rule in _rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}, rule
        assert rule["annotations"]["summary"], rule
        link = rule["annotations"]["runbook_url"]
        assert link.startswith("docs/operations.md#"), rule
        assert link.partition("#")[2] in anchors, rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule
        assert metric_names(rule["expr"]), rule
        names.append(rule["alert"])
    assert len(set(names)) == len(names)


def test_every_family_has_a_stalled_and_an_unknown_alert() -> None:
    for family in Family:
        for classification in ("stalled", "unknown"):
            wanted = f'family="{family.value}", classification="{classification}"'
            assert any(wanted in rule["expr"] for rule in _rules()), (family, classification)


def _promtool() -> str | None:
    explicit = os.environ.get("PROMTOOL")
    if explicit:
        return explicit
    found = shutil.which("promtool")
    if found:
        return found
    installed = Path(os.environ.get("GOPATH", Path.home() / "go")) / "bin" / "promtool"
    return str(installed) if installed.exists() else None


def test_promtool_accepts_the_rules() -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip(
            "promtool not installed (go install github.com/prometheus/prometheus/cmd/promtool@latest"
            " or PROMTOOL=path); the parser tests above still run"
        )
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- against a running relay and sidecar -------------------------------------------------------
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
    named_by_rules = {name for rule in _rules() for name in metric_names(rule["expr"])}
    named_by_dashboard = {name for expr in _dashboard_exprs() for name in metric_names(expr)}
    assert named_by_rules - exported - PROMETHEUS_SERIES == set()
    assert named_by_dashboard - exported - PROMETHEUS_SERIES == set()
    # The other way: every family the product exports is on the dashboard.
    on_dashboard = {
        family
        for family in families
        if any(name == family or name.startswith(family + "_") for name in named_by_dashboard)
    }
    assert families - on_dashboard == set()
    # And docs/health.md lists only metrics that exist.
    documented = set(re.findall(r"`(outbox_relay_[a-z_]+)", HEALTH_DOC.read_text()))
    assert documented - exported == set()
