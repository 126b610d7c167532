"""The monitoring kit in docs/monitoring as tests read it: the alert rules, the dashboard's
queries, and the metric names a PromQL expression reads."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "docs" / "monitoring" / "dashboard.json"

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


def rules() -> list[dict[str, Any]]:
    """Every alert rule of alerts.yaml, all groups together."""
    document = yaml.safe_load(ALERTS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    """The PromQL of every panel of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
