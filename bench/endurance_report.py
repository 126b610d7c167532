"""docs/bench/endurance.md's run and its plot, from an endurance run's figures (bench/endurance.py).

The document's run block (between its two marker lines) is written whole from the figures
file, so it always shows one run: its verdict (bench/endurance_verdict.py), the audit, the
bursts, every minute's figures, the statements that cost most each minute, and the
outbox's indexes at the end. The rest of the document is the method, written by hand.

    python -m bench.endurance_report [docs/bench/endurance.jsonl] [--doc PATH] [--plot PNG]

Exits 1 when the verdict FAILs or the audit found an event lost, duplicated into the
count or out of order; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import endurance_verdict
from bench.endurance_verdict import MinuteFigures, Verdict

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "bench" / "endurance.jsonl"
DOCUMENT = ROOT / "docs" / "bench" / "endurance.md"
PLOT = ROOT / "docs" / "bench" / "endurance.png"
PRUNE_INTERVAL_S = 10  # the relay's prune interval (relay/config.py, its default)
MB = 2**20
BLOCK_BEGIN = (
    "<!-- the run: written by `python -m bench.endurance_report` from"
    " docs/bench/endurance.jsonl; edits here are overwritten -->"
)
BLOCK_END = "<!-- end of the run -->"


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's line and its minutes' lines."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    runs = [line for line in lines if line.get("kind") == "run"]
    if len(runs) != 1:
        raise ValueError(f"{path}: {len(runs)} run lines, one expected")
    return runs[0], sorted(
        (line for line in lines if line.get("kind") == "minute"), key=lambda m: m["minute"]
    )


def excluded_spans(run: Mapping[str, Any]) -> list[tuple[float, float | None]]:
    """Each burst's span, from the relay's stop to the end of its catch-up."""
    return [(float(b["stopped_s"]), b.get("caught_up_s")) for b in run.get("bursts", [])]


def minute_figures(minutes: Sequence[Mapping[str, Any]]) -> list[MinuteFigures]:
    """What the verdict reads of each minute."""
    return [
        MinuteFigures(
            index=int(m["minute"]),
            p99=(m.get("latency_ms") or {}).get("p99"),
            writer_rate=m["committed"] / 60,
            sizes={name: int(t["total_bytes"]) for name, t in m["tables"].items()},
        )
        for m in minutes
    ]


def verdict_of(run: Mapping[str, Any], minutes: Sequence[Mapping[str, Any]]) -> Verdict:
    """The run's verdict."""
    plan = run["plan"]
    return endurance_verdict.judge(
        minute_figures(minutes),
        excluded_spans(run),
        rate=float(plan["rate"]),
        settle_s=plan["retention_ms"] / 1000 + PRUNE_INTERVAL_S,
    )


def _n(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / MB:.1f}"


def minute_row(m: Mapping[str, Any], steady: bool) -> str:
    """One minute as a row of the per-minute table."""
    latency = m.get("latency_ms") or {}
    inserts = m["insert_ms"]
    cpu = m["cpu_us_per_event"]
    groups = cpu.get("postgres_by_group") or {}
    outbox = m["tables"].get("outbox", {})
    receipts = m["tables"].get("outbox_receipt", {})
    pg_split = " / ".join(
        _n(groups.get(g), ".0f") for g in ("relay", "sidecar", "writers", "autovacuum")
    )
    return (
        f"| {m['minute']} | {'yes' if steady else 'no'} | {m['committed'] / 60:.0f}"
        f" | {m['published'] / 60:.0f}"
        f" | {_n(latency.get('p50'))} / {_n(latency.get('p99'))} / {_n(latency.get('max'), '.0f')}"
        f" | {_n(inserts.get('p50'), '.2f')} / {_n(inserts.get('p99'))}"
        f" | {_n(cpu.get('relay'), '.0f')} | {_n(cpu.get('sidecar'), '.0f')}"
        f" | {_n(cpu.get('postgres'), '.0f')} ({pg_split}) | {_n(groups.get('cluster'), '.0f')}"
        f" | {_mb(outbox.get('heap_bytes'))} / {_mb(outbox.get('index_bytes'))}"
        f" | {outbox.get('dead', '-')} | {outbox.get('autovacuums_in_minute', '-')}"
        f" | {_mb(receipts.get('heap_bytes'))} / {_mb(receipts.get('index_bytes'))}"
        f" | {receipts.get('dead', '-')} | {receipts.get('autovacuums_in_minute', '-')}"
        f" | {m.get('load_average', '-')} |"
    )


def statements_row(m: Mapping[str, Any], top: int = 4) -> str:
    """One minute's most expensive statements: name, total ms, calls, blocks per call."""
    cells = [
        f"{s['name']}: {s['total_ms']:.0f} ms, {s['calls']} calls, {s['blocks_per_call']:.0f} blk"
        for s in m.get("top_statements", [])[:top]
    ]
    return f"| {m['minute']} | " + " | ".join(cells + [""] * (top - len(cells))) + " |"


def markdown(run: Mapping[str, Any], minutes: Sequence[Mapping[str, Any]]) -> str:
    """The run block, its marker lines included."""
    plan = run["plan"]
    machine = run.get("machine", {})
    audit = run.get("audit", {})
    after = run.get("after", {})
    verdict = verdict_of(run, minutes)
    steady = set(endurance_verdict.steady_minutes(len(minutes), excluded_spans(run)))
    load_start = (machine.get("load_average_at_start") or [None])[0]
    load_end = (machine.get("load_average_at_end") or [None])[0]
    settings = machine.get("settings", {})
    lines = [
        BLOCK_BEGIN,
        "",
        f"**Verdict: {verdict.line}**",
        "",
        f"Measured at {run.get('commit') or 'an unrecorded commit'}, {run.get('measured_at')}:"
        f" {plan['minutes']} minutes at {plan['rate']:,} events/s ({plan['rate_basis']}"
        + (
            f"; the writers' highest sustained rate measured first: {run['writers_ceiling']:,}/s"
            if run.get("writers_ceiling")
            else ""
        )
        + f"), receipts kept {plan['retention_ms'] / 1000:.0f} s, the relay stopped for"
        f" {plan['burst_seconds']} s every {plan['burst_every_minutes']} minutes;"
        f" PostgreSQL {machine.get('postgresql', '?')}"
        f" {'over TLS' if machine.get('postgresql_tls') else 'without TLS'},"
        f" autovacuum_naptime {settings.get('autovacuum_naptime', '?')} s; load average"
        f" {_n(load_start, '.2f')} at the start, {_n(load_end, '.2f')} at the end"
        f" ({machine.get('cores', '?')} cores, which PostgreSQL, the broker, the writers and"
        " the relay share with whatever else runs: the absolute figures are the machine's).",
        "",
        f"Audit: {audit.get('committed', 0):,} events committed, {audit.get('records', 0):,}"
        f" records on the topic, {audit.get('duplicates', 0):,} duplicates,"
        f" {audit.get('order_or_loss_problems', 0)} keys with an event lost or out of order;"
        f" {after.get('outbox_rows', '?')} rows left in the outbox"
        f" ({after.get('quarantined', '?')} quarantined).",
        "",
        "![latency, rate, CPU per event, sizes and dead tuples per minute](endurance.png)",
        "",
        "### Bursts",
        "",
        "| relay stopped, s | started again, s | waiting then | caught up, s | catch-up, s"
        " | catch-up, events/s |",
        "|---|---|---|---|---|---|",
    ]
    for b in run.get("bursts", []):
        lines.append(
            f"| {b['stopped_s']:.0f} | {_n(b.get('restarted_s'), '.0f')}"
            f" | {b.get('backlog') or '-'} | {_n(b.get('caught_up_s'), '.0f')}"
            f" | {_n(b.get('catch_up_s'))} | {b.get('catch_up_rate') or '-'} |"
        )
    lines += [
        "",
        "### Per minute",
        "",
        "Events/s committed and published; latency p50 / p99 / max and the writers' insert"
        " p50 / p99 in ms; CPU in µs per event published: the relay's process, the sidecar's,"
        " PostgreSQL's for this database (its backends serving the relay / the sidecar / the"
        " writers, and autovacuum), the cluster's shared processes; sizes in MB (heap /"
        " indexes), dead tuples and autovacuum runs in the minute per table; the machine's"
        " one-minute load average.",
        "",
        "| min | steady | committed/s | published/s | latency, ms | insert, ms | relay µs"
        " | sidecar µs | PostgreSQL µs (relay / sidecar / writers / autovacuum) | cluster µs"
        " | outbox MB | outbox dead | outbox vacuums | receipts MB | receipts dead"
        " | receipts vacuums | load |",
        "|" + "---|" * 17,
    ]
    lines += [minute_row(m, m["minute"] in steady) for m in minutes]
    lines += [
        "",
        "### Statements by execution time",
        "",
        "pg_stat_statements of this database, each minute's four most expensive statements"
        " (total execution time, calls, shared blocks per call).",
        "",
        "| min | 1st | 2nd | 3rd | 4th |",
        "|---|---|---|---|---|",
    ]
    lines += [statements_row(m) for m in minutes]
    index_tuples = after.get("index_tuples") or []
    if index_tuples:
        lines += [
            "",
            "### The outbox's indexes at the end",
            "",
            "pgstattuple after the last event was published: every row deleted, dead index"
            " entries not yet removed by vacuum.",
            "",
            "| index | MB | live entries | dead entries | free % |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {i['name']} | {_mb(i['bytes'])} | {i['live']} | {i['dead']}"
            f" | {i['free_percent']:.0f} |"
            for i in index_tuples
        ]
    return "\n".join([*lines, "", BLOCK_END])


def with_run(text: str, block: str) -> str:
    """The document with its run block replaced by ``block``."""
    lines = text.splitlines()
    if BLOCK_BEGIN not in lines or BLOCK_END not in lines:
        raise ValueError("no run block (its two marker lines) in the document")
    begin = lines.index(BLOCK_BEGIN)
    end = lines.index(BLOCK_END, begin)
    return "\n".join([*lines[:begin], block, *lines[end + 1 :]]) + "\n"


def plot(run: Mapping[str, Any], minutes: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Four panels over the run's minutes, each burst's span shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [m["minute"] + 0.5 for m in minutes]
    figure, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    latency, rate, cpu, sizes = axes
    for key, style in (("p50", "-o"), ("p99", "-s"), ("max", ":^")):
        latency.plot(
            xs, [(m.get("latency_ms") or {}).get(key) for m in minutes], style, ms=3, label=key
        )
    latency.set_yscale("log")
    latency.set_ylabel("commit → broker, ms")
    latency.legend(fontsize=8)
    rate.plot(xs, [m["committed"] / 60 for m in minutes], "-o", ms=3, label="committed")
    rate.plot(xs, [m["published"] / 60 for m in minutes], "-s", ms=3, label="published")
    rate.axhline(run["plan"]["rate"], color="grey", lw=0.8, ls="--")
    rate.set_ylabel("events/s")
    rate.legend(fontsize=8)
    series = (
        ("relay process", lambda m: m["cpu_us_per_event"].get("relay")),
        ("PostgreSQL (this database)", lambda m: m["cpu_us_per_event"].get("postgres")),
        (
            "of which the writers",
            lambda m: (m["cpu_us_per_event"].get("postgres_by_group") or {}).get("writers"),
        ),
        ("sidecar process", lambda m: m["cpu_us_per_event"].get("sidecar")),
    )
    for label, value in series:
        cpu.plot(xs, [value(m) for m in minutes], "-o", ms=3, label=label)
    cpu.set_ylabel("CPU µs per event")
    cpu.legend(fontsize=8)
    for table, style in (("outbox", "-o"), ("outbox_receipt", "-s")):
        sizes.plot(
            xs,
            [m["tables"].get(table, {}).get("total_bytes", 0) / MB for m in minutes],
            style,
            ms=3,
            label=f"{table} MB",
        )
    sizes.set_ylabel("total size, MB")
    dead = sizes.twinx()
    for table, style in (("outbox", ":"), ("outbox_receipt", "--")):
        dead.plot(
            xs,
            [m["tables"].get(table, {}).get("dead", 0) for m in minutes],
            style,
            color="grey",
            label=f"{table} dead tuples",
        )
    dead.set_ylabel("dead tuples")
    handles = sizes.get_legend_handles_labels()
    more = dead.get_legend_handles_labels()
    sizes.legend(handles[0] + more[0], handles[1] + more[1], fontsize=8)
    sizes.set_xlabel("minute of the run")
    for axis in axes:
        for start, end in excluded_spans(run):
            axis.axvspan(start / 60, (end if end is not None else start + 60) / 60, color="0.9")
    figure.suptitle(
        f"endurance at {run['plan']['rate']:,} events/s, {run.get('commit')}, "
        f"{run.get('measured_at')} (shaded: relay stopped, then catching up; shared machine)",
        fontsize=10,
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    """Write the document and the plot; print the verdict."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("figures", nargs="?", type=Path, default=FIGURES)
    parser.add_argument("--doc", type=Path, default=DOCUMENT)
    parser.add_argument("--plot", type=Path, default=PLOT)
    args = parser.parse_args(argv)
    run, minutes = load(args.figures)
    args.doc.write_text(with_run(args.doc.read_text(), markdown(run, minutes)))
    plot(run, minutes, args.plot)
    verdict = verdict_of(run, minutes)
    print(f"verdict: {verdict.line}\ndocument: {args.doc}\nplot: {args.plot}")
    return 0 if verdict.passed and run.get("audit", {}).get("passed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
