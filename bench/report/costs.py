"""The targets on memory and on the health sidecar's cost: the relay's RSS in the comparison's
catch-up, and the figures bench/test_memory.py and bench/test_health_cost.py leave beside the
comparison's, each judged against its bound."""

from __future__ import annotations

from pathlib import Path

from bench.report.files import HEALTH_COST, MEMORY, Figures, loaded
from bench.report.judging import RELAY, Judged, Rows, median_figure, verdict

RSS_EVENTS = 1_000_000  # the memory target's backlog
RSS_BOUND_MB = 150.0
RSS_ANY_ROWS_BOUND_MB = 250.0  # whatever the table holds


def _rss(rows: Rows, events: int) -> Judged:
    label = "relay RSS draining the comparison's backlog"
    peak = median_figure(rows, RELAY, "drain", "peak_rss_mb")
    if peak is None:
        return Judged("n/a", label, "-", detail="not measured")
    if events >= RSS_EVENTS:
        return Judged(
            verdict(peak, "<=", RSS_BOUND_MB), label, f"{peak:.0f} MB", f"<= {RSS_BOUND_MB:.0f} MB"
        )
    return Judged(
        "info",
        label,
        f"{peak:.0f} MB",
        detail=f"on {events:,} events; the target's 1,000,000 are bench/test_memory.py's",
    )


def rss_line(rows: Rows, events: int) -> tuple[str, str]:
    """The relay's memory while draining: judged only on the target's 1,000,000 events."""
    judged = _rss(rows, events)
    return judged.mark, judged.text


def _memory(source: Path | Figures) -> Judged:
    label = "relay peak RSS, 1,000,000-event backlog"
    figures = loaded(source)
    peak = figures.get("peak_rss_mb")
    if peak is None:
        where = f"no figures at {source}" if isinstance(source, Path) else "no figures"
        return Judged("n/a", label, "-", detail=f"measured by bench/test_memory.py ({where})")
    backlog = int(figures.get("backlog", 0))
    if backlog < RSS_EVENTS:
        return Judged(
            "info",
            label,
            f"{peak:.0f} MB",
            detail=f"peak on {backlog:,} events; judged on {RSS_EVENTS:,} (BENCH_BACKLOG)",
        )
    return Judged(
        verdict(peak, "<=", RSS_BOUND_MB),
        label,
        f"{peak:.0f} MB",
        f"<= {RSS_BOUND_MB:.0f} MB",
        f"peak on {backlog:,} events",
    )


def memory_line(source: Path | Figures = MEMORY) -> tuple[str, str]:
    """The memory target from bench/test_memory.py's figures: the relay process' peak RSS,
    judged only on the target's 1,000,000-event backlog (a smaller trial is shown)."""
    judged = _memory(source)
    return judged.mark, judged.text


def _memory_any_rows(source: Path | Figures) -> Judged:
    """The relay's peak RSS with rows that can never be records (tens of MB) beside rows just
    under the record limit: the bound that holds whatever the table holds."""
    label = "relay peak RSS, rows of tens of MB in the backlog"
    figures = loaded(source).get("whatever_the_rows_hold") or {}
    peak = figures.get("peak_rss_mb")
    if peak is None:
        return Judged(
            "n/a", label, "-", detail="measured by bench/test_memory.py (not in these figures)"
        )
    return Judged(
        verdict(peak, "<=", RSS_ANY_ROWS_BOUND_MB),
        label,
        f"{peak:.0f} MB",
        f"<= {RSS_ANY_ROWS_BOUND_MB:.0f} MB",
        f"{figures.get('oversized_rows', '?')} rows of {figures.get('oversized_mb', '?')} MB"
        f" beside {figures.get('near_limit_rows', '?')} near the record limit",
    )


def _health_cost(source: Path | Figures) -> Judged:
    """Judged as the target reads: the running sidecar's steady state with the history against
    *its* steady state on an empty history (``ratio_to_sidecar_empty``). Its ratio to the
    one-shot ``check`` on an empty history (``ratio``: a different statement set, four round
    trips against five) is shown beside it, as are the grace 0 figures."""
    label = "sidecar steady state, 1,000,000 terminal jobs"
    figures = loaded(source)
    judged = figures.get("ratio_to_sidecar_empty")
    if judged is None:
        return Judged(
            "n/a", label, "-", detail="measured by bench/test_health_cost.py (no figures)"
        )
    more = []
    if figures.get("ratio") is not None:
        more.append(f"to the one-shot check on the empty history: {figures['ratio']:.2f}x")
    if figures.get("ratio_grace_0") is not None:
        more.append(f"grace_ms = 0: {figures['ratio_grace_0']:.2f}x of the one-shot")
    return Judged(verdict(judged, "<=", 1.5), label, f"{judged:.2f}x", "<= 1.5x", "; ".join(more))


def health_cost_line(source: Path | Figures = HEALTH_COST) -> tuple[str, str]:
    """The sidecar target, from the figures bench/test_health_cost.py leaves (if any)."""
    judged = _health_cost(source)
    return judged.mark, judged.text


def _beyond_lookback(source: Path | Figures) -> Judged:
    """The one-shot check with 1,000,000 terminal jobs beyond the look-back window against
    an empty history, as ``check`` evaluates (every statement planned once), bound 2x.

    The same on one connection evaluating again and again is shown beside it: the plan
    cache re-plans the completion check there, which no ``check`` meets.
    """
    label = "check, 1,000,000 terminal jobs beyond look-back"
    figures = loaded(source)
    judged = figures.get("ratio_beyond_lookback")
    if judged is None:
        return Judged(
            "n/a", label, "-", detail="measured by bench/test_health_cost.py (not in these figures)"
        )
    detail = ""
    if figures.get("ratio_beyond_lookback_warm") is not None:
        detail = (
            "one connection evaluating again and again:"
            f" {figures['ratio_beyond_lookback_warm']:.2f}x"
        )
    return Judged(verdict(judged, "<=", 2.0), label, f"{judged:.2f}x", "<= 2x", detail)


def beyond_lookback_line(source: Path | Figures = HEALTH_COST) -> tuple[str, str]:
    """The one-shot check beyond the look-back window, from bench/test_health_cost.py's figures."""
    judged = _beyond_lookback(source)
    return judged.mark, judged.text


def cost_verdicts(
    rows: Rows, events: int, *, memory: Path | Figures, health_cost: Path | Figures
) -> list[Judged]:
    """The verdict of every target on memory and on the sidecar's cost, in the report's order."""
    return [
        _rss(rows, events),
        _memory(memory),
        _memory_any_rows(memory),
        _health_cost(health_cost),
        _beyond_lookback(health_cost),
    ]
