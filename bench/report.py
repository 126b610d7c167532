"""PASS or FAIL per performance target of the peer comparison, and its plot.

Reads the raw figures that bench/test_peers.py keeps (docs/bench/results.json), takes every
ratio within one run (the same machine state for every system of that run), and judges each
target on the median of those ratios over the runs. Absolute figures are printed too, as
medians, but they are noise on a shared machine; the ratios are the result. The memory
target is judged from bench/test_memory.py's figures beside them (memory.json), the
sidecar's from bench/test_health_cost.py's (docs/bench/health_cost.json). Exits 1 when any
judged target FAILs (after printing everything and drawing the plot).

    python -m bench.report [results.json] [--plot PNG]   (default: BENCH_RESULTS's or
                                                          docs/bench's; peers.png beside it)
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOCS_BENCH = Path(__file__).resolve().parents[1] / "docs" / "bench"
RESULTS = DOCS_BENCH / "results.json"
PLOT = DOCS_BENCH / "peers.png"
# Hook for the sidecar's cost (measured by bench/test_health_cost.py, not here): a JSON object
# {"ratio_to_sidecar_empty": <steady state with 1,000,000 terminal jobs / the same sidecar's
# steady state on an empty history>, "ratio": <the same / the one-shot check on an empty
# history>, "ratio_grace_0": ...}.
HEALTH_COST = DOCS_BENCH / "health_cost.json"
# bench/test_memory.py's figures, kept beside the comparison's (memory_figures()): a JSON
# object {"backlog": <events drained>, "peak_rss_mb": <the relay process' peak RSS>, ...}.
MEMORY = DOCS_BENCH / "memory.json"

RELAY = "relay"
DEBEZIUM_LATENCY_TUNED = "debezium-poll1ms"
DEBEZIUMS = ("debezium-poll1ms", "debezium-poll10ms")
RAW_SEND = "raw-send"
RAW_BATCH = "raw-send_batch"
RSS_EVENTS = 1_000_000  # the memory target's backlog
RSS_BOUND_MB = 150.0

Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Target:
    """One line of the issue's target table: a ratio within a run and its bound."""

    label: str
    ratio: str  # key of per_run_ratios()
    compare: str  # "<=" or ">=", or "" for a ratio that is only reported
    bound: float


TARGETS = (
    Target("latency p50: relay / Debezium (poll 1 ms)", "p50_vs_debezium", "<=", 1.2),
    Target("latency p99: relay / Debezium (poll 1 ms)", "p99_vs_debezium", "<=", 0.8),
    Target("drain: relay / raw send()", "drain_vs_send", ">=", 0.9),
    Target("drain: relay / Debezium catch-up (faster of the two)", "drain_vs_debezium", ">=", 4.0),
    Target("drain: relay / raw send_batch()", "drain_vs_send_batch", "", 0.0),
    Target("latency p50: relay / Debezium (poll 10 ms)", "p50_vs_debezium10", "", 0.0),
    Target("latency p99: relay / Debezium (poll 10 ms)", "p99_vs_debezium10", "", 0.0),
)

_COMPARE: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


def verdict(value: float | None, compare: str, bound: float) -> str:
    """PASS/FAIL against the bound; 'info' for a reported-only ratio; 'n/a' without figures."""
    if value is None:
        return "n/a"
    if not compare:
        return "info"
    return "PASS" if _COMPARE[compare](value, bound) else "FAIL"


def _figure(rows: Rows, run: int, system: str, phase: str, key: str) -> float | None:
    """One system's figure in one run; the mean where the run measured it more than once
    (the drain pair runs A B B A: a drift across the four cancels in the pair's means)."""
    values = [
        float(value)
        for row in rows
        if row["run"] == run and row["system"] == system and row["phase"] == phase
        if (value := row.get(key)) is not None
    ]
    return statistics.fmean(values) if values else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def per_run_ratios(rows: Rows, run: int) -> dict[str, float | None]:
    """Every target's ratio within one run; None where a system of it was not measured."""
    relay_rate = _figure(rows, run, RELAY, "drain", "rate")
    debezium_rates = [
        rate
        for name in DEBEZIUMS
        if (rate := _figure(rows, run, name, "drain", "rate")) is not None
    ]
    ratios = {
        "drain_vs_send": _ratio(relay_rate, _figure(rows, run, RAW_SEND, "drain", "rate")),
        "drain_vs_send_batch": _ratio(relay_rate, _figure(rows, run, RAW_BATCH, "drain", "rate")),
        "drain_vs_debezium": _ratio(relay_rate, max(debezium_rates, default=None)),
    }
    for key, other in (("", DEBEZIUM_LATENCY_TUNED), ("10", "debezium-poll10ms")):
        for pct in ("p50", "p99"):
            ratios[f"{pct}_vs_debezium{key}"] = _ratio(
                _figure(rows, run, RELAY, "latency", pct), _figure(rows, run, other, "latency", pct)
            )
    return ratios


def median_or_none(values: Iterable[float | None]) -> float | None:
    """The median of the known values."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def runs_of(rows: Rows) -> list[int]:
    """The run numbers present, in order."""
    return sorted({int(row["run"]) for row in rows})


def median_figure(rows: Rows, system: str, phase: str, key: str) -> float | None:
    """The median over runs of one system's figure."""
    return median_or_none(_figure(rows, run, system, phase, key) for run in runs_of(rows))


def rss_line(rows: Rows, events: int) -> tuple[str, str]:
    """The relay's memory while draining: judged only on the target's 1,000,000 events."""
    peak = median_figure(rows, RELAY, "drain", "peak_rss_mb")
    if peak is None:
        return "n/a", "not measured"
    if events >= RSS_EVENTS:
        return verdict(peak, "<=", RSS_BOUND_MB), f"{peak:.0f} MB peak (bound {RSS_BOUND_MB:.0f})"
    return "info", (
        f"{peak:.0f} MB peak on {events:,} events; the target's 1,000,000 are "
        "bench/test_memory.py's"
    )


def results_path() -> Path:
    """Where a run keeps the comparison's figures: BENCH_RESULTS, as bench/test_peers.py
    reads it, or docs/bench/results.json."""
    return Path(os.environ.get("BENCH_RESULTS", RESULTS))


def memory_figures(results: Path | None = None) -> Path:
    """bench/test_memory.py's figures: beside the comparison's (a trial with BENCH_RESULTS
    leaves the committed ones alone)."""
    return (results or results_path()).with_name(MEMORY.name)


def memory_line(path: Path = MEMORY) -> tuple[str, str]:
    """The memory target from bench/test_memory.py's figures: the relay process' peak RSS,
    judged only on the target's 1,000,000-event backlog (a smaller trial is shown)."""
    figures = json.loads(path.read_text()) if path.is_file() else {}
    peak = figures.get("peak_rss_mb")
    if peak is None:
        return "n/a", f"measured by bench/test_memory.py (no figures at {path})"
    backlog = int(figures.get("backlog", 0))
    if backlog < RSS_EVENTS:
        return "info", (
            f"{peak:.0f} MB peak on {backlog:,} events; judged on {RSS_EVENTS:,} (BENCH_BACKLOG)"
        )
    return verdict(peak, "<=", RSS_BOUND_MB), (
        f"{peak:.0f} MB peak on {backlog:,} events (bound {RSS_BOUND_MB:.0f})"
    )


def health_cost_line(path: Path = HEALTH_COST) -> tuple[str, str]:
    """The sidecar target, from the figures bench/test_health_cost.py leaves (if any).

    Judged as the target reads: the running sidecar's steady state with the history against
    *its* steady state on an empty history (``ratio_to_sidecar_empty``). Its ratio to the
    one-shot ``check`` on an empty history (``ratio``: a different statement set, four
    round trips against five) is shown beside it, as are the grace 0 figures.
    """
    if not path.is_file():
        return "n/a", "measured by bench/test_health_cost.py (no docs/bench/health_cost.json)"
    figures = json.loads(path.read_text())
    judged = figures.get("ratio_to_sidecar_empty")
    shown = f"{judged:.2f}x" if judged is not None else "?"
    if figures.get("ratio") is not None:
        shown += f" (to the one-shot check on the empty history: {figures['ratio']:.2f}x)"
    if figures.get("ratio_grace_0") is not None:
        shown += f"; grace_ms = 0: {figures['ratio_grace_0']:.2f}x of the one-shot"
    return verdict(judged, "<=", 1.5), shown


def beyond_lookback_line(path: Path = HEALTH_COST) -> tuple[str, str]:
    """The one-shot check with 1,000,000 terminal jobs beyond the look-back window against
    an empty history, as ``check`` evaluates (every statement planned once), bound 2x.

    The same on one connection evaluating again and again is shown beside it: the plan
    cache re-plans the completion check there (docs/benchmarks.md, "History beyond the
    look-back window"), which no ``check`` meets.
    """
    figures = json.loads(path.read_text()) if path.is_file() else {}
    judged = figures.get("ratio_beyond_lookback")
    if judged is None:
        return "n/a", "measured by bench/test_health_cost.py (not in these figures)"
    shown = f"{judged:.2f}x"
    if figures.get("ratio_beyond_lookback_warm") is not None:
        shown += (
            f" (one connection evaluating again and again:"
            f" {figures['ratio_beyond_lookback_warm']:.2f}x)"
        )
    return verdict(judged, "<=", 2.0), shown


def database_line(machine: dict[str, Any]) -> list[str]:
    """The server every system read, and whether over TLS (older files do not say)."""
    if "postgresql_tls" not in machine:
        return []
    tls = "with TLS" if machine["postgresql_tls"] else "without TLS"
    return [f"PostgreSQL {machine.get('postgresql', '?')}, every system connected {tls}"]


def verdict_lines(
    document: dict[str, Any], *, memory: Path = MEMORY, health_cost: Path = HEALTH_COST
) -> list[tuple[str, str]]:
    """Every target's verdict and its line of the report, in the report's order."""
    rows: Rows = document["runs"]
    scale = document.get("scale", {})
    per_run = [per_run_ratios(rows, run) for run in runs_of(rows)]
    lines = []
    for target in TARGETS:
        median = median_or_none(r[target.ratio] for r in per_run)
        each = " ".join(
            "-" if r[target.ratio] is None else f"{r[target.ratio]:.2f}" for r in per_run
        )
        bound = f"{target.compare} {target.bound:g}" if target.compare else ""
        shown = "-" if median is None else f"{median:.2f}"
        mark = verdict(median, target.compare, target.bound)
        lines.append((mark, f"{mark:6} {target.label:56} {shown:>8}  {bound:>7}  {each}"))
    for label, (mark, text) in (
        (
            "relay RSS draining (<= 150 MB on 1,000,000)",
            rss_line(rows, int(scale.get("events", 0))),
        ),
        ("relay peak RSS, 1,000,000-event backlog (<= 150 MB)", memory_line(memory)),
        ("sidecar steady state, 1,000,000 terminal jobs (<= 1.5x)", health_cost_line(health_cost)),
        (
            "check, 1,000,000 terminal jobs beyond look-back (<= 2x)",
            beyond_lookback_line(health_cost),
        ),
    ):
        lines.append((mark, f"{mark:6} {label:56} {text}"))
    return lines


def report_lines(
    document: dict[str, Any], *, memory: Path = MEMORY, health_cost: Path = HEALTH_COST
) -> list[str]:
    """The printed report: the targets with their median ratios, then the medians."""
    rows: Rows = document["runs"]
    scale = document.get("scale", {})
    runs = runs_of(rows)
    lines = [
        f"PEER COMPARISON {scale.get('events', '?'):,} events, {len(runs)} runs, latency at "
        f"{scale.get('rate', '?')}/s for {scale.get('seconds', '?')} s "
        f"(measured {document.get('measured_at', '?')})",
        *database_line(document.get("machine", {})),
        "",
        f"{'':6} {'target':56} {'median':>8}  {'bound':>7}  per run",
        *(line for _, line in verdict_lines(document, memory=memory, health_cost=health_cost)),
    ]
    lines += [
        "",
        f"{'medians':18} {'drain ev/s':>11} {'wall ev/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'RSS MB':>7}",
    ]
    for system in (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH):
        cells = [
            median_figure(rows, system, "drain", "rate"),
            median_figure(rows, system, "drain", "wall_rate"),
            median_figure(rows, system, "latency", "p50"),
            median_figure(rows, system, "latency", "p99"),
            median_figure(rows, system, "latency", "p999"),
            median_figure(rows, system, "drain", "peak_rss_mb"),
        ]
        widths = (11, 10, 8, 8, 9, 7)
        formats = (".0f", ".0f", ".1f", ".1f", ".1f", ".0f")
        text = " ".join(
            f"{'-' if v is None else format(v, f):>{w}}"
            for v, w, f in zip(cells, widths, formats, strict=True)
        )
        lines.append(f"{system:18} {text}")
    lines += cpu_lines(rows) + postgres_cpu_lines(rows) + produce_lines(rows)
    return lines


CPU_GROUPS = (("client", "client"), ("postgres", "PostgreSQL"), ("broker", "broker"))


def cpu_lines(rows: Rows) -> list[str]:
    """CPU per event over the catch-up (medians), per process group: what bounds a drain
    on cores that PostgreSQL, the broker and the system under test all share."""
    systems = [
        s
        for s in (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH)
        if median_figure(rows, s, "drain", "client_cpu_us_per_event") is not None
    ]
    if not systems:
        return []
    lines = [
        "",
        "catch-up CPU per event, us (medians; client: the system's own process, for the raw "
        "producer the harness's)",
        f"{'':18} " + " ".join(f"{label:>10}" for _, label in CPU_GROUPS) + f" {'total':>10}",
    ]
    for system in systems:
        cells = [
            median_figure(rows, system, "drain", f"{key}_cpu_us_per_event") or 0.0
            for key, _ in CPU_GROUPS
        ]
        lines.append(
            f"{system:18} " + " ".join(f"{v:>10.1f}" for v in cells) + f" {sum(cells):>10.1f}"
        )
    return lines


def postgres_cpu_lines(rows: Rows) -> list[str]:
    """PostgreSQL's part of the catch-up's CPU per event by process kind (medians), for the
    systems that read the database: which of its processes each event keeps busy."""
    systems = [
        s
        for s in (RELAY, *DEBEZIUMS)
        if median_figure(rows, s, "drain", "pg_backends_cpu_us_per_event") is not None
    ]
    if not systems:
        return []
    # the kinds as bench/peers/measure.py named them, in its order
    suffix = "_cpu_us_per_event"
    kinds = list(
        dict.fromkeys(
            key.removeprefix("pg_").removesuffix(suffix)
            for row in rows
            for key in row
            if key.startswith("pg_") and key.endswith(suffix)
        )
    )
    lines = [
        "",
        "PostgreSQL's catch-up CPU per event by process kind, us (medians; ended: processes "
        "that ended inside the catch-up, mostly autovacuum workers)",
        f"{'':18} " + " ".join(f"{kind:>10}" for kind in kinds),
    ]
    for system in systems:
        cells = [
            median_figure(rows, system, "drain", f"pg_{kind}{suffix}") or 0.0 for kind in kinds
        ]
        lines.append(f"{system:18} " + " ".join(f"{v:>10.1f}" for v in cells))
    return lines


PRODUCE_COLUMNS = (
    ("request_queue_ms", "queue"),
    ("local_ms", "append"),
    ("response_queue_ms", "resp queue"),
    ("response_send_ms", "resp send"),
    ("total_ms", "total"),
)


def produce_lines(rows: Rows) -> list[str]:
    """The broker's own timing of each system's Produce requests (medians over the runs):
    how many events one request carried, its size, and its mean time in each stage."""
    lines: list[str] = []
    for phase, events_key in (("latency", "count"), ("drain", "events")):
        systems = [
            s
            for s in (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH)
            if median_figure(rows, s, phase, "produce_requests") is not None
        ]
        if not systems:
            continue
        lines += [
            "",
            f"broker's Produce requests in the {phase} phase (means, ms; medians over the runs)",
            f"{'':18} {'ev/request':>10} {'KiB':>7} "
            + " ".join(f"{label:>10}" for _, label in PRODUCE_COLUMNS),
        ]
        for system in systems:
            requests = median_figure(rows, system, phase, "produce_requests") or 1.0
            events = median_figure(rows, system, phase, events_key) or 0.0
            size = (median_figure(rows, system, phase, "produce_request_bytes") or 0.0) / 1024
            stages = [
                median_figure(rows, system, phase, f"produce_{key}") or 0.0
                for key, _ in PRODUCE_COLUMNS
            ]
            lines.append(
                f"{system:18} {events / requests:>10.1f} {size:>7.1f} "
                + " ".join(f"{v:>10.2f}" for v in stages)
            )
    return lines


def log_bars(values: list[float | None], *, floor: float) -> tuple[list[float], list[str]]:
    """Bar heights for a log axis, and the mark of each bar that stands for no positive value.

    The broker's LogAppendTime has millisecond resolution, so a latency under a millisecond
    can come out at or below 0 (the raw producer's p50); such a bar is drawn at ``floor``
    and marked "≤0" rather than left out of the plot, and a missing figure is marked "n/a".
    """
    heights = [v if v is not None and v > 0 else floor for v in values]
    marks = ["n/a" if v is None else "≤0" if v <= 0 else "" for v in values]
    return heights, marks


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
    colours = {
        RELAY: "#1f77b4",
        "debezium-poll1ms": "#d62728",
        "debezium-poll10ms": "#ff7f0e",
        RAW_SEND: "#2ca02c",
        RAW_BATCH: "#7f7f7f",
    }
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))

    percentiles = (("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p999", "p99.9"))
    latency_systems = [s for s in systems if median_figure(rows, s, "latency", "p50") is not None]
    width = 0.8 / max(len(latency_systems), 1)
    figures = {
        system: [median_figure(rows, system, "latency", key) for key, _ in percentiles]
        for system in latency_systems
    }
    positive = [v for values in figures.values() for v in values if v is not None and v > 0]
    floor = min([0.05, *positive]) / 2
    any_marked = False
    for i, system in enumerate(latency_systems):
        xs = [j + i * width for j in range(len(percentiles))]
        heights, marks = log_bars(figures[system], floor=floor)
        left.bar(xs, heights, width, label=system, color=colours[system])
        for x, height, mark in zip(xs, heights, marks, strict=True):
            if mark:
                any_marked = any_marked or mark == "≤0"
                left.text(x, height * 1.15, mark, ha="center", fontsize=7)
        for j, (key, _) in enumerate(percentiles):
            points = [_figure(rows, run, system, "latency", key) for run in runs_of(rows)]
            shown = [p for p in points if p is not None and p > 0]
            left.scatter([xs[j]] * len(shown), shown, s=8, color="black", zorder=3)
    if any_marked:
        left.set_xlabel("≤0: at or below 0 ms (LogAppendTime has 1 ms resolution)", fontsize=7)
    left.set_xticks([j + width * (len(latency_systems) - 1) / 2 for j in range(len(percentiles))])
    left.set_xticklabels([label for _, label in percentiles])
    left.set_yscale("log")
    left.set_ylabel("commit → broker append, ms (log)")
    left.set_title(f"latency at {scale.get('rate', '?')} events/s")
    left.legend(fontsize=8)

    drain_systems = [s for s in systems if median_figure(rows, s, "drain", "rate") is not None]
    medians = [median_figure(rows, s, "drain", "rate") or 0.0 for s in drain_systems]
    right.bar(range(len(drain_systems)), medians, color=[colours[s] for s in drain_systems])
    for i, system in enumerate(drain_systems):
        points = [_figure(rows, run, system, "drain", "rate") for run in runs_of(rows)]
        right.scatter([i] * len(points), points, s=8, color="black", zorder=3)
    right.set_xticks(range(len(drain_systems)))
    right.set_xticklabels(drain_systems, rotation=20, fontsize=8)
    right.set_ylabel("events/s (first → last broker append)")
    right.set_title(f"backlog catch-up, {scale.get('events', '?'):,} x 1 KiB")

    figure.suptitle(
        f"relay vs Debezium vs raw aiokafka producer — medians of {len(runs_of(rows))} runs "
        f"(dots: each run), {document.get('measured_at', '')}",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Keep one comparison's raw figures as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Print the report and draw the plot; 1 when any judged target FAILs (or no figures)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "results", nargs="?", type=Path, help="default: BENCH_RESULTS, or " + str(RESULTS)
    )
    parser.add_argument(
        "--plot", type=Path, help="where to draw the plot (default: peers.png beside the figures)"
    )
    args = parser.parse_args(argv)
    args.results = args.results or results_path()
    # figures read from elsewhere (a trial with BENCH_RESULTS) never overwrite the plot of
    # the last full run
    args.plot = args.plot or args.results.with_name(PLOT.name)
    if not args.results.is_file():
        print(f"no peer-comparison figures at {args.results}: run `make bench` first")
        return 1
    document = json.loads(args.results.read_text())
    memory = memory_figures(args.results)
    print("\n".join(report_lines(document, memory=memory)))
    plot(document, args.plot)
    print(f"\nplot: {args.plot}\nraw figures: {args.results}")
    failed = [line for mark, line in verdict_lines(document, memory=memory) if mark == "FAIL"]
    if failed:
        print(f"\n{len(failed)} target(s) FAIL:", *failed, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
