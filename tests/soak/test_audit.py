"""The soak's judges judged: the auditor catches a planted drop and a planted reorder, the
health check catches a missing expectation and an off-bounds sample, and the schedule is
the seed's alone."""

from __future__ import annotations

import itertools

import pytest

from tests.soak.audit import Committed, Record, audit
from tests.soak.health_truth import HealthSample, LivezSample, judge
from tests.soak.schedule import (
    FAMILIES,
    RECOVERY_S,
    WINDOW_S,
    Fault,
    FaultKind,
    build_schedule,
)

TOPIC = "soak.order"
JOBS = "soak.scoring_job"


def _history() -> tuple[list[Committed], list[Record]]:
    """Two keys, three events each, read back in commit order, plus one job's event."""
    ledger = [Committed(f"{key}-{n}", key, n, TOPIC) for key in ("a", "b") for n in (1, 2, 3)]
    records = [
        Record(TOPIC, 0 if e.key == "a" else 1, e.n, e.key, e.id, e.n, 1000 * e.n) for e in ledger
    ]
    records.append(Record(JOBS, 0, 0, "job-1", "job-1-event", None, 1000))
    return ledger, records


def test_a_clean_history_passes() -> None:
    ledger, records = _history()
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"})
    assert result.passed
    assert (result.events, result.records, result.duplicates) == (6, 7, 0)


def test_a_planted_drop_is_lost() -> None:
    ledger, records = _history()
    dropped = next(r for r in records if r.id == "a-2")
    records.remove(dropped)
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"})
    assert result.lost == ["a-2"]
    assert not result.passed
    # The hole shows in the key's order too: its first occurrences skip version 2.
    assert any(v.startswith("a:") for v in result.order_violations)


def test_a_planted_reorder_is_an_order_violation() -> None:
    ledger, records = _history()
    first = next(r for r in records if r.id == "b-1")
    second = next(r for r in records if r.id == "b-2")
    # Same partition, offsets swapped: b-2 is read before b-1.
    records[records.index(first)] = Record(**{**first.__dict__, "offset": second.offset})
    records[records.index(second)] = Record(**{**second.__dict__, "offset": first.offset})
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"})
    assert result.lost == []
    assert len(result.order_violations) == 1
    assert result.order_violations[0].startswith("b: first occurrences [2, 1, 3]")


def test_a_stale_last_record_is_an_order_violation() -> None:
    ledger, records = _history()
    # A duplicate of version 1 after version 3: a consumer keeping the last value is wrong.
    records.append(Record(TOPIC, 0, 10, "a", "a-1", 1, 5000))
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"})
    assert result.duplicates == 1
    assert result.order_violations == [
        "a: last record is version 1, latest committed is 3 (topic: [1, 2, 3, 1])"
    ]


def test_duplicates_are_attributed_to_the_fault_around_them() -> None:
    ledger, records = _history()
    kill = Fault(FaultKind.RELAY_KILL, start=100.0, window=8.0, target=1)
    records.append(Record(TOPIC, 0, 10, "a", "a-3", 3, 105_000))  # during the kill
    records.append(Record(TOPIC, 1, 10, "b", "b-3", 3, 900_000))  # long after it
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"}, faults=[kill])
    assert result.passed
    assert result.duplicates == 2
    assert result.duplicates_by_fault == {"relay_kill": 1}
    assert result.unexplained_duplicates == 1


def test_a_duplicate_is_attributed_to_the_latest_fault_whose_window_holds_it() -> None:
    """Windows overlap (each runs on after its fault by the recovery allowance): a duplicate
    made during a PostgreSQL restart belongs to it, not to an earlier fault still in its
    tail. The first match in schedule order named the broker restart before it."""
    ledger, records = _history()
    broker = Fault(FaultKind.BROKER_RESTART, start=192.0, window=21.0, target=0)
    postgres = Fault(FaultKind.POSTGRES_RESTART, start=241.0, window=6.0, target=0)
    records.append(Record(TOPIC, 0, 10, "a", "a-3", 3, 246_700))  # during the restart
    records.append(Record(TOPIC, 1, 10, "b", "b-3", 3, 200_000))  # during the broker's
    result = audit(
        ledger, records, job_topic=JOBS, terminal_jobs={"job-1"}, faults=[broker, postgres]
    )
    assert result.duplicates_by_fault == {"broker_restart": 1, "postgres_restart": 1}
    assert result.unexplained_duplicates == 0


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([], "terminal job job-1 has 0 event ids"),
        (["e1", "e2"], "terminal job job-1 has 2 event ids"),
    ],
)
def test_a_terminal_job_needs_exactly_one_event(events: list[str], problem: str) -> None:
    ledger, records = _history()
    records = [r for r in records if r.topic != JOBS]
    records += [Record(JOBS, 0, i, "job-1", e, None, 1000) for i, e in enumerate(events)]
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs={"job-1"})
    assert result.job_problems == [problem]


def test_an_event_of_a_job_that_is_not_terminal_is_a_problem() -> None:
    ledger, records = _history()
    result = audit(ledger, records, job_topic=JOBS, terminal_jobs=set())
    assert result.job_problems == ["job job-1 is not terminal but has an event"]


# -- health against the schedule ----------------------------------------------------------------
def _all(classification: str, reason: str = "") -> dict[str, tuple[str, tuple[str, ...]]]:
    return {f: (classification, (reason,) if reason else ()) for f in FAMILIES}


def test_health_that_follows_the_schedule_passes() -> None:
    restart = Fault(FaultKind.POSTGRES_RESTART, start=30.0, window=6.0, target=0)
    samples = [HealthSample(float(t), _all("within_bounds")) for t in range(0, 90)]
    samples[32] = HealthSample(32.0, _all("unknown", "database unavailable: connection refused"))
    samples[40] = HealthSample(40.0, _all("stalled", "oldest pending age 12000 ms > ..."))
    verdict = judge(samples, [], [restart])
    assert verdict.passed, verdict.broken
    assert verdict.recovery_s == [0.0]


def test_a_fault_health_did_not_show_is_broken() -> None:
    restart = Fault(FaultKind.POSTGRES_RESTART, start=30.0, window=6.0, target=0)
    samples = [HealthSample(float(t), _all("within_bounds")) for t in range(0, 90)]
    verdict = judge(samples, [], [restart])
    assert len(verdict.broken) == len(FAMILIES)
    assert "never unknown with 'database unavailable'" in verdict.broken[0]


def test_off_bounds_outside_a_fault_window_is_broken() -> None:
    end = 30.0 + WINDOW_S[FaultKind.RELAY_KILL]
    kill = Fault(FaultKind.RELAY_KILL, start=30.0, window=WINDOW_S[FaultKind.RELAY_KILL], target=1)
    samples = [HealthSample(float(t), _all("within_bounds")) for t in range(0, 120)]
    late = int(end + RECOVERY_S) + 2
    samples[late] = HealthSample(
        float(late), {**_all("within_bounds"), "relay": ("stalled", ("x",))}
    )
    samples[25] = HealthSample(25.0, None)  # /health did not answer
    verdict = judge(samples, [], [kill])
    assert verdict.broken == [
        "/health unanswered: 1 samples not within bounds outside fault windows (first at 25s)",
        f"relay: 1 samples not within bounds outside fault windows (first at {late}s stalled: x)",
    ]


def _kill_at(start: float) -> Fault:
    return Fault(FaultKind.RELAY_KILL, start=start, window=WINDOW_S[FaultKind.RELAY_KILL], target=1)


def test_a_fault_after_which_health_never_came_back_is_broken() -> None:
    kill = _kill_at(30.0)
    samples = [HealthSample(float(t), _all("within_bounds")) for t in range(0, 30)]
    samples += [HealthSample(float(t), _all("stalled", "x")) for t in range(30, 120)]
    verdict = judge(samples, [], [kill])
    assert verdict.recovery_s == [None]
    assert verdict.unjudged == []
    assert (
        "fault 0 relay_kill at 30s: never every family within bounds again after its end "
        f"(samples until 119s, allowed {RECOVERY_S:.0f} s)"
    ) in verdict.broken


def test_a_fault_after_which_health_came_back_too_late_is_broken() -> None:
    kill = _kill_at(30.0)
    late = kill.end + RECOVERY_S + 3
    samples = [
        HealthSample(
            float(t), _all("within_bounds") if t < 30 or t >= late else _all("stalled", "x")
        )
        for t in range(0, 120)
    ]
    verdict = judge(samples, [], [kill])
    assert verdict.recovery_s == [pytest.approx(RECOVERY_S + 3)]
    assert verdict.broken[0] == (
        f"fault 0 relay_kill at 30s: every family within bounds again only "
        f"{RECOVERY_S + 3:.1f} s after its end (allowed {RECOVERY_S:.0f})"
    )


def test_a_recovery_window_past_the_last_sample_is_said_unjudged_not_passed() -> None:
    kill = _kill_at(100.0)
    samples = [HealthSample(float(t), _all("within_bounds")) for t in range(0, 100)]
    samples += [HealthSample(float(t), _all("stalled", "x")) for t in range(100, 115)]
    verdict = judge(samples, [], [kill])
    assert verdict.recovery_s == [None]
    assert verdict.passed, verdict.broken
    assert verdict.unjudged == [
        "fault 0 relay_kill at 100s: recovery not judged, the samples end 6.0 s after its "
        f"end, inside the {RECOVERY_S:.0f} s allowed"
    ]


def test_livez_of_a_live_relay_must_answer() -> None:
    livez = [
        LivezSample(1.0, "relay1", ok=False, expected_live=False),  # killed: fine
        LivezSample(2.0, "relay2", ok=False, expected_live=True),
    ]
    verdict = judge([], livez, [])
    assert verdict.broken == ["/livez of live relay relay2 failed 1 times"]


def test_the_schedule_is_the_seeds() -> None:
    one = build_schedule(42, 600, relays=3, workers=3)
    assert one == build_schedule(42, 600, relays=3, workers=3)
    assert one != build_schedule(43, 600, relays=3, workers=3)
    assert {f.kind for f in one} == set(FaultKind)  # ten minutes hold every kind
    for before, after in itertools.pairwise(one):
        assert after.start >= before.end + RECOVERY_S
    assert all(f.target != 0 for f in one if f.kind is FaultKind.RELAY_KILL)
