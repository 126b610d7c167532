"""PASS or FAIL per performance target, the history of judged runs, and the plot.

``make bench``'s benchmarks leave the figures of the run they measured in docs/bench/
(git-ignored there): results.json (bench/test_peers.py, every system's raw figures run by
run), memory.json (bench/test_memory.py) and health_cost.json (bench/test_health_cost.py).
This report takes every ratio within one run (the same machine state for every system of
that run), judges each target on the median of those ratios over the runs, and folds the
run into docs/bench/history.jsonl: one line per judged run with its commit, date, machine,
ratios and raw figures. It then rewrites the judged-run block of docs/benchmarks.md from the
newest line and draws the plot. Absolute figures are printed too, as medians, but they are
noise on a shared machine; the ratios are the result. Exits 1 when any judged target FAILs
(after printing everything).

Figures read from anywhere else (a path given, or BENCH_RESULTS: a trial) are judged and
plotted beside themselves, and leave the history, the document and the committed plot
alone. With no new figures the report judges the newest line of the history again.

    python -m bench.report [results.json] [--plot PNG]
    python -m bench.report --history        (one line per judged run: the trend)
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import statistics
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS_BENCH = ROOT / "docs" / "bench"
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
# Every judged run, oldest first: one JSON object per line (history_entry()).
HISTORY = DOCS_BENCH / "history.jsonl"
# The document whose judged-run block the report writes (judged_block()).
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
BLOCK_BEGIN = (
    "<!-- judged run: written by `python -m bench.report` from docs/bench/history.jsonl;"
    " edits here are overwritten -->"
)
BLOCK_END = "<!-- end of the judged run -->"

RELAY = "relay"
DEBEZIUM_LATENCY_TUNED = "debezium-poll1ms"
DEBEZIUMS = ("debezium-poll1ms", "debezium-poll10ms")
RAW_SEND = "raw-send"
RAW_BATCH = "raw-send_batch"
SYSTEMS = (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH)
RSS_EVENTS = 1_000_000  # the memory target's backlog
RSS_BOUND_MB = 150.0
RSS_ANY_ROWS_BOUND_MB = 250.0  # whatever the table holds

Rows = list[dict[str, Any]]
Figures = Mapping[str, Any]


@dataclass(frozen=True)
class Target:
    """One line of the design's target table: a ratio within a run and its bound."""

    label: str
    ratio: str  # key of per_run_ratios()
    compare: str  # "<=" or ">=", or "" for a ratio that is only reported
    bound: float
    aim: float | None = None  # what the design aims at, reported beside the bound


TARGETS = (
    Target("latency p50: relay / Debezium (poll 1 ms)", "p50_vs_debezium", "<=", 1.2),
    Target("latency p99: relay / Debezium (poll 1 ms)", "p99_vs_debezium", "<=", 0.8),
    Target("drain: relay / raw send()", "drain_vs_send", ">=", 0.9),
    Target(
        "CPU per event: relay / Debezium (cheaper of the two)",
        "cpu_vs_debezium",
        "<=",
        0.25,
    ),
    Target("drain: relay / Debezium catch-up (faster of the two)", "drain_vs_debezium", "", 0.0),
    Target("drain: relay / raw send_batch()", "drain_vs_send_batch", "", 0.0),
    Target("latency p50: relay / Debezium (poll 10 ms)", "p50_vs_debezium10", "", 0.0),
    Target("latency p99: relay / Debezium (poll 10 ms)", "p99_vs_debezium10", "", 0.0),
)

# The latency phase run again right after a catch-up on the same database (bench/peers/
# comparison.py, after_catch_up): judged by the design's latency bounds, and the writers'
# reached rate beside the relay, against the target rate and against their rate beside
# Debezium. Judged only in runs that measured the phase.
AFTER_CATCH_UP = "after_catch_up"
AFTER_CATCH_UP_TARGETS = (
    Target(
        "after a catch-up, latency p50: relay / Debezium (poll 1 ms)",
        "after_catch_up_p50_vs_debezium",
        "<=",
        1.2,
        aim=0.5,
    ),
    Target(
        "after a catch-up, latency p99: relay / Debezium (poll 1 ms)",
        "after_catch_up_p99_vs_debezium",
        "<=",
        0.8,
        aim=0.5,
    ),
    Target(
        "after a catch-up, writers beside the relay / target rate",
        "after_catch_up_writers_vs_target",
        ">=",
        0.98,
    ),
    Target(
        "after a catch-up, writers beside the relay / beside Debezium",
        "after_catch_up_writers_vs_debezium",
        ">=",
        0.98,
    ),
)


def targets_for(rows: Rows) -> tuple[Target, ...]:
    """The targets a run's figures are judged on: the phase after a catch-up's only when
    the run measured it."""
    if any(row.get("phase") == AFTER_CATCH_UP for row in rows):
        return TARGETS + AFTER_CATCH_UP_TARGETS
    return TARGETS


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


def _cpu_per_event(rows: Rows, run: int, system: str, database: str) -> float | None:
    """A system's CPU per event in one run's catch-up: its own process plus the PostgreSQL
    figure named (all of PostgreSQL's processes, or only its backends)."""
    own = _figure(rows, run, system, "drain", "client_cpu_us_per_event")
    # runs measured before the meter split PostgreSQL's processes by kind count them all
    spent = _figure(rows, run, system, "drain", database)
    if spent is None:
        spent = _figure(rows, run, system, "drain", "postgres_cpu_us_per_event")
    return None if own is None or spent is None else own + spent


def per_run_ratios(rows: Rows, run: int) -> dict[str, float | None]:
    """Every target's ratio within one run; None where a system of it was not measured."""
    relay_rate = _figure(rows, run, RELAY, "drain", "rate")
    debezium_rates = [
        rate
        for name in DEBEZIUMS
        if (rate := _figure(rows, run, name, "drain", "rate")) is not None
    ]
    # The design's CPU target: the relay's process plus PostgreSQL's backends, against
    # Connect's process plus all of PostgreSQL's (its walsender decodes for the slot).
    relay_cpu = _cpu_per_event(rows, run, RELAY, "pg_backends_cpu_us_per_event")
    debezium_cpus = [
        cpu
        for name in DEBEZIUMS
        if (cpu := _cpu_per_event(rows, run, name, "postgres_cpu_us_per_event")) is not None
    ]
    ratios = {
        "drain_vs_send": _ratio(relay_rate, _figure(rows, run, RAW_SEND, "drain", "rate")),
        "drain_vs_send_batch": _ratio(relay_rate, _figure(rows, run, RAW_BATCH, "drain", "rate")),
        "drain_vs_debezium": _ratio(relay_rate, max(debezium_rates, default=None)),
        "cpu_vs_debezium": _ratio(relay_cpu, min(debezium_cpus, default=None)),
    }
    for key, other in (("", DEBEZIUM_LATENCY_TUNED), ("10", "debezium-poll10ms")):
        for pct in ("p50", "p99"):
            ratios[f"{pct}_vs_debezium{key}"] = _ratio(
                _figure(rows, run, RELAY, "latency", pct), _figure(rows, run, other, "latency", pct)
            )
    for pct in ("p50", "p99"):
        ratios[f"after_catch_up_{pct}_vs_debezium"] = _ratio(
            _figure(rows, run, RELAY, AFTER_CATCH_UP, pct),
            _figure(rows, run, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, pct),
        )
    writers = _figure(rows, run, RELAY, AFTER_CATCH_UP, "writers_rate")
    ratios["after_catch_up_writers_vs_target"] = _ratio(
        writers, _figure(rows, run, RELAY, AFTER_CATCH_UP, "target_rate")
    )
    ratios["after_catch_up_writers_vs_debezium"] = _ratio(
        writers, _figure(rows, run, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, "writers_rate")
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


@dataclass(frozen=True)
class Judged:
    """One line of the verdict: its mark, what is judged, the figure, its bound, and the rest
    (the per-run ratios, or what else was measured beside the judged figure)."""

    mark: str
    label: str
    shown: str
    bound: str = ""
    detail: str = ""

    @property
    def text(self) -> str:
        """The figure, its bound and the rest, as one phrase."""
        parts = (self.shown, self.bound and f"bound {self.bound}", self.detail)
        return ", ".join(part for part in parts if part and part != "-")

    @property
    def line(self) -> str:
        """The line of the printed report."""
        return f"{self.mark:6} {self.label:56} {self.shown:>8}  {self.bound:>9}  {self.detail}"


def _loaded(source: Path | Figures) -> Figures:
    """A figures file's object ({} when there is none), or the object itself."""
    if isinstance(source, Path):
        return json.loads(source.read_text()) if source.is_file() else {}
    return source


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


def results_path() -> Path:
    """Where a run keeps the comparison's figures: BENCH_RESULTS, as bench/test_peers.py
    reads it, or docs/bench/results.json."""
    return Path(os.environ.get("BENCH_RESULTS", RESULTS))


def memory_figures(results: Path | None = None) -> Path:
    """bench/test_memory.py's figures: beside the comparison's (a trial with BENCH_RESULTS
    leaves the figures of make bench's run alone)."""
    return (results or results_path()).with_name(MEMORY.name)


def _memory(source: Path | Figures) -> Judged:
    label = "relay peak RSS, 1,000,000-event backlog"
    figures = _loaded(source)
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
    figures = _loaded(source).get("whatever_the_rows_hold") or {}
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
    figures = _loaded(source)
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
    figures = _loaded(source)
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


def database_line(machine: dict[str, Any]) -> list[str]:
    """The server every system read, and whether over TLS (older files do not say)."""
    if "postgresql_tls" not in machine:
        return []
    tls = "with TLS" if machine["postgresql_tls"] else "without TLS"
    return [f"PostgreSQL {machine.get('postgresql', '?')}, every system connected {tls}"]


def judged(
    document: dict[str, Any],
    *,
    memory: Path | Figures = MEMORY,
    health_cost: Path | Figures = HEALTH_COST,
) -> list[Judged]:
    """Every target's verdict, in the report's order."""
    rows: Rows = document["runs"]
    scale = document.get("scale", {})
    per_run = [per_run_ratios(rows, run) for run in runs_of(rows)]
    lines = []
    for target in targets_for(rows):
        median = median_or_none(r[target.ratio] for r in per_run)
        each = " / ".join(
            "-" if r[target.ratio] is None else f"{r[target.ratio]:.2f}" for r in per_run
        )
        if target.aim is not None and median is not None:
            met = "met" if verdict(median, target.compare, target.aim) == "PASS" else "not met"
            each += f"; aim {target.aim:g}: {met}"
        if target in AFTER_CATCH_UP_TARGETS:
            each += _after_catch_up_medians(rows, target)
        lines.append(
            Judged(
                verdict(median, target.compare, target.bound),
                target.label,
                "-" if median is None else f"{median:.2f}",
                f"{target.compare} {target.bound:g}" if target.compare else "",
                each,
            )
        )
    lines += [
        _rss(rows, int(scale.get("events", 0))),
        _memory(memory),
        _memory_any_rows(memory),
        _health_cost(health_cost),
        _beyond_lookback(health_cost),
    ]
    return lines


def _after_catch_up_medians(rows: Rows, target: Target) -> str:
    """The medians beside a target of the phase after a catch-up: each system's latency
    percentile, or the writers' rate beside each."""
    key = next(k for k in ("writers_rate", "p50", "p99") if k.split("_")[0] in target.ratio)
    unit = "/s" if key == "writers_rate" else " ms"
    spec = ".0f" if key == "writers_rate" else ".1f"
    relay = median_figure(rows, RELAY, AFTER_CATCH_UP, key)
    debezium = median_figure(rows, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, key)
    return f"; relay {_number(relay, spec)}{unit}, Debezium {_number(debezium, spec)}{unit}"


def verdict_lines(
    document: dict[str, Any],
    *,
    memory: Path | Figures = MEMORY,
    health_cost: Path | Figures = HEALTH_COST,
) -> list[tuple[str, str]]:
    """Every target's verdict and its line of the report, in the report's order."""
    return [
        (line.mark, line.line) for line in judged(document, memory=memory, health_cost=health_cost)
    ]


def report_lines(
    document: dict[str, Any],
    *,
    memory: Path | Figures = MEMORY,
    health_cost: Path | Figures = HEALTH_COST,
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
        f"{'':6} {'target':56} {'median':>8}  {'bound':>9}  per run",
        *(line for _, line in verdict_lines(document, memory=memory, health_cost=health_cost)),
    ]
    lines += [
        "",
        f"{'medians':18} {'drain ev/s':>11} {'wall ev/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'RSS MB':>7}",
    ]
    for system in SYSTEMS:
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


# -- the history of judged runs, and the document's block -------------------------------------
def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def history_entry(
    document: Mapping[str, Any],
    *,
    commit: str | None,
    health_cost: Figures,
    memory: Figures,
    note: str = "",
) -> dict[str, Any]:
    """One judged run as a line of the history: when and where it ran, every target's ratios
    (the median and each run's), and its raw figures (the comparison's rows, the sidecar's
    and the memory benchmark's figures)."""
    rows: Rows = document["runs"]
    per_run = [per_run_ratios(rows, run) for run in runs_of(rows)]
    ratios = {
        target.ratio: {
            "median": _rounded(median_or_none(r[target.ratio] for r in per_run)),
            "per_run": [_rounded(r[target.ratio]) for r in per_run],
        }
        for target in targets_for(rows)
    }
    entry: dict[str, Any] = {"commit": commit, "measured_at": document.get("measured_at")}
    if note:
        entry["note"] = note
    entry |= {
        "machine": document.get("machine", {}),
        "scale": document.get("scale", {}),
        "ratios": ratios,
        "health_cost": dict(health_cost) or None,
        "memory": dict(memory) or None,
        "runs": rows,
    }
    return entry


def read_history(path: Path | None = None) -> list[dict[str, Any]]:
    """Every judged run, oldest first."""
    path = path or HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_history(entries: Iterable[Mapping[str, Any]], path: Path | None = None) -> None:
    """Keep the history: one compact JSON object per line."""
    path = path or HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(entry, separators=(",", ":")) + "\n" for entry in entries))


_ENTRY_KEYS = ("commit", "measured_at", "note", "machine", "scale", "ratios", "health_cost")


def _in_order(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry's keys in the history's order, the raw rows last."""
    first = {key: entry[key] for key in _ENTRY_KEYS if key in entry}
    return first | {key: value for key, value in entry.items() if key not in first}


def fold(entries: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The history with ``entry`` in it, oldest first. A run already there (the same
    ``measured_at``: the report read the same figures again) is replaced, keeping the commit
    and the note it was recorded with."""
    kept = []
    for old in entries:
        if old.get("measured_at") != entry.get("measured_at"):
            kept.append(old)
            continue
        recorded = {key: old[key] for key in ("commit", "note") if old.get(key)}
        entry = _in_order({**entry, **recorded})
    return sorted([*kept, entry], key=lambda e: str(e.get("measured_at") or ""))


def current_commit() -> str | None:
    """The checkout's commit, marked when tracked files outside docs/ have changes (the code
    measured is then not that commit's); None outside a git checkout."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+changes" if changed else head


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _markdown_bound(bound: str) -> str:
    return bound.replace("<=", "≤").replace(">=", "≥")


def judged_markdown(entry: Mapping[str, Any]) -> list[str]:
    """A judged run as docs/benchmarks.md shows it: when and where, the verdict per target,
    and each system's medians."""
    rows: Rows = entry["runs"]
    scale = entry.get("scale", {})
    machine = entry.get("machine", {})
    measured = str(entry.get("measured_at") or "?")
    when = measured[:16].replace("T", " ") + " UTC" if len(measured) >= 16 else measured
    where = [f"{machine['cores']} cores"] if machine.get("cores") else []
    if load := machine.get("load_average_at_end"):
        where.append(f"load average {load[0]:.2f} when it ended")
    if "postgresql" in machine:
        tls = {True: " read over TLS", False: " read without TLS"}.get(
            machine.get("postgresql_tls"), ""
        )
        where.append(f"PostgreSQL {machine['postgresql']}{tls}")
    lines = [
        f"**At {entry.get('commit') or 'an unrecorded commit'}, measured {when}**:"
        f" {scale.get('events', 0):,} events per catch-up, {len(runs_of(rows))} runs,"
        f" latency at {scale.get('rate', 0):,} events/s for {scale.get('seconds', '?')} s;"
        f" {', '.join(where)}."
        + (f" {entry['note'][0].upper()}{entry['note'][1:]}." if entry.get("note") else "")
        + " Raw figures: the last line of [`bench/history.jsonl`](bench/history.jsonl).",
        "",
        "| verdict | target | median | bound | per run, or beside it |",
        "|---|---|---|---|---|",
    ]
    for line in judged(
        dict(entry), memory=entry.get("memory") or {}, health_cost=entry.get("health_cost") or {}
    ):
        lines.append(
            f"| {line.mark} | {line.label} | {line.shown} | {_markdown_bound(line.bound)}"
            f" | {line.detail} |"
        )
    lines += [
        "",
        "| system (medians) | catch-up, events/s | latency p50 / p99 / p99.9, ms"
        " | catch-up CPU per event, µs: own / PostgreSQL / broker | peak RSS, MB |",
        "|---|---|---|---|---|",
    ]
    for system in SYSTEMS:
        if not any(row["system"] == system for row in rows):
            continue
        latency = " / ".join(
            _number(median_figure(rows, system, "latency", key), ".1f")
            for key in ("p50", "p99", "p999")
        )
        cpu = " / ".join(
            _number(median_figure(rows, system, "drain", f"{key}_cpu_us_per_event"), ".1f")
            for key, _ in CPU_GROUPS
        )
        lines.append(
            f"| {system} | {_number(median_figure(rows, system, 'drain', 'rate'), ',.0f')}"
            f" | {latency} | {cpu}"
            f" | {_number(median_figure(rows, system, 'drain', 'peak_rss_mb'), '.0f')} |"
        )
    return lines


def judged_block(entry: Mapping[str, Any]) -> list[str]:
    """The judged-run block of docs/benchmarks.md, its markers included."""
    return [BLOCK_BEGIN, "", *judged_markdown(entry), "", BLOCK_END]


def documented_block(text: str) -> list[str]:
    """The judged-run block as a document holds it, its markers included."""
    lines = text.splitlines()
    if BLOCK_BEGIN not in lines or BLOCK_END not in lines:
        raise ValueError("no judged-run block (its two marker lines) in the document")
    begin = lines.index(BLOCK_BEGIN)
    return lines[begin : lines.index(BLOCK_END, begin) + 1]


def with_judged_block(text: str, entry: Mapping[str, Any]) -> str:
    """The document with its judged-run block written from ``entry``."""
    lines = text.splitlines()
    old = documented_block(text)
    begin = lines.index(BLOCK_BEGIN)
    return "\n".join([*lines[:begin], *judged_block(entry), *lines[begin + len(old) :]]) + "\n"


def trend_lines(entries: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per judged run, oldest first: the median ratios of the judged targets."""
    columns = (
        ("p50_vs_debezium", "p50"),
        ("p99_vs_debezium", "p99"),
        ("drain_vs_send", "drain/send"),
        ("cpu_vs_debezium", "cpu/Dbz"),
        ("drain_vs_debezium", "drain/Dbz"),
    )
    lines = [
        f"{'measured (UTC)':16} {'commit':9} {'load':>5} "
        + " ".join(f"{label:>10}" for _, label in columns)
        + f" {'sidecar':>7}  note"
    ]
    for entry in entries:
        ratios = entry.get("ratios", {})
        cells = [_number(ratios.get(key, {}).get("median"), ".2f") for key, _ in columns]
        load = (entry.get("machine", {}).get("load_average_at_end") or [None])[0]
        sidecar = (entry.get("health_cost") or {}).get("ratio_to_sidecar_empty")
        lines.append(
            f"{str(entry.get('measured_at') or '?')[:16].replace('T', ' '):16}"
            f" {entry.get('commit') or '?':9} {_number(load, '.1f'):>5} "
            + " ".join(f"{cell:>10}" for cell in cells)
            + f" {_number(sidecar, '.2f'):>7}  {entry.get('note', '')}"
        )
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
    """Keep one benchmark's raw figures as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Print the report, fold make bench's run into the history and the document, draw the
    plot; 1 when any judged target FAILs (or there are no figures)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "results", nargs="?", type=Path, help="default: BENCH_RESULTS, or " + str(RESULTS)
    )
    parser.add_argument(
        "--plot", type=Path, help="where to draw the plot (default: peers.png beside the figures)"
    )
    parser.add_argument(
        "--history", action="store_true", help="print one line per judged run and exit"
    )
    args = parser.parse_args(argv)
    if args.history:
        print("\n".join(trend_lines(read_history())))
        return 0
    source: Path = args.results or results_path()
    # make bench's own run is kept; figures from anywhere else are a trial
    keep = source.resolve() == RESULTS.resolve()
    plot_to: Path | None = args.plot
    if source.is_file():
        document = json.loads(source.read_text())
        entry = history_entry(
            document,
            commit=document.get("commit") or (current_commit() if keep else None),
            health_cost=_loaded(HEALTH_COST),
            memory=_loaded(memory_figures(source)),
        )
        # a trial's plot goes beside its figures, never over the one of the last judged run
        plot_to = plot_to or source.with_name(PLOT.name)
        origin = str(source)
    elif keep and (history := read_history()):
        entry = history[-1]
        origin = f"{HISTORY}, its newest line"
    else:
        print(f"no peer-comparison figures at {source}: run `make bench` first")
        return 1
    memory, health_cost = entry["memory"] or {}, entry["health_cost"] or {}
    print("\n".join(report_lines(entry, memory=memory, health_cost=health_cost)))
    if keep:
        history = fold(read_history(), entry) if source.is_file() else read_history()
        if source.is_file():
            write_history(history)
        text = BENCHMARKS.read_text()
        try:
            rewritten = with_judged_block(text, history[-1])
        except ValueError as exc:
            print(f"\n{BENCHMARKS}: {exc}")
            return 1
        if rewritten != text:
            BENCHMARKS.write_text(rewritten)
        print(
            f"\nhistory: {HISTORY} ({len(history)} judged runs)\n"
            f"{BENCHMARKS.name}: judged run {'rewritten' if rewritten != text else 'as written'}"
        )
    if plot_to is not None:
        plot(entry, plot_to)
        print(f"\nplot: {plot_to}")
    print(f"raw figures: {origin}")
    judgement = judged(entry, memory=memory, health_cost=health_cost)
    failed = [line.line for line in judgement if line.mark == "FAIL"]
    if failed:
        print(f"\n{len(failed)} target(s) FAIL:", *failed, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
