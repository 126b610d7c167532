"""The soak's verdict on the run itself (pure): a fault that failed to apply or never
happened, a ledger or job table implausibly empty for the configured rates, health barely
sampled, or a harness task that died each fail the run, and the summary says which."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from tests.soak.audit import AuditResult
from tests.soak.health_truth import HealthSample, HealthVerdict
from tests.soak.report import markdown, summary_lines
from tests.soak.run import FaultRecord, Soak, SoakConfig, SoakResult
from tests.soak.schedule import Fault, FaultKind

CONFIG = SoakConfig(seconds=120, seed=7)  # 60 events/s, 4 jobs/s: 7200 events, 480 jobs


def _fault(start: float, kind: FaultKind = FaultKind.RELAY_KILL) -> FaultRecord:
    return FaultRecord(Fault(kind, start, 8.0, 1), started=start, ended=start + 8.0, note="ok")


def _clean(**changes: Any) -> SoakResult:
    """A run that did everything its configuration asks for."""
    result = SoakResult(
        config=CONFIG,
        commit="abc1234",
        faults=[_fault(15.0), _fault(50.0, FaultKind.WORKER_KILL)],
        audit=AuditResult(
            events=6500,
            records=6600,
            lost=[],
            order_violations=[],
            duplicates=0,
            terminal_jobs=450,
        ),
        health=HealthVerdict(recovery_s=[1.0, 2.0], seen_expected=[[], []]),
        samples=[HealthSample(float(t), None) for t in range(118)],
        publish_per_second=[],
        backlog=[],
        peak_rss_kib={},
        dead_tuples={},
        elapsed_s=140.0,
        drained=True,
        load_s=120.0,
    )
    return dataclasses.replace(result, **changes)


def test_a_run_that_did_what_it_was_configured_to_passes() -> None:
    result = _clean()
    assert result.problems == []
    assert result.passed
    lines = summary_lines(result)
    assert lines[0].startswith("soak PASSED: 120 s of load (whole run 140 s)")
    assert "run problems: 0" in lines
    assert "faults: 2 of 2 scheduled (relay_kill 1, worker_kill 1)" in lines


def test_a_fault_that_failed_to_apply_fails_the_run() -> None:
    failed = dataclasses.replace(
        _fault(50.0, FaultKind.BROKER_RESTART),
        note="fault failed: ServiceStartError: broker did not come back",
        failed=True,
    )
    result = _clean(faults=[_fault(15.0), failed])
    assert result.problems == [
        "fault 1 broker_restart failed to apply: "
        "fault failed: ServiceStartError: broker did not come back",
        "faults applied: 1 of 2 scheduled",
    ]
    assert not result.passed
    lines = summary_lines(result)
    assert lines[0].startswith("soak FAILED")
    assert "run problems: 2" in lines
    assert "  - faults applied: 1 of 2 scheduled" in lines
    # The fault's row in the report still shows what went wrong.
    assert "| fault failed: ServiceStartError: broker did not come back |" in markdown(result)


def test_a_scheduled_fault_that_never_started_fails_the_run() -> None:
    never = FaultRecord(Fault(FaultKind.KAFKA_PATH, 90.0, 8.0, 0))
    result = _clean(faults=[_fault(15.0), never])
    assert result.problems == ["faults applied: 1 of 2 scheduled"]
    assert not result.passed


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"events": 3599},
            "events committed: 3599, fewer than 3600 (0.5 x 60/s x 120 s)",
        ),
        (
            {"events": 0},
            "events committed: 0, fewer than 3600 (0.5 x 60/s x 120 s)",
        ),
        (
            {"terminal_jobs": 0},
            "terminal scoring jobs: 0, fewer than 240 (0.5 x 4/s x 120 s)",
        ),
    ],
)
def test_a_ledger_or_job_table_implausibly_empty_fails_the_run(
    changes: dict[str, Any], problem: str
) -> None:
    clean = _clean()
    result = dataclasses.replace(clean, audit=dataclasses.replace(clean.audit, **changes))
    assert result.audit.passed  # nothing lost or out of order: there was nothing to lose
    assert result.problems == [problem]
    assert not result.passed


def test_health_barely_sampled_fails_the_run() -> None:
    result = _clean(samples=[HealthSample(float(t), None) for t in range(10)])
    assert result.problems == ["/health samples: 10, fewer than 60"]
    assert not result.passed


def test_a_harness_task_that_died_fails_the_run() -> None:
    result = _clean(background_errors=["the health sampler died: KeyError: 'checks'"])
    assert result.problems == ["the health sampler died: KeyError: 'checks'"]
    assert not result.passed


def test_a_load_stretched_by_overrunning_faults_says_so() -> None:
    lines = summary_lines(_clean(load_s=131.0, elapsed_s=150.0))
    assert lines[0].startswith(
        "soak PASSED: 131 s of load (120 planned, the rest as faults overran; whole run 150 s)"
    )


def test_an_unjudged_recovery_is_said_in_the_summary() -> None:
    health = HealthVerdict(
        recovery_s=[1.0, None],
        seen_expected=[[], []],
        unjudged=["fault 1 worker_kill at 50s: recovery not judged, ..."],
    )
    lines = summary_lines(_clean(health=health))
    assert "  - fault 1 worker_kill at 50s: recovery not judged, ..." in lines


async def test_the_fault_loop_records_a_fault_that_raised_as_failed_and_goes_on() -> None:
    # Only what the fault loop reads: no services, no processes (Soak() would prepare them).
    soak = Soak.__new__(Soak)
    soak.t0 = time.monotonic()
    soak.late_s = 0.0
    soak.fault_records = [
        FaultRecord(Fault(FaultKind.RELAY_KILL, 0.0, 0.05, 1)),
        FaultRecord(Fault(FaultKind.KAFKA_PATH, 0.1, 0.05, 0)),
    ]

    async def apply(fault: Fault) -> str:
        if fault.kind is FaultKind.RELAY_KILL:
            raise RuntimeError("relay1 has no process")
        return "path stalled"

    soak._apply = apply  # type: ignore[method-assign]
    await soak._faults()
    failed, applied = soak.fault_records
    assert (failed.failed, failed.note) == (
        True,
        "fault failed: RuntimeError: relay1 has no process",
    )
    assert failed.started is not None and failed.ended is not None
    assert (applied.failed, applied.note) == (False, "path stalled")
    assert applied.started is not None
    result = _clean(faults=soak.fault_records)
    assert result.problems == [
        "fault 0 relay_kill failed to apply: fault failed: RuntimeError: relay1 has no process",
        "faults applied: 1 of 2 scheduled",
    ]
