"""The completion tracker's window arithmetic (health/families/completion_window.py), one
case per rule docs/health.md states for the incremental check. No services: the horizon
read, the remembered state and what the check found are passed in; the integration
tests (tests/health/test_completion_*.py) stage the same rules against PostgreSQL."""

from __future__ import annotations

import pytest

from health.families.completion_window import (
    Checked,
    Horizon,
    TrackerState,
    WindowPlan,
    WithoutReceipt,
    conclude,
    horizon_margin_ms,
    plan_window,
    sweep_step_us,
)

S = 1_000_000  # one second in microseconds
CLOCK = 10_000_000 * S
GRACE_MS, LOOKBACK_MS = 30_000, 86_400_000
MARGIN_MS, PERIOD_MS = 1000, 21_600_000
WINDOW_START = CLOCK - LOOKBACK_MS * 1000
UPPER = CLOCK - GRACE_MS * 1000


def horizon(clock_us: int = CLOCK, oldest_open_us: int | None = None) -> Horizon:
    return Horizon(clock_us=clock_us, oldest_open_us=oldest_open_us, blind=False)


def plan(
    state: TrackerState | None,
    seen: Horizon | None = None,
    *,
    grace_ms: int = GRACE_MS,
    lookback_ms: int = LOOKBACK_MS,
    margin_ms: int = MARGIN_MS,
    recheck_period_ms: int = PERIOD_MS,
) -> WindowPlan:
    planned = plan_window(
        state,
        seen or horizon(),
        grace_ms=grace_ms,
        lookback_ms=lookback_ms,
        margin_ms=margin_ms,
        recheck_period_ms=recheck_period_ms,
    )
    assert planned is not None
    return planned


def state(**overrides: object) -> TrackerState:
    """What an evaluation 5 s before ``CLOCK`` left behind."""
    values: dict[str, object] = {
        "grace_ms": GRACE_MS,
        "lookback_ms": LOOKBACK_MS,
        "watermark_us": UPPER - 5 * S,
        "horizon_us": UPPER - 5 * S,
        "clock_us": CLOCK - 5 * S,
        "missing": frozenset({"job-missing"}),
        "provisional": frozenset({"job-pending"}),
        "sweep_us": WINDOW_START + 3600 * S,
    }
    values.update(overrides)
    return TrackerState(**values)  # type: ignore[arg-type]


def job(ref: str, *, settled: bool = True, pending: bool = False, at: int = 1) -> WithoutReceipt:
    return WithoutReceipt(ref, settled, pending, at)


def concluded(planned: WindowPlan, *found: WithoutReceipt) -> Checked:
    checked = conclude(planned, found, max_remembered=10, max_provisional=10)
    assert checked is not None
    return checked


# -- the horizon ---------------------------------------------------------------------------
def test_a_transaction_the_role_cannot_see_leaves_only_the_full_check() -> None:
    blind = Horizon(clock_us=CLOCK, oldest_open_us=None, blind=True)
    assert (
        plan_window(
            state(),
            blind,
            grace_ms=GRACE_MS,
            lookback_ms=LOOKBACK_MS,
            margin_ms=MARGIN_MS,
            recheck_period_ms=PERIOD_MS,
        )
        is None
    )


def test_new_jobs_are_checked_up_to_the_grace_and_settle_below_it() -> None:
    planned = plan(None)
    assert planned.upper_us == UPPER
    # A grace longer than the margin leaves nothing of the margin to take.
    assert planned.settle_us == UPPER


def test_an_open_transaction_holds_the_horizon_at_its_start() -> None:
    planned = plan(None, horizon(oldest_open_us=UPPER - 60 * S))
    assert planned.upper_us == UPPER
    assert planned.settle_us == UPPER - 60 * S


def test_the_margin_lowers_the_horizon_by_what_the_grace_leaves_uncovered() -> None:
    assert horizon_margin_ms(MARGIN_MS, 0) == MARGIN_MS
    assert horizon_margin_ms(MARGIN_MS, 400) == 600
    assert horizon_margin_ms(MARGIN_MS, GRACE_MS) == 0
    assert plan(None, grace_ms=0).settle_us == CLOCK - MARGIN_MS * 1000


# -- start over or go on -------------------------------------------------------------------
def test_the_first_evaluation_checks_the_whole_window_and_remembers_nothing() -> None:
    planned = plan(None)
    assert not planned.kept
    assert planned.window_start_us == planned.scan_from_us == WINDOW_START
    assert planned.remembered == frozenset()
    assert planned.sweep_from_us == planned.sweep_to_us == planned.next_sweep_us == WINDOW_START


def test_a_kept_state_scans_from_its_watermark_and_rechecks_its_refs() -> None:
    planned = plan(state())
    assert planned.kept
    assert planned.scan_from_us == UPPER - 5 * S
    assert planned.remembered == {"job-missing", "job-pending"}


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"grace_ms": GRACE_MS + 1}, "the grace changed"),
        ({"lookback_ms": LOOKBACK_MS - 1}, "the look-back changed"),
        ({"clock_us": CLOCK + 1}, "the database clock went back"),
        ({"horizon_us": UPPER + 1}, "the horizon moved back: something open was not seen"),
    ],
)
def test_the_state_is_dropped_when_it_can_no_longer_be_trusted(
    change: dict[str, int], why: str
) -> None:
    planned = plan(state(**change))
    assert not planned.kept, why
    assert planned.scan_from_us == WINDOW_START
    assert planned.remembered == frozenset()


def test_a_watermark_that_fell_out_of_the_window_scans_from_the_window_start() -> None:
    planned = plan(state(watermark_us=WINDOW_START - S, sweep_us=WINDOW_START - S))
    assert planned.kept
    assert planned.scan_from_us == WINDOW_START
    assert planned.sweep_from_us == WINDOW_START


# -- the rolling re-check ------------------------------------------------------------------
def test_the_sweep_moves_so_that_it_overtakes_the_window_once_per_period() -> None:
    # (L + P) / P of the elapsed time: a one-day window, a six-hour period, 5 s elapsed.
    step = sweep_step_us(
        lookback_ms=LOOKBACK_MS, grace_ms=0, recheck_period_ms=PERIOD_MS, elapsed_us=5 * S
    )
    assert step == 25 * S
    # Rounded up, never down: a step of a microsecond still moves the cursor.
    assert sweep_step_us(lookback_ms=2, grace_ms=0, recheck_period_ms=3, elapsed_us=1) == 2
    assert sweep_step_us(lookback_ms=2, grace_ms=0, recheck_period_ms=3, elapsed_us=-5) == 0


def test_a_kept_state_sweeps_the_next_slice_after_its_cursor() -> None:
    planned = plan(state())
    step = sweep_step_us(
        lookback_ms=LOOKBACK_MS, grace_ms=GRACE_MS, recheck_period_ms=PERIOD_MS, elapsed_us=5 * S
    )
    assert planned.sweep_from_us == WINDOW_START + 3600 * S
    assert planned.sweep_to_us == planned.next_sweep_us == planned.sweep_from_us + step


def test_the_sweep_stops_at_the_watermark_and_starts_over_at_the_window_start() -> None:
    planned = plan(state(sweep_us=UPPER - 6 * S))
    assert planned.sweep_to_us == planned.scan_from_us == UPPER - 5 * S
    assert planned.next_sweep_us == WINDOW_START


def test_a_period_of_zero_rechecks_the_whole_settled_window_every_time() -> None:
    planned = plan(state(sweep_us=WINDOW_START), recheck_period_ms=0)
    assert (planned.sweep_from_us, planned.sweep_to_us) == (WINDOW_START, planned.scan_from_us)
    assert planned.next_sweep_us == WINDOW_START


def test_every_settled_instant_is_checked_again_within_a_period_and_one_interval() -> None:
    """Checked when it is new (the scan up to the horizon) and then by the sweep, so no
    second of the settled window goes longer than the period and one evaluation interval
    without a check (the bound docs/health.md states)."""
    interval, period_ms, lookback_ms = 5 * S, 600_000, 3_600_000
    clock = CLOCK
    current = concluded(plan(None, horizon(clock), lookback_ms=lookback_ms)).state
    checked_at = dict.fromkeys(
        range(clock // S - lookback_ms // 1000, current.watermark_us // S), clock
    )
    longest = 0
    while clock < CLOCK + 3 * period_ms * 1000:
        clock += interval
        planned = plan(
            current, horizon(clock), lookback_ms=lookback_ms, recheck_period_ms=period_ms
        )
        scanned = range(planned.scan_from_us // S, planned.settle_us // S)
        swept = range(planned.sweep_from_us // S, planned.sweep_to_us // S)
        for second in (*scanned, *swept):
            checked_at[second] = clock
        current = concluded(planned).state
        window = range(planned.window_start_us // S, current.watermark_us // S)
        longest = max(longest, *(clock - checked_at[second] for second in window))
    assert 0 < longest <= period_ms * 1000 + interval


# -- what the check concludes --------------------------------------------------------------
def test_missing_jobs_are_counted_and_pending_ones_are_provisional() -> None:
    checked = concluded(
        plan(None),
        job("a", at=30),
        job("b", at=20),
        job("c", pending=True, at=10),
    )
    assert checked.missing_count == 2
    assert checked.oldest_missing_updated_at_unix_ms == 20
    assert checked.state.missing == {"a", "b"}
    assert checked.state.provisional == {"c"}


def test_only_settled_jobs_are_remembered() -> None:
    checked = concluded(
        plan(None),
        job("settled"),
        job("unsettled", settled=False),
        job("pending-unsettled", settled=False, pending=True),
    )
    assert checked.missing_count == 2  # counted all the same
    assert checked.state.missing == {"settled"}
    assert checked.state.provisional == frozenset()


def test_nothing_found_counts_nothing() -> None:
    checked = concluded(plan(state()))
    assert (checked.missing_count, checked.oldest_missing_updated_at_unix_ms) == (0, None)


def test_the_watermark_moves_to_the_horizon_and_never_below_the_window_or_the_scan() -> None:
    assert concluded(plan(None)).state.watermark_us == UPPER
    held = plan(state(horizon_us=WINDOW_START - S), horizon(oldest_open_us=WINDOW_START - S))
    assert concluded(held).state.watermark_us == max(held.scan_from_us, WINDOW_START)


def test_the_next_state_carries_the_plan_s_clock_policy_and_sweep() -> None:
    planned = plan(state())
    after = concluded(planned).state
    assert (after.grace_ms, after.lookback_ms) == (GRACE_MS, LOOKBACK_MS)
    assert (after.clock_us, after.horizon_us) == (CLOCK, planned.settle_us)
    assert after.sweep_us == planned.next_sweep_us


def test_more_missing_jobs_than_the_tracker_keeps_leave_the_count_to_the_full_check() -> None:
    found = [job(f"job-{n}", settled=n > 0) for n in range(3)]  # settled or not, all count
    assert conclude(plan(None), found, max_remembered=3, max_provisional=0) is not None
    assert conclude(plan(None), found, max_remembered=2, max_provisional=3) is None


def test_more_provisional_jobs_than_the_tracker_keeps_leave_the_count_to_the_full_check() -> None:
    found = [job(f"job-{n}", pending=True, settled=n > 0) for n in range(3)]
    assert conclude(plan(None), found, max_remembered=0, max_provisional=3) is not None
    assert conclude(plan(None), found, max_remembered=3, max_provisional=2) is None


def test_the_state_never_shows_its_refs() -> None:
    text = repr(state(missing=frozenset({"secret-ref"})))
    assert "secret-ref" not in text
    assert "remembered=1" in text
