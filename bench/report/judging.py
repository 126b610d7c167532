"""The judging: the design's targets, each one's ratio within a run, and the verdict on the
median of those ratios over the runs. Pure functions over a run's rows; the bottom of
bench/report (it imports nothing of the report's)."""

from __future__ import annotations

import operator
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

RELAY = "relay"
DEBEZIUM_LATENCY_TUNED = "debezium-poll1ms"
DEBEZIUMS = ("debezium-poll1ms", "debezium-poll10ms")
RAW_SEND = "raw-send"
RAW_BATCH = "raw-send_batch"
SYSTEMS = (RELAY, *DEBEZIUMS, RAW_SEND, RAW_BATCH)


Rows = list[dict[str, Any]]


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


def run_figure(rows: Rows, run: int, system: str, phase: str, key: str) -> float | None:
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
    own = run_figure(rows, run, system, "drain", "client_cpu_us_per_event")
    # runs measured before the meter split PostgreSQL's processes by kind count them all
    spent = run_figure(rows, run, system, "drain", database)
    if spent is None:
        spent = run_figure(rows, run, system, "drain", "postgres_cpu_us_per_event")
    return None if own is None or spent is None else own + spent


def per_run_ratios(rows: Rows, run: int) -> dict[str, float | None]:
    """Every target's ratio within one run; None where a system of it was not measured."""
    relay_rate = run_figure(rows, run, RELAY, "drain", "rate")
    debezium_rates = [
        rate
        for name in DEBEZIUMS
        if (rate := run_figure(rows, run, name, "drain", "rate")) is not None
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
        "drain_vs_send": _ratio(relay_rate, run_figure(rows, run, RAW_SEND, "drain", "rate")),
        "drain_vs_send_batch": _ratio(
            relay_rate, run_figure(rows, run, RAW_BATCH, "drain", "rate")
        ),
        "drain_vs_debezium": _ratio(relay_rate, max(debezium_rates, default=None)),
        "cpu_vs_debezium": _ratio(relay_cpu, min(debezium_cpus, default=None)),
    }
    for key, other in (("", DEBEZIUM_LATENCY_TUNED), ("10", "debezium-poll10ms")):
        for pct in ("p50", "p99"):
            ratios[f"{pct}_vs_debezium{key}"] = _ratio(
                run_figure(rows, run, RELAY, "latency", pct),
                run_figure(rows, run, other, "latency", pct),
            )
    for pct in ("p50", "p99"):
        ratios[f"after_catch_up_{pct}_vs_debezium"] = _ratio(
            run_figure(rows, run, RELAY, AFTER_CATCH_UP, pct),
            run_figure(rows, run, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, pct),
        )
    writers = run_figure(rows, run, RELAY, AFTER_CATCH_UP, "writers_rate")
    ratios["after_catch_up_writers_vs_target"] = _ratio(
        writers, run_figure(rows, run, RELAY, AFTER_CATCH_UP, "target_rate")
    )
    ratios["after_catch_up_writers_vs_debezium"] = _ratio(
        writers, run_figure(rows, run, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, "writers_rate")
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
    return median_or_none(run_figure(rows, run, system, phase, key) for run in runs_of(rows))


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


def formatted(value: float | None, spec: str) -> str:
    """A figure as the report shows it: "-" where there is none."""
    return "-" if value is None else format(value, spec)


def _after_catch_up_medians(rows: Rows, target: Target) -> str:
    """The medians beside a target of the phase after a catch-up: each system's latency
    percentile, or the writers' rate beside each."""
    key = next(k for k in ("writers_rate", "p50", "p99") if k.split("_")[0] in target.ratio)
    unit = "/s" if key == "writers_rate" else " ms"
    spec = ".0f" if key == "writers_rate" else ".1f"
    relay = median_figure(rows, RELAY, AFTER_CATCH_UP, key)
    debezium = median_figure(rows, DEBEZIUM_LATENCY_TUNED, AFTER_CATCH_UP, key)
    return f"; relay {formatted(relay, spec)}{unit}, Debezium {formatted(debezium, spec)}{unit}"


def ratio_verdicts(rows: Rows) -> list[Judged]:
    """The verdict of every target on a ratio within a run, in the report's order."""
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
    return lines
