"""A stand-alone benchmark's runs (bench.cpu_per_event, bench.after_catch_up): every run
measures each condition in turn, each run starting one condition further along, so a
machine that drifts favours none; one line per measurement as it ends, the medians after
the last, every measurement appended to ``--json`` as a JSON line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

Condition = TypeVar("Condition")
Figures = dict[str, Any]


def rotated(conditions: Sequence[Condition], run: int) -> list[Condition]:
    """``conditions`` in run ``run``'s order (from 0): starting ``run`` places along."""
    shift = run % len(conditions)
    return [*conditions[shift:], *conditions[:shift]]


def main_runs(
    tool: str,
    *,
    runs: int,
    conditions: Callable[[int], Sequence[Condition]],
    measure: Callable[[str, str, Condition], Awaitable[Figures]],
    show: Callable[[Figures], str],
    medians: Callable[[list[Figures]], str],
    json_lines: Path | None,
) -> int:
    """Every run's ``conditions(run)`` measured against the services of the environment
    (``measure(server_url, bootstrap, condition)``) and shown; 2 without the services."""
    server_url = os.environ.get("DATABASE_URL")
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if not server_url or not bootstrap:
        print(
            f"bench.{tool}: DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are needed (.services/env)",
            file=sys.stderr,
        )
        return 2

    async def every_run() -> list[Figures]:
        results = []
        for run in range(runs):
            for condition in conditions(run):
                figures = await measure(server_url, bootstrap, condition)
                figures["run"] = run + 1
                results.append(figures)
                print(show(figures), flush=True)
        return results

    results = asyncio.run(every_run())
    print(f"\n{medians(results)}", flush=True)
    if json_lines:
        with json_lines.open("a") as out:
            for figures in results:
                out.write(json.dumps(figures, default=str) + "\n")
    return 0
