"""Pure classification rules shared by the families, and composition into a report.

Rule order follows the scoring service: unknown when the observation time is missing or
any stored timestamp is non-positive or later than it; else stalled when a count is
strictly over its bound; else stalled when an age is strictly over its bound; else
within bounds. Reasons name fields and numbers only, never identities. Each family's
``classify`` (in ``health/families/``) is built from these helpers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from contracts.health import Classification, FamilyResult, HealthReport

Verdict = tuple[Classification, tuple[str, ...]]

_SEVERITY = {
    Classification.WITHIN_BOUNDS: 0,
    Classification.UNKNOWN: 1,
    Classification.STALLED: 2,
}


def timestamp_problems(
    observed_at: int | None, stored: Iterable[tuple[str, int | None]]
) -> list[str]:
    """Why these timestamps cannot be judged: no observation time, non-positive or future times."""
    if observed_at is None or observed_at <= 0:
        return ["observation time is missing"]
    problems = []
    for name, value in stored:
        if value is None:
            continue
        if value <= 0:
            problems.append(f"stored {name} is {value}, not a positive time")
        elif value > observed_at:
            problems.append(f"{name} is {value - observed_at} ms later than the observation time")
    return problems


def count_over(name: str, value: int, bound_name: str, bound: int) -> list[str]:
    """One reason when a count is strictly over its bound, else none."""
    return [f"{name} {value} > {bound_name} {bound}"] if value > bound else []


def age_over(
    name: str, observed_at: int, oldest: int | None, bound_name: str, bound: int
) -> list[str]:
    """One reason when the age of ``oldest`` at ``observed_at`` is strictly over its bound."""
    if oldest is None:
        return []
    age = observed_at - oldest
    return [f"{name} {age} ms > {bound_name} {bound} ms"] if age > bound else []


def verdict(unknown: list[str], counts: list[str], ages: list[str]) -> Verdict:
    """Unknown reasons win, then count and age reasons make it stalled, else within bounds."""
    if unknown:
        return Classification.UNKNOWN, tuple(unknown)
    if counts or ages:
        return Classification.STALLED, (*counts, *ages)
    return Classification.WITHIN_BOUNDS, ()


def compose(classifications: Iterable[Classification]) -> Classification:
    """Worst wins: stalled > unknown > within_bounds; nothing to compose is within bounds."""
    return max(classifications, key=_SEVERITY.__getitem__, default=Classification.WITHIN_BOUNDS)


def build_report(results: Sequence[FamilyResult], evaluated_at_unix_ms: int) -> HealthReport:
    """Compose family results into a report (overall and readiness-gating classifications)."""
    return HealthReport(
        classification=compose(r.classification for r in results),
        readiness=compose(r.classification for r in results if r.gates_readiness),
        evaluated_at_unix_ms=evaluated_at_unix_ms,
        families=tuple(results),
    )


def mark_stale(report: HealthReport, age_ms: int, max_age_ms: int) -> HealthReport:
    """The report as served when its evidence is older than ``max_age_ms``: every family unknown."""
    if age_ms <= max_age_ms:
        return report
    reason = f"evidence is {age_ms} ms old > max_evidence_age_ms {max_age_ms} ms"
    results = [
        FamilyResult(
            family=r.family,
            classification=Classification.UNKNOWN,
            reasons=(reason,),
            gates_readiness=r.gates_readiness,
            evidence=r.evidence,
        )
        for r in report.families
    ]
    return build_report(results, report.evaluated_at_unix_ms)
