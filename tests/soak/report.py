"""The soak's summary (printed, and written to ``soak.md``) and its plot (PNG): publish rate,
backlog and each family's classification over the run, fault windows marked."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import TYPE_CHECKING

from tests.soak.schedule import FAMILIES, MIN_SHARE, RECOVERY_S

if TYPE_CHECKING:
    from tests.soak.run import SoakResult

PLOT_NAME = "soak.png"
LEVEL = {"within_bounds": 0, "unknown": 1, "stalled": 2}
COLOURS = ("tab:green", "grey", "tab:red")


def summary_lines(r: SoakResult) -> list[str]:
    """The summary as plain lines: what a run proved, with its seed and commit."""
    a = r.audit
    recoveries = [x for x in r.health.recovery_s if x is not None]
    load_s = r.config.seconds if r.load_s is None else r.load_s
    planned = (
        f"{r.config.seconds:.0f} planned, the rest as faults overran; "
        if load_s - r.config.seconds >= 1
        else ""
    )
    lines = [
        f"soak {'PASSED' if r.passed else 'FAILED'}: {load_s:.0f} s of load "
        f"({planned}whole run {r.elapsed_s:.0f} s), seed {r.config.seed}, commit {r.commit}",
        f"machine: {os.cpu_count()} cores, 1-minute load average {r.load[0]:.1f} at the start, "
        f"{r.load[1]:.1f} at the end",
        f"events committed: {a.events} (commits in doubt resolved: {r.doubtful_commits}); "
        f"records read: {a.records}; terminal scoring jobs: {a.terminal_jobs}",
        f"lost: {len(a.lost)}",
        f"order violations: {len(a.order_violations)}",
        f"scoring jobs without exactly one event: {len(a.job_problems)}",
        f"duplicates: {a.duplicates} ({_counts(a.duplicates_by_fault)}; unexplained: "
        f"{a.unexplained_duplicates})",
        f"drained at the end: {'yes' if r.drained else 'NO'}",
        f"faults: {len(r.health.recovery_s)} of {len(r.faults)} scheduled ({_counts(_kinds(r))})",
        "recovery to all families within bounds (s): "
        + (
            f"max {max(recoveries):.1f}, mean {sum(recoveries) / len(recoveries):.1f} "
            f"(allowed {RECOVERY_S:.0f})"
            if recoveries
            else "none measured"
        ),
        f"health expectations broken: {len(r.health.broken)}",
        f"processes that exited by themselves: {len(r.unexpected_exits)}",
        f"run problems: {len(r.problems)}",
    ]
    lines += [f"  - {e}" for e in r.unexpected_exits]
    lines += [f"  - {b}" for b in r.health.broken]
    lines += [f"  - {p}" for p in r.problems]
    lines += [f"  - {u}" for u in r.health.unjudged]
    lines += [f"  lost id {i}" for i in a.lost[:10]]
    lines += [f"  order: {_short(v)}" for v in a.order_violations[:10]]
    lines += [f"  jobs: {p}" for p in a.job_problems[:10]]
    return lines


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items())) or "none"


def _kinds(r: SoakResult) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for f in r.faults:
        if f.started is None:
            continue
        kinds[f.fault.kind.value] = kinds.get(f.fault.kind.value, 0) + 1
    return kinds


def write_report(r: SoakResult, directory: Path) -> None:
    """``soak.md`` and ``soak.png`` in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    plot(r, directory / PLOT_NAME)
    (directory / "soak.md").write_text(markdown(r))


def markdown(r: SoakResult) -> str:
    """The document: summary, schedule with what health said, memory and table bloat."""
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Soak under faults",
        "",
        "`make soak` (`SOAK_SECONDS`, default 600; `SOAK_SEED` to repeat a schedule) runs the "
        "whole system on a PostgreSQL 18 and a Kafka broker of its own: writers committing "
        "outbox events on many keys (each recorded in a ledger outside the product's tables "
        "with its key's counter), scoring workers on the writer SDK, three relays (one "
        "behind a fault proxy), the health sidecar and a consumer of every topic, under a "
        "seeded fault schedule. It ends with an audit of Kafka against the ledger and of "
        "`/health` against the schedule. A two-minute run is part of `make test` "
        "(`tests/soak/test_soak.py`). The harness lives in `tests/soak/`.",
        "",
        f"## This run ({when})",
        "",
        "```",
        *summary_lines(r),
        "```",
        "",
        f"![publish rate, backlog and health over the run]({PLOT_NAME})",
        "",
        "## Faults",
        "",
        "| # | at (s) | fault | lasted (s) | what happened | health expected and seen | recovered after (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    done = [record for record in r.faults if record.started is not None]
    for i, record in enumerate(done):
        f = record.fault
        assert record.started is not None and record.ended is not None
        seen = ", ".join(r.health.seen_expected[i]) if i < len(r.health.seen_expected) else ""
        recovery = r.health.recovery_s[i] if i < len(r.health.recovery_s) else None
        out.append(
            f"| {i} | {record.started:.0f} | {f.kind.value} | {record.ended - record.started:.0f} "
            f"| {record.note} | "
            f"{seen or '—'} | {'—' if recovery is None else f'{recovery:.1f}'} |"
        )
    out += [
        "",
        "## Peak memory (resident set, KiB)",
        "",
        "| process | peak RSS |",
        "|---|---|",
        *(f"| {name} | {kib} |" for name, kib in sorted(r.peak_rss_kib.items())),
        "",
        "## Hot tables at the end",
        "",
        "| table | live tuples | dead tuples |",
        "|---|---|---|",
        *(f"| {t} | {live} | {dead} |" for t, (live, dead) in sorted(r.dead_tuples.items())),
        "",
        "## What is checked",
        "",
        "- **lost**: every id in the ledger is on Kafka (a commit whose acknowledgement was "
        "lost to a fault is looked up by its key's counter before it is counted or not);",
        "- **order**: per key, first occurrences in commit order and the last record the "
        "latest event;",
        "- **scoring jobs**: every completed or quarantined job has exactly one event id on "
        "its topic, no other job has one;",
        "- **duplicates**: counted, each attributed to the latest-begun fault whose window "
        "(plus the recovery allowance and 10 s) holds its produce time;",
        "- **health**: during each PostgreSQL restart every family `unknown` with "
        "`database unavailable`; after a killed worker's lease expired `scoring_jobs` "
        "`stalled` with `expired_lease_count`; during a broker restart `outbox` `stalled` on "
        "its oldest pending age; outside the fault windows every family `within_bounds`, "
        f"again at most {RECOVERY_S:.0f} s after each fault's end (a fault after which "
        "health did not come back in time is broken); `/livez` 200 for every relay neither "
        "killed nor stopped. `tests/soak/test_audit.py` shows the auditor catches a planted "
        "drop and a planted reorder;",
        "- **the run itself**: every scheduled fault applied (one that fails to apply fails "
        "the run; one that overran pushes the later ones back and the load runs on by as "
        f"much); at least {MIN_SHARE:.0%} of the events the configuration asks for "
        f"({r.config.events_per_second:g}/s) committed and of its scoring jobs "
        f"({r.config.jobs_per_second:g}/s) terminal, a `/health` sample for at least "
        f"{MIN_SHARE:.0%} of its seconds, and no harness task died on the way.",
        "",
    ]
    return "\n".join(out)


def plot(r: SoakResult, path: Path) -> None:
    """Three stacked panels over the run's seconds, fault windows shaded in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, backlog, health) = plt.subplots(
        3, 1, figsize=(12, 8), sharex=True, gridspec_kw={"height_ratios": [2, 2, 2]}
    )
    rate.plot([t for t, _ in r.publish_per_second], [n for _, n in r.publish_per_second], lw=0.8)
    rate.set_ylabel("new events read / s")
    points = [(t, n) for t, n in r.backlog if n is not None]
    backlog.plot([t for t, _ in points], [n for _, n in points], lw=0.8, color="tab:orange")
    backlog.set_ylabel("outbox pending")
    for i, family in enumerate(FAMILIES):
        xs, ys, colours = [], [], []
        for s in r.samples:
            if s.families is not None and family in s.families:
                level = LEVEL.get(s.families[family][0], 1)
                xs.append(s.t)
                ys.append(i + 0.3 * level)
                colours.append(COLOURS[level])
        health.scatter(xs, ys, s=3, c=colours)
    health.set_yticks(range(len(FAMILIES)), FAMILIES)
    health.set_xlabel("seconds since start (green within bounds, grey unknown, red stalled)")
    # Shaded: when each fault really began and ended (a late one is shifted from its plan).
    happened = [(x.fault.kind.value, x.started, x.ended) for x in r.faults if x.started is not None]
    for ax in (rate, backlog, health):
        for _, started, ended in happened:
            ax.axvspan(started, ended or started, color="tab:red", alpha=0.12)
    for kind, started, _ in happened:
        rate.annotate(
            kind,
            (started, 1),
            xycoords=("data", "axes fraction"),
            fontsize=6,
            rotation=90,
            va="top",
        )
    fig.suptitle(f"soak: {r.config.seconds:.0f} s, seed {r.config.seed}, commit {r.commit}")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _short(violation: str) -> str:
    """A key's violation without its whole history: the key and where the order breaks."""
    key, _, rest = violation.partition(": ")
    if not rest.startswith("first occurrences ["):
        return violation[:300]
    firsts = [int(n) for n in rest[len("first occurrences [") : rest.index("]")].split(", ") if n]
    breaks = [i for i in range(1, len(firsts)) if firsts[i] != firsts[i - 1] + 1]
    around = firsts[max(0, breaks[0] - 2) : breaks[0] + 4] if breaks else firsts[-5:]
    return f"{key}: first occurrences ... {around} ... (of {len(firsts)})"
