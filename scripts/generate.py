"""Files made from a source in this repository, so that each fact has one home:

- deploy/base/prometheusrule.yaml: docs/monitoring/alerts.yaml's groups as a
  Prometheus-operator PrometheusRule;
- deploy/base/grafana-dashboard.yaml: docs/monitoring/dashboard.json as a ConfigMap that
  Grafana's dashboard sidecar loads (kube-prometheus-stack's label, ``grafana_dashboard``);
- docs/schemas/*.schema.json: the JSON Schemas of the scoring events, from contracts/envelope.py.

``python -m scripts.generate`` (``make generate``) writes them; ``--check`` writes nothing and
exits 1 naming each file that differs from what its source makes.
tests/unit/test_generated.py runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from contracts.envelope import envelope_json_schema, outcome_event_json_schema

REPO = Path(__file__).resolve().parents[1]
ALERTS = REPO / "docs" / "monitoring" / "alerts.yaml"
DASHBOARD = REPO / "docs" / "monitoring" / "dashboard.json"
SCHEMAS = REPO / "docs" / "schemas"
# kube-prometheus-stack's Grafana sidecar loads every ConfigMap with this label and value
# (its values.yaml: grafana.sidecar.dashboards.label / labelValue), in every namespace.
GRAFANA_DASHBOARD_LABEL = ("grafana_dashboard", "1")


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as a person would write them."""


def _string(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _string)


def _yaml(header: str, document: dict[str, Any]) -> str:
    body = yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=1000, allow_unicode=True)
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.strip().splitlines())
    return comment + body


def prometheus_rule() -> str:
    """The alerting rules as a PrometheusRule."""
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return _yaml(
        """
Generated from docs/monitoring/alerts.yaml by `make generate`: edit that file, not this one.
The rules as a Prometheus-operator PrometheusRule. Its runbook links' base is replaced by the
overlay's OUTBOX_RELAY_RUNBOOK_URL, and kube-prometheus-stack selects it by the overlay's
`release` label (deploy/overlays/example/kustomization.yaml).
""",
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "outbox-relay"},
            "spec": {"groups": groups},
        },
    )


def grafana_dashboard() -> str:
    """The dashboard as a ConfigMap for Grafana's sidecar."""
    text = DASHBOARD.read_text(encoding="utf-8")
    json.loads(text)  # a broken dashboard is refused here, not by Grafana
    label, value = GRAFANA_DASHBOARD_LABEL
    return _yaml(
        """
Generated from docs/monitoring/dashboard.json by `make generate`: edit that file, not this one.
The dashboard for Grafana's sidecar, which loads every ConfigMap labelled grafana_dashboard=1
(kube-prometheus-stack's default, in every namespace).
""",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "outbox-relay-dashboard", "labels": {label: value}},
            "data": {"outbox-relay.json": text},
        },
    )


def _schema(schema: dict[str, Any], title: str) -> str:
    # Self-contained (every reference is into its own $defs), so it needs no $id.
    document = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title, **schema}
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def outcome_event_schema() -> str:
    """The JSON Schema of a scoring outcome event: the Kafka record's value."""
    return _schema(
        outcome_event_json_schema(),
        "A scoring outcome event: the value of a record on outbox.event.scoring_job",
    )


def envelope_schema() -> str:
    """The JSON Schema of the integration envelope alone."""
    return _schema(
        envelope_json_schema(),
        "The integration envelope of a scoring outcome event",
    )


GENERATED: dict[Path, Callable[[], str]] = {
    REPO / "deploy" / "base" / "prometheusrule.yaml": prometheus_rule,
    REPO / "deploy" / "base" / "grafana-dashboard.yaml": grafana_dashboard,
    SCHEMAS / "scoring-outcome-event.schema.json": outcome_event_schema,
    SCHEMAS / "envelope.schema.json": envelope_schema,
}


def stale() -> list[Path]:
    """The generated files whose content differs from what their source makes now."""
    return [
        path
        for path, make in GENERATED.items()
        if not path.is_file() or path.read_text(encoding="utf-8") != make()
    ]


def main(argv: list[str] | None = None) -> int:
    """Write the generated files, or with ``--check`` only say which are stale."""
    parser = argparse.ArgumentParser(prog="python -m scripts.generate", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        found = stale()
        for path in found:
            print(f"stale: {path.relative_to(REPO)} (run make generate)", file=sys.stderr)
        return 1 if found else 0
    for path, make in GENERATED.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
