"""The ``application/health+json`` document (draft-inadarei-api-health-check) of a report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from contracts.health import Classification, FamilyResult, HealthReport
from contracts.policy import Policy
from health.families import bound_of, measurements
from health.render.words import iso_time

SERVICE_ID = "outbox-relay"
_JSON = msgspec.json.Encoder()


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


def health_document(
    report: HealthReport | None,
    *,
    release: str,
    policy: Policy | None = None,
    not_ready: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The ``application/health+json`` document (draft-inadarei-api-health-check).

    With ``policy``, a measurement held to a bound carries it as ``bound`` and ``boundName``
    (the policy field), so a reader sees the observation next to its limit. A running
    process gives why it is not ready (``not_ready``, empty when it is): the status is
    ``fail`` exactly when that is not empty, and the check ``process:ready`` says it.
    """
    status = report_status(report)
    if not_ready is not None:
        status = "fail" if not_ready else ("warn" if status == "warn" else "pass")
    document: dict[str, Any] = {
        "status": status,
        "version": release.split(".", 1)[0],
        "releaseId": release,
        "serviceId": SERVICE_ID,
        "description": "transactional outbox relay and scoring-queue health",
    }
    checks: dict[str, list[dict[str, Any]]] = {}
    if not_ready is not None:
        checks["process:ready"] = [
            {
                "componentId": "process",
                "componentType": "system",
                "observedValue": not not_ready,
                "status": "fail" if not_ready else "pass",
                **({"output": "; ".join(not_ready)} if not_ready else {}),
            }
        ]
    if report is None:
        document["output"] = "no evaluation has completed yet"
        document["checks"] = checks
        return document
    document["classification"] = report.classification.value
    document["readiness"] = report.readiness.value
    if report.classification is not Classification.WITHIN_BOUNDS:
        document["output"] = "; ".join(
            f"{r.family.value}: {r.classification.value}"
            for r in report.families
            if r.classification is not Classification.WITHIN_BOUNDS
        )
    elif not_ready:
        document["output"] = "; ".join(not_ready)
    for result in report.families:
        family = result.family.value
        observed = result.evidence.observed_at_unix_ms if result.evidence else None
        time = iso_time(observed if observed and observed > 0 else report.evaluated_at_unix_ms)
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
            check = {**common, "observedValue": m.value, "observedUnit": m.unit}
            bound = bound_of(policy, result, m)
            if bound is not None:
                check |= {"bound": bound, "boundName": m.bound}
            checks[f"{family}:{m.name}"] = [check]
    document["checks"] = checks
    return document


def encode_json(document: object) -> bytes:
    """Compact JSON bytes."""
    return _JSON.encode(document)
