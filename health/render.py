"""Presenting a report: measurements, the IETF health+json document, a table, an HTML page."""

from __future__ import annotations

import datetime as dt
import html
from typing import Any

import msgspec

from contracts.health import Classification, FamilyResult, HealthReport
from health.families import REGISTRY
from health.families.base import Measurement

SERVICE_ID = "outbox-relay"
_JSON = msgspec.json.Encoder()


def measurements(result: FamilyResult) -> list[Measurement]:
    """The values a family's result shows, in a stable order; none without evidence."""
    if result.evidence is None:
        return []
    return REGISTRY[result.family].measure(result.evidence)


def _iso(unix_ms: int) -> str:
    moment = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report_status(report: HealthReport | None) -> str:
    """IETF status: fail when a gating family is not within bounds, warn for a non-gating one."""
    if report is None or report.readiness is not Classification.WITHIN_BOUNDS:
        return "fail"
    if report.classification is not Classification.WITHIN_BOUNDS:
        return "warn"
    return "pass"


def _check_status(result: FamilyResult) -> str:
    if result.classification is Classification.WITHIN_BOUNDS:
        return "pass"
    return "fail" if result.gates_readiness else "warn"


def health_document(report: HealthReport | None, *, release: str) -> dict[str, Any]:
    """The ``application/health+json`` document (draft-inadarei-api-health-check)."""
    document: dict[str, Any] = {
        "status": report_status(report),
        "version": release.split(".", 1)[0],
        "releaseId": release,
        "serviceId": SERVICE_ID,
        "description": "transactional outbox relay and scoring-queue health",
    }
    if report is None:
        document["output"] = "no evaluation has completed yet"
        document["checks"] = {}
        return document
    document["classification"] = report.classification.value
    document["readiness"] = report.readiness.value
    if report.classification is not Classification.WITHIN_BOUNDS:
        document["output"] = "; ".join(
            f"{r.family.value}: {r.classification.value}"
            for r in report.families
            if r.classification is not Classification.WITHIN_BOUNDS
        )
    checks: dict[str, list[dict[str, Any]]] = {}
    for result in report.families:
        family = result.family.value
        observed = result.evidence.observed_at_unix_ms if result.evidence else None
        time = _iso(observed if observed and observed > 0 else report.evaluated_at_unix_ms)
        common = {
            "componentId": family,
            "componentType": "component",
            "status": _check_status(result),
            "time": time,
        }
        checks[f"{family}:classification"] = [
            {
                **common,
                "observedValue": result.classification.value,
                "classification": result.classification.value,
                "reasons": list(result.reasons),
                "gatesReadiness": result.gates_readiness,
                **({"output": "; ".join(result.reasons)} if result.reasons else {}),
            }
        ]
        for m in measurements(result):
            checks[f"{family}:{m.name}"] = [
                {**common, "observedValue": m.value, "observedUnit": m.unit}
            ]
    document["checks"] = checks
    return document


def encode_json(document: object) -> bytes:
    """Compact JSON bytes."""
    return _JSON.encode(document)


def status_table(report: HealthReport) -> str:
    """A plain-text table of every family for ``outbox-relay status``."""
    lines = [f"{'FAMILY':<18} {'CLASSIFICATION':<14} {'GATES':<5} MEASUREMENTS"]
    for result in report.families:
        values = (
            " ".join(f"{m.name}={_show(m)}" for m in measurements(result))
            if result.evidence is not None
            else "-"
        )
        gates = "yes" if result.gates_readiness else "no"
        lines.append(
            f"{result.family.value:<18} {result.classification.value:<14} {gates:<5} {values}"
        )
        lines.extend(f"{'':<18} reason: {reason}" for reason in result.reasons)
    if not report.families:
        lines.append("(every family is disabled in the policy)")
    lines.append(
        f"overall: {report.classification.value}; readiness: {report.readiness.value}; "
        f"evaluated {_iso(report.evaluated_at_unix_ms)}"
    )
    return "\n".join(lines) + "\n"


def _show(m: Measurement) -> str:
    if m.value is None:
        return "-"
    return f"{m.value}ms" if m.unit == "ms" else str(m.value)


def status_page(report: HealthReport | None, *, live: bool, ready: bool) -> str:
    """A small human status page; every value is escaped."""
    rows = []
    if report is not None:
        for result in report.families:
            values = (
                "<br>".join(html.escape(f"{m.name}: {_show(m)}") for m in measurements(result))
                if result.evidence is not None
                else "no evidence"
            )
            reasons = "<br>".join(html.escape(r) for r in result.reasons) or "&ndash;"
            rows.append(
                f'<tr class="{html.escape(result.classification.value)}">'
                f"<td>{html.escape(result.family.value)}</td>"
                f"<td>{html.escape(result.classification.value)}</td>"
                f"<td>{'yes' if result.gates_readiness else 'no'}</td>"
                f"<td>{values}</td><td>{reasons}</td></tr>"
            )
    overall = report.classification.value if report is not None else "no evaluation yet"
    evaluated = _iso(report.evaluated_at_unix_ms) if report is not None else "&ndash;"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>outbox-relay health</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .4em .6em; vertical-align: top; }}
tr.within_bounds td:nth-child(2) {{ background: #d8f5d8; }}
tr.stalled td:nth-child(2) {{ background: #f8d0d0; }}
tr.unknown td:nth-child(2) {{ background: #f5ecc8; }}
</style></head><body>
<h1>outbox-relay health</h1>
<p>overall: <strong>{html.escape(overall)}</strong> &middot; live: {"yes" if live else "no"}
&middot; ready: {"yes" if ready else "no"} &middot; evaluated: {evaluated}</p>
<table><tr><th>family</th><th>classification</th><th>gates readiness</th><th>observed</th><th>reasons</th></tr>
{"".join(rows)}
</table>
<p><a href="/health">/health</a> &middot; <a href="/metrics">/metrics</a> &middot;
<a href="/readyz">/readyz</a> &middot; <a href="/livez">/livez</a></p>
</body></html>
"""
