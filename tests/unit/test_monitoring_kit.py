"""docs/monitoring: the alerting rules and the dashboard's queries parse as PromQL (and the
rules pass promtool where it is installed),
every family and the relay have alerts, every runbook link lands on an anchor of
docs/operations.md. That every metric they name is really exported is
tests/operator/test_monitoring_scrape.py, against a running relay and sidecar."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from contracts.policy import Family

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "docs" / "monitoring" / "dashboard.json"
RUNBOOK = REPO / "docs" / "operations.md"

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


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_every_rule_is_complete_and_its_runbook_link_lands() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    groups = document["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', RUNBOOK.read_text()))
    names = []
    bases: set[str] = set()
    for rule in rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        assert rule["labels"]["severity"] in {"page", "ticket", "info"}, rule
        assert rule["annotations"]["summary"], rule
        link = rule["annotations"]["runbook_url"]
        base, _, anchor = link.partition("#")
        bases.add(base)
        assert anchor in anchors, rule
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule
        assert metric_names(rule["expr"]), rule
        names.append(rule["alert"])
    assert len(set(names)) == len(names)
    # One runbook base for every rule, absolute, so one replacement (deploy/'s overlay, or
    # the sed line in the file's header) points them all at your copy.
    (base,) = bases
    assert base.startswith("https://") and base.endswith("/operations.md")


def test_every_rule_and_panel_selects_the_job() -> None:
    # Every selector names the job (rules) or the dashboard's job and namespace variables,
    # so two deployments in one Prometheus never mix.
    for rule in rules():
        for selector in re.findall(r"\b[a-z_]+\{[^}]*\}", rule["expr"]):
            assert 'job="outbox-relay"' in selector, (rule["alert"], selector)
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            assert re.search(rf'{name}\{{job=~"\$job", namespace=~"\$namespace"', expr), expr
    variables = {v["name"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert {"datasource", "job", "namespace"} <= variables


def test_database_wide_conditions_are_aggregated_across_processes() -> None:
    # A family's gauges and classifications are the same in every process that reports
    # them: aggregated by namespace and job, never per instance, so they fire once.
    for rule in rules():
        if rule["labels"].get("family"):
            assert rule["expr"].startswith("max by (namespace, job) ("), rule["alert"]


def test_every_dashboard_query_reads_a_metric() -> None:
    exprs = dashboard_exprs()
    assert exprs
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        assert metric_names(expr), expr


def test_every_rule_and_dashboard_query_is_promql() -> None:
    # A port of Prometheus's own parser (promql-parser): runs everywhere, where promtool
    # (below) needs a Go toolchain and a build of Prometheus.
    exprs = [rule["expr"] for rule in rules()] + dashboard_exprs()
    assert len(exprs) > 10
    for expr in exprs:
        try:
            promql_parser.parse(expr)
        except ValueError as exc:
            raise AssertionError(f"{expr!r}: {exc}") from None


@pytest.mark.parametrize(
    "broken", ["rate(x_total[5mm])", "sum by (a (x)", "x > > 1", "histogram_quantile(0.9 x)"]
)
def test_the_parser_refuses_what_prometheus_would(broken: str) -> None:
    with pytest.raises(ValueError, match=r"\w"):  # with a message saying why
        promql_parser.parse(broken)


def test_every_family_has_a_stalled_and_an_unknown_alert() -> None:
    for family in Family:
        for classification in ("stalled", "unknown"):
            wanted = f'family="{family.value}", classification="{classification}"'
            assert any(wanted in rule["expr"] for rule in rules()), (family, classification)


def _promtool() -> str | None:
    explicit = os.environ.get("PROMTOOL")
    if explicit:
        return explicit
    found = shutil.which("promtool")
    if found:
        return found
    installed = Path(os.environ.get("GOPATH", Path.home() / "go")) / "bin" / "promtool"
    return str(installed) if installed.exists() else None


def test_promtool_accepts_therules() -> None:
    promtool = _promtool()
    if promtool is None:
        pytest.skip(
            "promtool not installed (go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0"
            " or PROMTOOL=path); the parser tests above still run"
        )
    checked = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
