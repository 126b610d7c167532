"""The endurance run's verdict (bench/endurance_verdict.py) and what decides it: steady minutes,
the trend test, the p99 and size bounds; the burst schedule; the document written from the
figures."""

from __future__ import annotations

import math
import random

import pytest

from bench import endurance_report
from bench.endurance import Plan, minute_of, quantiles
from bench.endurance_verdict import (
    MinuteFigures,
    judge,
    mann_kendall,
    steady_minutes,
    theil_sen,
    trend,
)

SIZES = {"outbox": 50 * 2**20, "outbox_receipt": 30 * 2**20}
BURSTS = [(600.0, 672.0), (1200.0, 1268.0)]  # the relay stopped at 10 and 20 min, caught up
RATE = 1000.0
SETTLE_S = 130.0


def _minutes(
    count: int = 30,
    *,
    p99: float = 10.0,
    noise: float = 1.0,
    sizes: dict[str, int] | None = None,
    rate: float = RATE,
    seed: int = 7,
) -> list[MinuteFigures]:
    draw = random.Random(seed)
    return [
        MinuteFigures(
            index=m,
            p99=p99 + draw.uniform(-noise, noise),
            writer_rate=rate,
            sizes=dict(sizes or SIZES),
        )
        for m in range(count)
    ]


def test_a_minute_that_overlaps_a_burst_or_its_catch_up_is_not_steady() -> None:
    steady = steady_minutes(30, BURSTS)
    assert 10 not in steady and 11 not in steady and 20 not in steady and 21 not in steady
    assert 9 in steady and 12 in steady and 22 in steady
    assert len(steady) == 26
    # a catch-up that never ended leaves out the rest of the run
    assert steady_minutes(5, [(120.0, None)]) == [0, 1]
    # a span that ends exactly on a minute's start leaves that minute steady
    assert steady_minutes(3, [(60.0, 120.0)]) == [0, 2]


def test_mann_kendall_finds_a_rise_and_nothing_in_a_flat_or_falling_series() -> None:
    s, z, p = mann_kendall([1, 2, 3, 4, 5])
    assert s == 10
    # var = 5·4·15 / 18; z = (S - 1) / sqrt(var)
    assert z == pytest.approx(9 / math.sqrt(50 / 3))
    assert p == pytest.approx(0.0138, abs=1e-4)
    assert mann_kendall([3.0] * 10) == (0, 0.0, 0.5)
    assert mann_kendall([5, 4, 3, 2, 1])[2] > 0.95


def test_ties_lower_the_variance_of_the_statistic() -> None:
    _, z_ties, _ = mann_kendall([1, 1, 2, 2, 3, 3])
    _, z_distinct, _ = mann_kendall([1, 1.1, 2, 2.1, 3, 3.1])
    assert z_ties > 0 and z_distinct > 0
    # the same order with ties: fewer concordant pairs, but a smaller variance too
    s_ties, _, _ = mann_kendall([1, 1, 2, 2, 3, 3])
    assert s_ties == 12


def test_theil_sen_is_the_slope_of_a_line_and_ignores_an_outlier() -> None:
    xs = [float(x) for x in range(10)]
    assert theil_sen(xs, [2 * x + 1 for x in xs]) == pytest.approx(2.0)
    ys = [2 * x + 1 for x in xs]
    ys[4] = 500.0
    assert theil_sen(xs, ys) == pytest.approx(2.0)
    assert theil_sen([1.0, 1.0], [0.0, 5.0]) == 0.0


def test_a_trend_must_be_significant_and_big_enough_to_matter() -> None:
    rising_little = [(m, 100.0 + 0.1 * m) for m in range(20)]  # significant, +2 % over the run
    assert trend(rising_little).p_increasing < 0.05
    assert not trend(rising_little).rising
    rising_much = [(m, 10.0 + m) for m in range(20)]
    assert trend(rising_much).rising
    noise = random.Random(3)
    flat = [(m, 10.0 + noise.uniform(-3, 3)) for m in range(20)]
    assert not trend(flat).rising


def test_a_flat_run_passes() -> None:
    verdict = judge(_minutes(), BURSTS, rate=RATE, settle_s=SETTLE_S)
    assert verdict.passed, verdict.line
    assert verdict.line.startswith("PASS: ")
    assert {check.name for check in verdict.checks} == {
        "rate",
        "p99",
        "p99 trend",
        "outbox size",
        "outbox size trend",
        "outbox_receipt size",
        "outbox_receipt size trend",
    }


def test_burst_minutes_do_not_count_however_slow() -> None:
    minutes = _minutes()
    for m in (10, 11, 20, 21):
        minutes[m] = MinuteFigures(m, 60_000.0, 400.0, dict(SIZES))
    assert judge(minutes, BURSTS, rate=RATE, settle_s=SETTLE_S).passed


def test_a_p99_that_doubles_in_the_last_ten_steady_minutes_fails() -> None:
    minutes = [
        MinuteFigures(m.index, (m.p99 or 0) * (2 if m.index >= 19 else 1), m.writer_rate, m.sizes)
        for m in _minutes()
    ]
    verdict = judge(minutes, BURSTS, rate=RATE, settle_s=SETTLE_S)
    assert not verdict.passed
    failed = {check.name for check in verdict.checks if not check.passed}
    assert "p99" in failed
    assert verdict.line.startswith("FAIL: p99")  # failures first


def test_a_p99_that_creeps_up_fails_the_trend_though_within_its_bound() -> None:
    minutes = [
        MinuteFigures(m, 10.0 + 0.15 * m, RATE, dict(SIZES)) for m in range(30)
    ]  # last ten / first ten about 1.3: within 1.5
    verdict = judge(minutes, BURSTS, rate=RATE, settle_s=SETTLE_S)
    by_name = {check.name: check for check in verdict.checks}
    assert by_name["p99"].passed
    assert not by_name["p99 trend"].passed


def test_a_table_that_keeps_growing_fails_its_bound_and_its_trend() -> None:
    minutes = [
        MinuteFigures(
            m.index,
            m.p99,
            m.writer_rate,
            {**SIZES, "outbox": SIZES["outbox"] + m.index * 4 * 2**20},
        )
        for m in _minutes()
    ]
    checks = {c.name: c for c in judge(minutes, BURSTS, rate=RATE, settle_s=SETTLE_S).checks}
    assert not checks["outbox size"].passed
    assert not checks["outbox size trend"].passed
    assert checks["outbox_receipt size"].passed


def test_sizes_are_held_to_the_first_steady_minute_after_the_first_catch_up() -> None:
    # the first burst grows the table once; later minutes reuse that space
    minutes = [
        MinuteFigures(
            m.index,
            m.p99,
            m.writer_rate,
            {**SIZES, "outbox": SIZES["outbox"] * (3 if m.index >= 10 else 1)},
        )
        for m in _minutes()
    ]
    checks = {c.name: c for c in judge(minutes, BURSTS, rate=RATE, settle_s=SETTLE_S).checks}
    assert checks["outbox size"].passed, checks["outbox size"].text
    assert "minute 12's" in checks["outbox size"].text


def test_writers_below_the_rate_fail_the_run() -> None:
    verdict = judge(_minutes(rate=900.0), BURSTS, rate=RATE, settle_s=SETTLE_S)
    assert [c.name for c in verdict.checks if not c.passed] == ["rate"]


def test_a_short_run_is_not_judged() -> None:
    verdict = judge(_minutes(8), [], rate=RATE, settle_s=SETTLE_S)
    assert not verdict.passed
    texts = {c.name: c.text for c in verdict.checks}
    assert texts["p99"].startswith("not judged")


def test_bursts_start_every_period_and_end_two_minutes_before_the_run() -> None:
    assert Plan(minutes=30).burst_starts() == [600, 1200]
    assert Plan(minutes=60).burst_starts() == [600, 1200, 1800, 2400, 3000]
    assert Plan(minutes=32).burst_starts() == [600, 1200]  # 1800 would restart at 31
    assert Plan(minutes=33).burst_starts() == [600, 1200, 1800]
    assert Plan(minutes=30, burst_every_minutes=0).burst_starts() == []


def test_minutes_and_quantiles_of_the_run() -> None:
    assert minute_of(-0.1) == -1
    assert minute_of(0.0) == 0
    assert minute_of(119.9) == 1
    assert quantiles([]) == {"p50": None, "p99": None, "max": None}
    assert quantiles([float(v) for v in range(1, 101)]) == {"p50": 50.0, "p99": 99.0, "max": 100.0}


def test_the_document_is_what_the_report_writes_from_the_committed_figures() -> None:
    if not endurance_report.FIGURES.is_file():
        pytest.skip("no endurance figures committed yet")
    run, minutes = endurance_report.load(endurance_report.FIGURES)
    text = endurance_report.DOCUMENT.read_text()
    assert endurance_report.with_run(text, endurance_report.markdown(run, minutes)) == text
    verdict = endurance_report.verdict_of(run, minutes)
    assert f"**Verdict: {verdict.line}**" in endurance_report.DOCUMENT.read_text()
