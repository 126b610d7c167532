"""Every generated file is what its source makes now (scripts/generate.py, `make generate`):
deploy/'s PrometheusRule is docs/monitoring/alerts.yaml's groups, deploy/'s dashboard
ConfigMap is docs/monitoring/dashboard.json, docs/schemas/ are the contract's JSON Schemas;
and a source changed without regenerating is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from contracts.envelope import envelope_json_schema, outcome_event_json_schema
from scripts import generate

BASE = generate.REPO / "deploy" / "base"


def test_nothing_generated_is_stale() -> None:
    assert generate.stale() == []
    assert generate.main(["--check"]) == 0


def test_the_prometheusrule_holds_the_rules_file_groups() -> None:
    rule = yaml.safe_load((BASE / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule"
    assert rule["spec"]["groups"] == yaml.safe_load(generate.ALERTS.read_text())["groups"]


def test_the_dashboard_configmap_holds_the_dashboard_for_grafanas_sidecar() -> None:
    config_map = yaml.safe_load((BASE / "grafana-dashboard.yaml").read_text())
    assert config_map["metadata"]["labels"] == {"grafana_dashboard": "1"}
    (text,) = config_map["data"].values()
    assert json.loads(text) == json.loads(generate.DASHBOARD.read_text())


@pytest.mark.parametrize(
    ("name", "schema"),
    [
        ("scoring-outcome-event.schema.json", outcome_event_json_schema),
        ("envelope.schema.json", envelope_json_schema),
    ],
)
def test_the_schema_files_are_the_contracts(name: str, schema: object) -> None:
    document = json.loads((generate.SCHEMAS / name).read_text())
    assert document.pop("$schema") == "https://json-schema.org/draft/2020-12/schema"
    document.pop("title")
    assert callable(schema)
    assert document == schema()


def test_a_source_changed_without_regenerating_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = tmp_path / "alerts.yaml"
    changed.write_text(generate.ALERTS.read_text().replace("for: 2m", "for: 3m", 1))
    monkeypatch.setattr(generate, "ALERTS", changed)
    assert generate.stale() == [BASE / "prometheusrule.yaml"]
    assert generate.main(["--check"]) == 1
    assert "stale: deploy/base/prometheusrule.yaml (run make generate)" in capsys.readouterr().err
