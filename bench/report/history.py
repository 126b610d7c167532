"""The history of judged runs (docs/bench/history.jsonl, one line per run: its commit, date,
machine, ratios and raw figures) and the judged-run block of docs/benchmarks.md written from
its newest line."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench.report import files
from bench.report.files import Figures
from bench.report.judging import (
    SYSTEMS,
    Rows,
    formatted,
    median_figure,
    median_or_none,
    per_run_ratios,
    runs_of,
    targets_for,
)
from bench.report.printed import CPU_GROUPS, judged

BLOCK_BEGIN = (
    "<!-- judged run: written by `python -m bench.report` from docs/bench/history.jsonl;"
    " edits here are overwritten -->"
)
BLOCK_END = "<!-- end of the judged run -->"


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
    path = path or files.HISTORY
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_history(entries: Iterable[Mapping[str, Any]], path: Path | None = None) -> None:
    """Keep the history: one compact JSON object per line."""
    path = path or files.HISTORY
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
            formatted(median_figure(rows, system, "latency", key), ".1f")
            for key in ("p50", "p99", "p999")
        )
        cpu = " / ".join(
            formatted(median_figure(rows, system, "drain", f"{key}_cpu_us_per_event"), ".1f")
            for key, _ in CPU_GROUPS
        )
        lines.append(
            f"| {system} | {formatted(median_figure(rows, system, 'drain', 'rate'), ',.0f')}"
            f" | {latency} | {cpu}"
            f" | {formatted(median_figure(rows, system, 'drain', 'peak_rss_mb'), '.0f')} |"
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
        cells = [formatted(ratios.get(key, {}).get("median"), ".2f") for key, _ in columns]
        load = (entry.get("machine", {}).get("load_average_at_end") or [None])[0]
        sidecar = (entry.get("health_cost") or {}).get("ratio_to_sidecar_empty")
        lines.append(
            f"{str(entry.get('measured_at') or '?')[:16].replace('T', ' '):16}"
            f" {entry.get('commit') or '?':9} {formatted(load, '.1f'):>5} "
            + " ".join(f"{cell:>10}" for cell in cells)
            + f" {formatted(sidecar, '.2f'):>7}  {entry.get('note', '')}"
        )
    return lines
