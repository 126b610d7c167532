"""The completion tracker's window arithmetic, without I/O: which terminal jobs one
evaluation checks, and what the tracker remembers afterwards.

health/families/completion_tracker.py reads the horizon, runs the check this plan asks for
and hands back its rows; every bound and every decision to trust the remembered state or
start over is made here, on plain values (unix microseconds of the database clock).
docs/health.md, "How the completion check scales", gives the rules;
tests/unit/test_completion_window.py has a case for each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, repr=False)
class TrackerState:
    """What the tracker carries from one evaluation to the next."""

    grace_ms: int
    lookback_ms: int
    watermark_us: int
    """Below it every terminal job has been checked."""
    horizon_us: int
    clock_us: int
    missing: frozenset[str]
    """Settled jobs found missing: re-checked by primary key on every evaluation."""
    provisional: frozenset[str]
    """Settled jobs covered only by a pending event: re-checked on every evaluation."""
    sweep_us: int
    """Where the rolling re-check goes on; below the window start means its start."""

    def __repr__(self) -> str:  # never the refs
        return (
            f"TrackerState(watermark_us={self.watermark_us}, remembered={len(self.missing)},"
            f" provisional={len(self.provisional)})"
        )


@dataclass(frozen=True)
class Horizon:
    """What the horizon statement read before the check's snapshot."""

    clock_us: int
    oldest_open_us: int | None
    """The start of the oldest other open transaction in the database, if any."""
    blind: bool
    """A transaction exists whose start the role cannot see, or a prepared one."""


@dataclass(frozen=True, repr=False)
class WindowPlan:
    """The bounds of one check: new jobs in ``[scan_from_us, upper_us)``, those below
    ``settle_us`` settled; the rolling slice ``[sweep_from_us, sweep_to_us)``; the
    remembered refs while inside ``[window_start_us, upper_us)``."""

    kept: bool
    """The remembered state was trusted; else the whole window is checked afresh."""
    grace_ms: int
    lookback_ms: int
    clock_us: int
    window_start_us: int
    scan_from_us: int
    upper_us: int
    settle_us: int
    sweep_from_us: int
    sweep_to_us: int
    next_sweep_us: int
    remembered: frozenset[str]


@dataclass(frozen=True)
class WithoutReceipt:
    """A terminal job the check found without a receipt."""

    ref: str
    settled: bool
    """Below the horizon: nothing that would change it can still commit."""
    pending: bool
    """Covered, provisionally, by an event still in the outbox."""
    updated_at_unix_ms: int


@dataclass(frozen=True, repr=False)
class Checked:
    """What one check concludes: the family's count and the state to carry on."""

    state: TrackerState
    missing_count: int
    oldest_missing_updated_at_unix_ms: int | None


def horizon_margin_ms(margin_ms: int, grace_ms: int) -> int:
    """How far below ``min(clock - grace, oldest open start)`` the horizon is kept.

    A transaction not yet shown in ``pg_stat_activity`` when the horizon is read started at
    most ``margin_ms`` before that read, so its rows have ``updated_at >= clock - margin``.
    The horizon is at most ``clock - grace`` anyway: it needs lowering only by what the
    grace leaves uncovered. With the example policy's 30 s grace that is nothing, and an
    evaluation no longer re-reads the last second of completions.
    """
    return max(0, margin_ms - grace_ms)


def sweep_step_us(
    *, lookback_ms: int, grace_ms: int, recheck_period_ms: int, elapsed_us: int
) -> int:
    """How far the rolling re-check moves for ``elapsed_us`` of database time.

    The window ``L`` long moves forward with the clock; a cursor moving at
    ``(L + P) / P`` overtakes it by ``L`` every period ``P``, so every point of the
    window is re-checked at least once per ``P`` (plus one evaluation's step).
    """
    window_us = max(0, lookback_ms - grace_ms) * 1000
    period_us = recheck_period_ms * 1000
    if period_us == 0:
        return window_us + 1  # the whole settled window, every evaluation
    return -(-max(0, elapsed_us) * (window_us + period_us) // period_us)  # ceiling


def plan_window(
    state: TrackerState | None,
    horizon: Horizon,
    *,
    grace_ms: int,
    lookback_ms: int,
    margin_ms: int,
    recheck_period_ms: int,
) -> WindowPlan | None:
    """The bounds of this evaluation's check, or None when only the full check can be
    trusted (a transaction the horizon read could not see)."""
    if horizon.blind:
        return None
    clock_us = horizon.clock_us
    upper_us = clock_us - grace_ms * 1000
    oldest_open = horizon.oldest_open_us
    settle_us = (upper_us if oldest_open is None else min(upper_us, oldest_open)) - (
        horizon_margin_ms(margin_ms, grace_ms) * 1000
    )
    lower_us = clock_us - lookback_ms * 1000
    if state is not None and (
        state.grace_ms != grace_ms
        or state.lookback_ms != lookback_ms
        or clock_us < state.clock_us
        # The horizon never moves back unless something was open that we did not see.
        or settle_us < state.horizon_us
    ):
        state = None
    if state is None:  # first run or reset: the whole window
        scan_from, remembered = lower_us, frozenset[str]()
        sweep_from = sweep_to = next_sweep = lower_us
    else:
        scan_from = max(state.watermark_us, lower_us)
        remembered = state.missing | state.provisional
        sweep_from = max(state.sweep_us, lower_us)
        step = sweep_step_us(
            lookback_ms=lookback_ms,
            grace_ms=grace_ms,
            recheck_period_ms=recheck_period_ms,
            elapsed_us=clock_us - state.clock_us,
        )
        sweep_to = min(scan_from, sweep_from + step)
        # Past the watermark: the next evaluation starts over at the window start.
        next_sweep = lower_us if sweep_to >= scan_from else sweep_to
    return WindowPlan(
        kept=state is not None,
        grace_ms=grace_ms,
        lookback_ms=lookback_ms,
        clock_us=clock_us,
        window_start_us=lower_us,
        scan_from_us=scan_from,
        upper_us=upper_us,
        settle_us=settle_us,
        sweep_from_us=sweep_from,
        sweep_to_us=sweep_to,
        next_sweep_us=next_sweep,
        remembered=remembered,
    )


def conclude(
    plan: WindowPlan,
    found: Iterable[WithoutReceipt],
    *,
    max_remembered: int,
    max_provisional: int,
) -> Checked | None:
    """The count and the state to carry on from what the check found, or None when more
    jobs are missing or provisional than the tracker keeps (the full check then counts)."""
    without_receipt = {job.ref: job for job in found}
    missing = {ref: job for ref, job in without_receipt.items() if not job.pending}
    provisional = without_receipt.keys() - missing.keys()
    if len(missing) > max_remembered or len(provisional) > max_provisional:
        return None
    state = TrackerState(
        grace_ms=plan.grace_ms,
        lookback_ms=plan.lookback_ms,
        # Below the window start nothing is ever counted again (it only moves forward).
        watermark_us=max(plan.settle_us, plan.window_start_us, plan.scan_from_us),
        horizon_us=plan.settle_us,
        clock_us=plan.clock_us,
        missing=frozenset(ref for ref, job in missing.items() if job.settled),
        # Unsettled ones are read again anyway: the next scan starts at or below them.
        provisional=frozenset(ref for ref in provisional if without_receipt[ref].settled),
        sweep_us=plan.next_sweep_us,
    )
    return Checked(
        state=state,
        missing_count=len(missing),
        oldest_missing_updated_at_unix_ms=min(
            (job.updated_at_unix_ms for job in missing.values()), default=None
        ),
    )
