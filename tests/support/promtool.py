"""Prometheus's own ``promtool`` as the judge of the monitoring kit: rule files checked, their
unit tests run, and real scrapes of running processes turned into its input series, so
an alert fires or not exactly as a Prometheus server would decide.

promtool comes from Debian's ``prometheus`` package (``bash scripts/tools.sh ensure
promtool``, which ``make test`` runs); without it a test fails under
``OUTBOX_RELAY_REQUIRE_SERVICES=1`` and is skipped otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support.services import REQUIRED

MISSING = "promtool is not installed: bash scripts/tools.sh ensure promtool"
# Sample names whose value only ever grows: extrapolated at the rate the two scrapes show.
_GROWING = ("_total", "_bucket", "_count", "_sum")
# A Unix time of something the process keeps doing: it keeps up with the clock.
_CLOCK = "_timestamp_seconds"


def promtool() -> str:
    """The path of promtool; fails the test (or skips it) when it is not installed."""
    found = shutil.which("promtool")
    if found is None:
        if REQUIRED:
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` with its output captured."""
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@dataclass(frozen=True)
class Target:
    """One scraped process: the labels its PodMonitor gives its series, and two scrapes of
    its /metrics ``seconds`` apart, the last at ``at`` (Unix time)."""

    labels: Mapping[str, str]
    first: str
    last: str
    seconds: float
    at: float


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # a counter's creation time: no rule reads it
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def series_names(text: str) -> set[str]:
    """The name of every sample a scrape carries (a family declared without a sample, as
    a labelled counter before its first use, has none)."""
    return {name for name, _ in _samples(text)}


def _selector(name: str, labels: Mapping[str, str]) -> str:
    pairs = ", ".join(f'{key}="{_escaped(value)}"' for key, value in sorted(labels.items()))
    return f"{name}{{{pairs}}}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value))


def held_series(
    targets: Sequence[Target], *, interval_s: int, samples: int
) -> list[dict[str, str]]:
    """promtool input series: what the two scrapes of each target say, held for
    ``samples`` scrapes ``interval_s`` apart. A gauge keeps its last value; a counter or
    histogram keeps growing at the rate seen between the two scrapes; a ``*_timestamp_seconds``
    gauge keeps its lag behind the clock (promtool's clock starts at 0 at the first sample).
    Every target answers its scrapes (``up`` is 1)."""
    series = []
    for target in targets:
        series.append({"series": _selector("up", target.labels), "values": f"1+0x{samples}"})
        first = _samples(target.first)
        for (name, labels), last in _samples(target.last).items():
            selector = _selector(name, {**dict(labels), **target.labels})
            if name.endswith(_CLOCK):
                lag = target.at - last
                values = f"{_number(-lag)}+{interval_s}x{samples}"
            elif name.endswith(_GROWING) and (name, labels) in first:
                per_scrape = (last - first[(name, labels)]) / target.seconds * interval_s
                values = f"{_number(last)}+{_number(max(per_scrape, 0.0))}x{samples}"
            else:
                values = f"{_number(last)}+0x{samples}"
            series.append({"series": selector, "values": values})
    return series


def firing_check(
    rule_file: Path,
    targets: Sequence[Target],
    *,
    firing: Mapping[str, int],
    interval_s: int,
    hold_s: int,
    queries: Sequence[Mapping[str, Any]] = (),
    directory: Path,
) -> subprocess.CompletedProcess[str]:
    """Run promtool over the targets' series held for ``hold_s``: at the end exactly the
    alerts in ``firing`` fire (name → how many), and each of ``queries`` (promtool's
    ``promql_expr_test`` entries, evaluated at the same time) gives its samples."""
    samples = hold_s // interval_s
    eval_time = f"{samples * interval_s}s"
    expected = [
        {"labels": f'{{alertname="{name}"}}', "value": count} for name, count in firing.items()
    ]
    test = {
        "rule_files": [str(rule_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": f"{interval_s}s",
                "input_series": held_series(targets, interval_s=interval_s, samples=samples),
                "promql_expr_test": [
                    {
                        "expr": 'count by (alertname) (ALERTS{alertstate="firing"})',
                        "eval_time": eval_time,
                        "exp_samples": expected,
                    },
                    *({**query, "eval_time": eval_time} for query in queries),
                ],
            }
        ],
    }
    path = directory / "scrapes.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return run("test", "rules", path)
