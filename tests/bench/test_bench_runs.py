"""bench/runs.py: the stand-alone benchmarks' runs, each starting one condition further along."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.runs import main_runs, rotated


def test_each_run_starts_one_condition_further_along() -> None:
    assert [rotated("abc", run) for run in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_every_run_is_measured_shown_summed_up_and_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://db")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "broker:9092")
    seen: list[tuple[str, str, str]] = []

    async def measure(server_url: str, bootstrap: str, condition: str) -> dict[str, Any]:
        seen.append((server_url, bootstrap, condition))
        return {"condition": condition, "at": tmp_path}

    out = tmp_path / "figures.jsonl"
    code = main_runs(
        "tool",
        runs=2,
        conditions=lambda run: rotated(["x", "y"], run),
        measure=measure,
        show=lambda f: f"{f['run']} {f['condition']}",
        medians=lambda results: f"medians of {len(results)}",
        json_lines=out,
    )
    assert code == 0
    assert [c for _, _, c in seen] == ["x", "y", "y", "x"]
    assert {(u, b) for u, b, _ in seen} == {("postgresql://db", "broker:9092")}
    assert capsys.readouterr().out == "1 x\n1 y\n2 y\n2 x\n\nmedians of 4\n"
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(f["run"], f["condition"], f["at"]) for f in lines] == [
        (1, "x", str(tmp_path)),
        (1, "y", str(tmp_path)),
        (2, "y", str(tmp_path)),
        (2, "x", str(tmp_path)),
    ]


def test_without_the_services_it_says_so_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)

    async def measure(server_url: str, bootstrap: str, condition: str) -> dict[str, Any]:
        raise AssertionError("measured without the services")

    code = main_runs(
        "tool",
        runs=1,
        conditions=lambda run: ["x"],
        measure=measure,
        show=str,
        medians=str,
        json_lines=None,
    )
    assert code == 2
    assert capsys.readouterr().err == (
        "bench.tool: DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS are needed (.services/env)\n"
    )
