"""docs/monitoring: the alerting rules pass promtool's check and its unit tests
(alerts.test.yaml: every alert quiet, firing and resolved), a planted change to a rule fails
them; the rules and the dashboard's queries parse as PromQL; every family and the relay
have alerts, with the severities kube-prometheus-stack routes on; each alert's runbook link
lands on its own entry of docs/operations.md. That every metric they name is really
exported is tests/operator/test_monitoring_scrape.py (plain `run`) and
tests/deploy/test_contract.py (the deployed shape), against running processes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from contracts.policy import Family
from tests.support import promtool
from tests.support.monitoring_kit import ALERTS, DASHBOARD, dashboard_exprs, metric_names, rules
from tests.unit.test_doc_links import _HEADING, _HTML_ID, github_slug, heading_text, prose_lines

REPO = Path(__file__).resolve().parents[2]
ALERT_TESTS = REPO / "docs" / "monitoring" / "alerts.test.yaml"
RUNBOOK = REPO / "docs" / "operations.md"

# kube-prometheus-stack's Alertmanager routes and inhibits on these (its values.yaml,
# alertmanager.config.inhibit_rules); `routing` is the product's own decision beside it.
SEVERITY_OF_ROUTING = {"page": "critical", "ticket": "warning", "info": "info"}
# The label deploy/'s PodMonitor copies from the pods' app.kubernetes.io/instance.
INSTALL = "app_kubernetes_io_instance"


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
        (
            "(absent(f{a='b'}) unless on () g) or (count by (a) (g) unless count by (a) (f))",
            {"f", "g"},
        ),
    ],
)
def test_the_extractor_finds_metric_names_only(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_rule_is_complete_and_routed_as_the_stack_routes() -> None:
    document = yaml.safe_load(ALERTS.read_text())
    groups = document["groups"]
    assert len({g["name"] for g in groups}) == len(groups)
    names = []
    bases: set[str] = set()
    for rule in rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule
        labels = rule["labels"]
        assert labels["severity"] == SEVERITY_OF_ROUTING[labels["routing"]], rule
        assert rule["annotations"]["summary"], rule
        base, _, _ = rule["annotations"]["runbook_url"].partition("#")
        bases.add(base)
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule
        assert metric_names(rule["expr"]), rule
        names.append(rule["alert"])
    assert len(set(names)) == len(names)
    # One runbook base for every rule, absolute, so one replacement (deploy/'s overlay, or
    # the sed line in the file's header) points them all at your copy.
    (base,) = bases
    assert base.startswith("https://") and base.endswith("/operations.md")


def landings(document: Path, anchor: str) -> list[str]:
    """The headings a link to ``#anchor`` can land on: the heading GitHub gives that id,
    and the first heading after an explicit ``<a id>`` of that name."""
    found, after_explicit = [], False
    for _, line in prose_lines(document.read_text(encoding="utf-8")):
        if anchor in _HTML_ID.findall(line):
            after_explicit = True
        heading = _HEADING.match(line)
        if heading is None:
            continue
        text = heading_text(heading.group(1)).strip()
        if after_explicit:
            found.append(text)
            after_explicit = False
        elif github_slug(heading.group(1)) == anchor:
            found.append(text)
    return found


def test_each_alert_links_its_own_runbook_entry() -> None:
    for rule in rules():
        anchor = rule["annotations"]["runbook_url"].partition("#")[2]
        assert anchor == rule["alert"].lower(), rule["alert"]
        # Exactly one place to land, and the heading there names the alert.
        assert landings(RUNBOOK, anchor) == [rule["alert"]], rule["alert"]
    entries = re.findall(r"^### (OutboxRelay\w+)$", RUNBOOK.read_text(), flags=re.M)
    assert sorted(entries) == sorted(rule["alert"] for rule in rules())


def test_the_landing_reader_sees_a_misplaced_anchor(tmp_path: Path) -> None:
    document = tmp_path / "runbook.md"
    document.write_text(
        '<a id="deployment"></a>\n## Sharing the database\n\ntext\n\n## Deployment\n\n'
        "### OutboxRelayDown\n"
    )
    assert landings(document, "deployment") == ["Sharing the database", "Deployment"]
    assert landings(document, "outboxrelaydown") == ["OutboxRelayDown"]


def test_every_rule_and_panel_selects_the_job() -> None:
    # Every selector names the job (rules) or the dashboard's job, namespace and install
    # variables, so two deployments in one Prometheus never mix.
    for rule in rules():
        for selector in re.findall(r"\b[a-z_]+\{[^}]*\}", rule["expr"]):
            assert 'job="outbox-relay"' in selector, (rule["alert"], selector)
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            wanted = rf'{name}\{{job=~"\$job", namespace=~"\$namespace", {INSTALL}=~"\$install"'
            assert re.search(wanted, expr), expr
    variables = {v["name"] for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert {"datasource", "job", "namespace", "install"} <= variables


def test_conditions_are_aggregated_per_install() -> None:
    # A family's gauges and classifications are the same in every process that reports
    # them: aggregated by namespace, job and install, never per process, so they fire once
    # per install; every other aggregation keeps the install too.
    for rule in rules():
        if rule["labels"].get("family"):
            assert rule["expr"].startswith(f"max by (namespace, job, {INSTALL}) ("), rule["alert"]
        for grouping in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            assert {"namespace", "job", INSTALL} <= set(re.split(r",\s*", grouping)), rule


def test_every_dashboard_query_reads_a_metric() -> None:
    exprs = dashboard_exprs()
    assert exprs
    for expr in exprs:
        assert expr.count("(") == expr.count(")"), expr
        assert metric_names(expr), expr


def test_every_rule_and_dashboard_query_is_promql() -> None:
    # A port of Prometheus's own parser (promql-parser), so the dashboard's queries are
    # checked where promtool is not installed; promtool checks the rules below.
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


# -- promtool ---------------------------------------------------------------------------------
def test_promtool_accepts_the_rules() -> None:
    checked = promtool.run("check", "rules", ALERTS)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout


def test_every_alert_passes_its_unit_tests() -> None:
    tested = promtool.run("test", "rules", ALERT_TESTS)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def _cases(document: dict[str, Any]) -> dict[str, list[tuple[int, bool]]]:
    """alert → (eval time in seconds, fires?) of every case that names it."""
    cases: dict[str, list[tuple[int, bool]]] = {}
    for group in document["tests"]:
        for case in group.get("alert_rule_test", []):
            seconds = _seconds(case["eval_time"])
            cases.setdefault(case["alertname"], []).append((seconds, bool(case["exp_alerts"])))
    return cases


def _seconds(duration: str) -> int:
    unit = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * unit[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def test_every_alert_is_tested_quiet_firing_and_resolved() -> None:
    document = yaml.safe_load(ALERT_TESTS.read_text())
    assert document["rule_files"] == [ALERTS.name]
    cases = _cases(document)
    assert set(cases) == {rule["alert"] for rule in rules()}
    for alert, answers in cases.items():
        answers.sort()
        fires = [t for t, firing in answers if firing]
        assert fires, f"{alert}: no case where it fires"
        quiet = [t for t, firing in answers if not firing]
        assert any(t < fires[0] for t in quiet), f"{alert}: no quiet case before it fires"
        assert any(t > fires[0] for t in quiet), f"{alert}: no case where it resolves"


@pytest.mark.parametrize(
    ("alert", "before", "after"),
    [
        ("OutboxRelayBlockingTransaction", "> 60", "> 600"),  # a threshold tuned too high
        ("OutboxRelayOutboxStalled", "for: 2m", "for: 5m"),  # waits longer than tested
        ("OutboxRelayDown", "routing: page", "routing: ticket"),  # routed elsewhere
    ],
)
def test_a_changed_rule_fails_its_unit_test(
    tmp_path: Path, alert: str, before: str, after: str
) -> None:
    text = ALERTS.read_text()
    start = text.index(f"- alert: {alert}\n")
    end = text.find("- alert:", start + 1)
    end = len(text) if end < 0 else end
    changed = text[:start] + text[start:end].replace(before, after, 1) + text[end:]
    assert changed != text
    (tmp_path / ALERTS.name).write_text(changed)
    (tmp_path / ALERT_TESTS.name).write_text(ALERT_TESTS.read_text())
    tested = promtool.run("test", "rules", tmp_path / ALERT_TESTS.name)
    assert tested.returncode != 0
    assert f"alertname: {alert}," in tested.stdout + tested.stderr
