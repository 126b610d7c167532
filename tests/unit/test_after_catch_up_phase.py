"""make bench's latency phase after a catch-up (bench/peers/comparison.py, after_catch_up): which
runs measure it, and how bench/report/ judges it, beside the phases that keep their method."""

from __future__ import annotations

import pytest

from bench import after_catch_up
from bench.peers.comparison import PHASES, Scale
from bench.report import history, judging, printed


def _row(run: int, system: str, phase: str, **figures: float) -> dict[str, object]:
    return {"run": run, "system": system, "phase": phase, **figures}


def _after(run: int, system: str, p50: float, p99: float, writers: float) -> dict[str, object]:
    return _row(
        run,
        system,
        "after_catch_up",
        p50=p50,
        p99=p99,
        writers_rate=writers,
        target_rate=1000.0,
    )


ROWS = [
    _row(1, "relay", "latency", p50=1.6, p99=7.0),
    _row(1, "debezium-poll1ms", "latency", p50=2.0, p99=10.0),
    _after(1, "relay", 3.0, 12.0, 990.0),
    _after(1, "debezium-poll1ms", 2.0, 30.0, 1000.0),
    _after(2, "relay", 2.0, 10.0, 760.0),
    _after(2, "debezium-poll1ms", 2.0, 25.0, 1000.0),
    _after(3, "relay", 2.2, 11.0, 995.0),
    _after(3, "debezium-poll1ms", 2.0, 20.0, 1000.0),
]


def test_the_phase_is_measured_for_the_relay_and_the_latency_tuned_debezium_only() -> None:
    scale = Scale(runs=3)
    assert scale.after_catch_up_systems() == ("relay", "debezium-poll1ms")
    assert scale.after_catch_up_measurements() == 3 * 2
    # the phases before it count as they did
    assert scale.measurements() == 3 * (5 + 2 + 4)
    only = Scale(runs=3, phases=("after_catch_up",))
    assert only.measurements() == 0
    assert only.after_catch_up_measurements() == 6
    assert Scale(runs=2, phases=("drain", "latency")).after_catch_up_measurements() == 0
    assert Scale(systems=("relay", "raw-send")).after_catch_up_systems() == ("relay",)
    assert PHASES == ("drain", "latency", "after_catch_up")


def test_its_ratios_are_taken_within_one_run_from_its_own_phase() -> None:
    ratios = judging.per_run_ratios(ROWS, 1)
    assert ratios["after_catch_up_p50_vs_debezium"] == pytest.approx(1.5)
    assert ratios["after_catch_up_p99_vs_debezium"] == pytest.approx(0.4)
    assert ratios["after_catch_up_writers_vs_target"] == pytest.approx(0.99)
    assert ratios["after_catch_up_writers_vs_debezium"] == pytest.approx(0.99)
    # the steady phase on a fresh database keeps its own figures
    assert ratios["p50_vs_debezium"] == pytest.approx(0.8)
    assert judging.per_run_ratios(ROWS, 2)["after_catch_up_writers_vs_target"] == pytest.approx(
        0.76
    )


def test_it_is_judged_against_the_designs_bounds_with_the_aim_beside_them() -> None:
    lines = {line.label: line for line in printed.judged({"runs": ROWS}, memory={}, health_cost={})}
    p50 = lines["after a catch-up, latency p50: relay / Debezium (poll 1 ms)"]
    # per run 1.5 / 1.0 / 1.1: the median 1.1 is within 1.2, the aim 0.5 is not met
    assert (p50.mark, p50.shown, p50.bound) == ("PASS", "1.10", "<= 1.2")
    assert "1.50 / 1.00 / 1.10; aim 0.5: not met" in p50.detail
    assert "relay 2.2 ms, Debezium 2.0 ms" in p50.detail
    p99 = lines["after a catch-up, latency p99: relay / Debezium (poll 1 ms)"]
    assert (p99.mark, p99.shown) == ("PASS", "0.40")
    assert "aim 0.5: met" in p99.detail
    writers = lines["after a catch-up, writers beside the relay / target rate"]
    # the median 0.99 passes, though one run's writers reached 760/s
    assert (writers.mark, writers.shown, writers.bound) == ("PASS", "0.99", ">= 0.98")
    assert "0.99 / 0.76 / 0.99" in writers.detail
    beside = lines["after a catch-up, writers beside the relay / beside Debezium"]
    assert beside.mark == "PASS"
    assert "relay 990/s, Debezium 1000/s" in beside.detail


def test_a_slow_phase_after_a_catch_up_fails_its_targets() -> None:
    rows = [_after(run, "relay", 5.0, 17.0, 800.0) for run in (1, 2, 3)] + [
        _after(run, "debezium-poll1ms", 2.0, 35.0, 1000.0) for run in (1, 2, 3)
    ]
    marks = {
        line.label: line.mark
        for line in printed.judged({"runs": rows}, memory={}, health_cost={})
        if line.label.startswith("after a catch-up")
    }
    assert marks == {
        "after a catch-up, latency p50: relay / Debezium (poll 1 ms)": "FAIL",
        "after a catch-up, latency p99: relay / Debezium (poll 1 ms)": "PASS",
        "after a catch-up, writers beside the relay / target rate": "FAIL",
        "after a catch-up, writers beside the relay / beside Debezium": "FAIL",
    }


def test_runs_that_did_not_measure_it_neither_judge_nor_record_it() -> None:
    rows = ROWS[:2]
    labels = [line.label for line in printed.judged({"runs": rows}, memory={}, health_cost={})]
    assert not any(label.startswith("after a catch-up") for label in labels)
    entry = history.history_entry({"runs": rows}, commit="abc1234", health_cost={}, memory={})
    assert not any(key.startswith("after_catch_up") for key in entry["ratios"])
    # a run that measured it keeps its ratios in the history line
    entry = history.history_entry({"runs": ROWS}, commit="abc1234", health_cost={}, memory={})
    assert entry["ratios"]["after_catch_up_p50_vs_debezium"]["per_run"] == [1.5, 1.0, 1.1]


def test_a_profiles_samples_are_split_by_the_step_they_belong_to() -> None:
    loop = "_run_once (asyncio/base_events.py:1922);_run (asyncio/events.py:80)"
    folded = "\n".join(
        [
            f"{loop};_fetch (relay/engine.py:410);fetch_ready (relay/store.py:289) 25",
            f"{loop};_send (relay/engine.py:500);map_rows (relay/records.py:120) 20",
            f"{loop};_acknowledge (relay/engine.py:600);record_outcome (relay/store.py:330) 10",
            f"{loop};_process_notification (asyncpg/connection.py:1700) 5",
            f"{loop};_read_ready__data_received (asyncio/selector_events.py:1000) 25",
            f"{loop};select (selectors.py:468) 5",
            # the relay's own code between the steps, on top of the loop's frames
            f"{loop};_pass (relay/engine.py:300) 5",
            "main (outbox_relay/cli.py:10) 5",
        ]
    )
    assert after_catch_up.profile_shares(folded) == {
        "fetch (fetch_ready)": 0.25,
        "socket reads and TLS (protocol callbacks)": 0.25,
        "send (mapping, batches, producer)": 0.2,
        "bookkeeping (record_outcome)": 0.1,
        "wake-up (notifications)": 0.05,
        "event loop (select, scheduling)": 0.05,
        "other": 0.1,
    }
