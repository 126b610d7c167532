"""The printed report: every target's verdict in the report's order, then each system's
medians, its CPU per event by process group and by PostgreSQL process kind, and the broker's
timing of its Produce requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report.costs import cost_verdicts
from bench.report.files import HEALTH_COST, MEMORY, Figures
from bench.report.judging import (
    DEBEZIUMS,
    RAW_BATCH,
    RAW_SEND,
    RELAY,
    SYSTEMS,
    Judged,
    Rows,
    median_figure,
    ratio_verdicts,
    runs_of,
)


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
    return ratio_verdicts(rows) + cost_verdicts(
        rows, int(scale.get("events", 0)), memory=memory, health_cost=health_cost
    )


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
