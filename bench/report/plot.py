"""The plot of a comparison: each system's latency percentiles and catch-up rate, medians over
the runs with each run as a dot."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.report.judging import (
    DEBEZIUMS,
    RAW_BATCH,
    RAW_SEND,
    RELAY,
    Rows,
    median_figure,
    run_figure,
    runs_of,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def log_bars(values: list[float | None], *, floor: float) -> tuple[list[float], list[str]]:
    """Bar heights for a log axis, and the mark of each bar that stands for no positive value.

    The broker's LogAppendTime has millisecond resolution, so a latency under a millisecond
    can come out at or below 0 (the raw producer's p50); such a bar is drawn at ``floor``
    and marked "≤0" rather than left out of the plot, and a missing figure is marked "n/a".
    """
    heights = [v if v is not None and v > 0 else floor for v in values]
    marks = ["n/a" if v is None else "≤0" if v <= 0 else "" for v in values]
    return heights, marks


COLOURS = {
    RELAY: "#1f77b4",
    "debezium-poll1ms": "#d62728",
    "debezium-poll10ms": "#ff7f0e",
    RAW_SEND: "#2ca02c",
    RAW_BATCH: "#7f7f7f",
}
PERCENTILES = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p999", "p99.9"))


def plot(document: dict[str, Any], path: Path) -> None:
    """Latency percentiles and drain rate per system, medians over runs, runs as dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: Rows = document["runs"]
    scale = document.get("scale", {})
    systems = [
        s for s in (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH) if any(r["system"] == s for r in rows)
    ]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    _latency_panel(left, rows, systems, rate=scale.get("rate", "?"))
    _drain_panel(right, rows, systems, events=scale.get("events", "?"))
    figure.suptitle(
        f"relay vs Debezium vs raw aiokafka producer — medians of {len(runs_of(rows))} runs "
        f"(dots: each run), {document.get('measured_at', '')}",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _latency_panel(left: Axes, rows: Rows, systems: list[str], *, rate: object) -> None:
    """Each system's latency percentiles on a log axis, a bar per median and a dot per run."""
    latency_systems = [s for s in systems if median_figure(rows, s, "latency", "p50") is not None]
    width = 0.8 / max(len(latency_systems), 1)
    figures = {
        system: [median_figure(rows, system, "latency", key) for key, _ in PERCENTILES]
        for system in latency_systems
    }
    positive = [v for values in figures.values() for v in values if v is not None and v > 0]
    floor = min([0.05, *positive]) / 2
    any_marked = False
    for i, system in enumerate(latency_systems):
        xs = [j + i * width for j in range(len(PERCENTILES))]
        heights, marks = log_bars(figures[system], floor=floor)
        left.bar(xs, heights, width, label=system, color=COLOURS[system])
        for x, height, mark in zip(xs, heights, marks, strict=True):
            if mark:
                any_marked = any_marked or mark == "≤0"
                left.text(x, height * 1.15, mark, ha="center", fontsize=7)
        for j, (key, _) in enumerate(PERCENTILES):
            points = [run_figure(rows, run, system, "latency", key) for run in runs_of(rows)]
            shown = [p for p in points if p is not None and p > 0]
            left.scatter([xs[j]] * len(shown), shown, s=8, color="black", zorder=3)
    if any_marked:
        left.set_xlabel("≤0: at or below 0 ms (LogAppendTime has 1 ms resolution)", fontsize=7)
    left.set_xticks([j + width * (len(latency_systems) - 1) / 2 for j in range(len(PERCENTILES))])
    left.set_xticklabels([label for _, label in PERCENTILES])
    left.set_yscale("log")
    left.set_ylabel("commit → broker append, ms (log)")
    left.set_title(f"latency at {rate} events/s")
    left.legend(fontsize=8)


def _drain_panel(right: Axes, rows: Rows, systems: list[str], *, events: object) -> None:
    """Each system's catch-up rate, a bar per median and a dot per run."""
    drain_systems = [s for s in systems if median_figure(rows, s, "drain", "rate") is not None]
    medians = [median_figure(rows, s, "drain", "rate") or 0.0 for s in drain_systems]
    right.bar(range(len(drain_systems)), medians, color=[COLOURS[s] for s in drain_systems])
    for i, system in enumerate(drain_systems):
        points = [run_figure(rows, run, system, "drain", "rate") for run in runs_of(rows)]
        right.scatter([i] * len(points), points, s=8, color="black", zorder=3)
    right.set_xticks(range(len(drain_systems)))
    right.set_xticklabels(drain_systems, rotation=20, fontsize=8)
    right.set_ylabel("events/s (first → last broker append)")
    right.set_title(f"backlog catch-up, {events:,} x 1 KiB")
