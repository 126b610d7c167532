"""docs/benchmarks.md's judged run is what bench/report/ writes from docs/bench/history.jsonl,
and make bench's run reaches the history and the document exactly once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.report import files, judging, printed
from bench.report.history import (
    BLOCK_BEGIN,
    BLOCK_END,
    documented_block,
    fold,
    history_entry,
    judged_block,
    read_history,
    trend_lines,
    write_history,
)
from bench.report.main import main

HISTORY = read_history()


def _row(run: int, system: str, phase: str, **figures: float) -> dict[str, object]:
    return {"run": run, "system": system, "phase": phase, **figures}


def test_the_history_holds_every_judged_run_once_oldest_first() -> None:
    assert len(HISTORY) >= 20
    measured = [entry["measured_at"] for entry in HISTORY]
    assert measured == sorted(measured)
    assert len(set(measured)) == len(measured)
    for entry in HISTORY:
        assert entry["commit"], entry["measured_at"]
        assert len(entry["machine"]["load_average_at_end"]) == 3
        assert entry["runs"] and entry["scale"]["events"] > 0


def test_the_documents_judged_run_is_what_the_report_writes_from_the_newest_line() -> None:
    text = files.BENCHMARKS.read_text(encoding="utf-8")
    assert documented_block(text) == judged_block(HISTORY[-1])


@pytest.mark.parametrize("entry", HISTORY, ids=lambda entry: str(entry["commit"]))
def test_each_lines_ratios_are_the_ones_its_raw_figures_give(entry: dict[str, Any]) -> None:
    again = history_entry(
        entry,
        commit=entry["commit"],
        health_cost=entry["health_cost"] or {},
        memory=entry["memory"] or {},
    )
    assert again["ratios"] == entry["ratios"]


def test_the_cpu_target_weighs_the_relays_backends_against_the_cheaper_debezium() -> None:
    rows = [
        _row(
            1,
            "relay",
            "drain",
            client_cpu_us_per_event=10.0,
            postgres_cpu_us_per_event=12.0,
            pg_backends_cpu_us_per_event=9.0,
        ),
        _row(
            1,
            "debezium-poll1ms",
            "drain",
            client_cpu_us_per_event=100,
            postgres_cpu_us_per_event=20,
        ),
        _row(
            1, "debezium-poll10ms", "drain", client_cpu_us_per_event=70, postgres_cpu_us_per_event=6
        ),
        # a run from before PostgreSQL's processes were split by kind: all of them count
        _row(2, "relay", "drain", client_cpu_us_per_event=10.0, postgres_cpu_us_per_event=12.0),
        _row(
            2, "debezium-poll1ms", "drain", client_cpu_us_per_event=80, postgres_cpu_us_per_event=8
        ),
    ]
    assert judging.per_run_ratios(rows, 1)["cpu_vs_debezium"] == pytest.approx(19 / 76)
    assert judging.per_run_ratios(rows, 2)["cpu_vs_debezium"] == pytest.approx(22 / 88)
    assert judging.per_run_ratios(rows[:1], 1)["cpu_vs_debezium"] is None


@pytest.fixture
def bench_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """docs/bench and docs/benchmarks.md in a temporary directory, the history holding the
    newest judged run, as make bench meets them."""
    bench = tmp_path / "bench"
    bench.mkdir()
    for name, value in (
        ("RESULTS", bench / "results.json"),
        ("HEALTH_COST", bench / "health_cost.json"),
        ("MEMORY", bench / "memory.json"),
        ("HISTORY", bench / "jsonl"),
        ("PLOT", bench / "peers.png"),
        ("BENCHMARKS", tmp_path / "benchmarks.md"),
    ):
        monkeypatch.setattr(files, name, value)
    monkeypatch.delenv("BENCH_RESULTS", raising=False)
    write_history(HISTORY[-1:])
    files.BENCHMARKS.write_text(
        f"# Benchmarks\n\nbefore\n\n{BLOCK_BEGIN}\nstale\n{BLOCK_END}\n\nafter\n"
    )
    return bench


def _make_bench_leaves_its_figures(bench: Path, measured_at: str) -> None:
    newest = HISTORY[-1]
    document = {
        "commit": "abc1234",
        "measured_at": measured_at,
        "scale": newest["scale"],
        "machine": newest["machine"],
        "runs": newest["runs"],
    }
    files.write_results(bench / "results.json", document)
    files.write_results(bench / "memory.json", {"backlog": 1_000_000, "peak_rss_mb": 70.0})
    files.write_results(bench / "health_cost.json", newest["health_cost"])


def test_make_benchs_run_is_folded_once_and_written_into_the_document(bench_dir: Path) -> None:
    _make_bench_leaves_its_figures(bench_dir, "2099-01-01T00:00:00+00:00")
    assert main([]) == 1  # the newest run's CPU target FAILs, as the history says

    history = read_history()
    assert [entry["commit"] for entry in history] == [HISTORY[-1]["commit"], "abc1234"]
    assert history[-1]["memory"]["peak_rss_mb"] == 70.0
    text = files.BENCHMARKS.read_text()
    assert documented_block(text) == judged_block(history[-1])
    assert text.startswith("# Benchmarks\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert (bench_dir / "peers.png").stat().st_size > 0

    # The same figures read again change nothing; with none, the newest line is judged again.
    main([])
    assert read_history() == history
    assert files.BENCHMARKS.read_text() == text
    (bench_dir / "results.json").unlink()
    assert main([]) == 1
    assert read_history() == history
    assert files.BENCHMARKS.read_text() == text


def test_a_trials_figures_leave_the_history_and_the_document_alone(
    bench_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trial = tmp_path / "trial"
    trial.mkdir()
    _make_bench_leaves_its_figures(trial, "2099-01-01T00:00:00+00:00")
    monkeypatch.setenv("BENCH_RESULTS", str(trial / "results.json"))
    history, text = read_history(), files.BENCHMARKS.read_text()
    main([])
    assert read_history() == history
    assert files.BENCHMARKS.read_text() == text
    assert (trial / "peers.png").is_file() and not (bench_dir / "peers.png").exists()


def test_a_run_read_again_keeps_the_commit_and_note_it_was_recorded_with() -> None:
    recorded = {**HISTORY[-1], "commit": "1234567", "note": "quiet machine"}
    again = {key: value for key, value in HISTORY[-1].items() if key != "note"}
    again["commit"] = "89abcde"
    (folded,) = fold([recorded], again)
    assert (folded["commit"], folded["note"]) == ("1234567", "quiet machine")
    assert list(folded)[:3] == ["commit", "measured_at", "note"]


def test_a_document_without_the_block_is_refused() -> None:
    with pytest.raises(ValueError, match="judged-run block"):
        documented_block("# Benchmarks\n")


def test_the_trend_has_a_line_per_run() -> None:
    lines = trend_lines(HISTORY)
    assert len(lines) == len(HISTORY) + 1
    assert all(str(entry["commit"]) in line for entry, line in zip(HISTORY, lines[1:], strict=True))


@pytest.mark.parametrize(("peak", "mark"), [(249.0, "PASS"), (250.0, "PASS"), (251.0, "FAIL")])
def test_memory_with_rows_of_tens_of_mb_is_judged_against_its_own_bound(
    peak: float, mark: str
) -> None:
    figures = {
        "backlog": 1_000_000,
        "peak_rss_mb": 60.0,
        "whatever_the_rows_hold": {
            "near_limit_rows": 500,
            "oversized_rows": 6,
            "oversized_mb": 48,
            "peak_rss_mb": peak,
        },
    }
    document = {"runs": [], "scale": {"events": 200_000}}
    lines = {line.label: line for line in printed.judged(document, memory=figures, health_cost={})}
    line = lines["relay peak RSS, rows of tens of MB in the backlog"]
    assert (line.mark, line.shown, line.bound) == (mark, f"{peak:.0f} MB", "<= 250 MB")
    assert lines["relay peak RSS, 1,000,000-event backlog"].mark == "PASS"
    del figures["whatever_the_rows_hold"]
    assert printed.judged(document, memory=figures, health_cost={})[-3].mark == "n/a"
