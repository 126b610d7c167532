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
from pathlib import Path
from typing import Any

from bench.report import files
from bench.report.history import (
    fold,
    history_entry,
    read_history,
    trend_lines,
    with_judged_block,
    write_history,
)
from bench.report.plot import plot
from bench.report.printed import judged, report_lines


def main(argv: list[str] | None = None) -> int:
    """Print the report, fold make bench's run into the history and the document, draw the
    plot; 1 when any judged target FAILs (or there are no figures)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.report", description=(__doc__ or "").splitlines()[0]
    )
    parser.add_argument(
        "results", nargs="?", type=Path, help="default: BENCH_RESULTS, or " + str(files.RESULTS)
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
    source: Path = args.results or files.results_path()
    # make bench's own run is kept; figures from anywhere else are a trial
    keep = source.resolve() == files.RESULTS.resolve()
    plot_to: Path | None = args.plot
    if source.is_file():
        document = json.loads(source.read_text())
        entry = history_entry(
            document,
            commit=document.get("commit") or (files.current_commit() if keep else None),
            health_cost=files.loaded(files.HEALTH_COST),
            memory=files.loaded(files.memory_figures(source)),
        )
        # a trial's plot goes beside its figures, never over the one of the last judged run
        plot_to = plot_to or source.with_name(files.PLOT.name)
        origin = str(source)
    elif keep and (history := read_history()):
        entry = history[-1]
        origin = f"{files.HISTORY}, its newest line"
    else:
        print(f"no peer-comparison figures at {source}: run `make bench` first")
        return 1
    memory, health_cost = entry["memory"] or {}, entry["health_cost"] or {}
    print("\n".join(report_lines(entry, memory=memory, health_cost=health_cost)))
    if keep and not _write_judged_run(entry, new_figures=source.is_file()):
        return 1
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


def _write_judged_run(entry: dict[str, Any], *, new_figures: bool) -> bool:
    """Fold make bench's run into the history (when its figures are new) and write the
    document's judged-run block from the newest line; False when the document has no block."""
    history = fold(read_history(), entry) if new_figures else read_history()
    if new_figures:
        write_history(history)
    text = files.BENCHMARKS.read_text()
    try:
        rewritten = with_judged_block(text, history[-1])
    except ValueError as exc:
        print(f"\n{files.BENCHMARKS}: {exc}")
        return False
    if rewritten != text:
        files.BENCHMARKS.write_text(rewritten)
    print(
        f"\nhistory: {files.HISTORY} ({len(history)} judged runs)\n"
        f"{files.BENCHMARKS.name}: judged run {'rewritten' if rewritten != text else 'as written'}"
    )
    return True
