"""Health held against the schedule (pure): what the sidecar said each second and what the
faults say it should have said.

- during a fault with expectations (schedule.EXPECTED) each expected family shows the
  expected classification with the expected reason at least once, between the fault's
  start and ``detect_s`` after its end;
- outside every fault window stretched by the recovery allowance, after the start-up
  settling time, every family is ``within_bounds`` in every sample (an unanswered
  ``/health`` counts against it);
- ``/livez`` answers 200 in every sample of a relay that was neither killed nor stopped;
- the recovery time of a fault is from its end to the first sample with every family
  within bounds, and it is at most the recovery allowance: a fault after which health
  never came back, or came back later, is broken. Only when the samples end inside a
  fault's allowance is its recovery not judged, and the verdict says so (``unjudged``);
  the soak's load runs on past every fault's allowance, so in a soak that does not happen.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.soak.schedule import EXPECTED, FAMILIES, RECOVERY_S, Fault

WITHIN = "within_bounds"


@dataclass(frozen=True)
class HealthSample:
    """One ``/health`` answer: family -> (classification, reasons); None when unanswered."""

    t: float
    families: dict[str, tuple[str, tuple[str, ...]]] | None


@dataclass(frozen=True)
class LivezSample:
    t: float
    relay: str
    ok: bool
    expected_live: bool


@dataclass
class HealthVerdict:
    broken: list[str] = field(default_factory=list)
    recovery_s: list[float | None] = field(default_factory=list)
    seen_expected: list[list[str]] = field(default_factory=list)
    off_bounds_outside: Counter[str] = field(default_factory=Counter)
    unjudged: list[str] = field(default_factory=list)  # recovery windows past the samples

    @property
    def passed(self) -> bool:
        return not self.broken


def in_fault(t: float, faults: Sequence[Fault], recovery_s: float = RECOVERY_S) -> bool:
    return any(f.start <= t <= f.end + recovery_s for f in faults)


def _judge_recovery(
    verdict: HealthVerdict,
    name: str,
    fault: Fault,
    recovered: float | None,
    sampled_until: float | None,
    recovery_s: float,
) -> None:
    """Broken when health came back later than ``recovery_s`` after the fault's end, or not
    at all while the samples reach past that; unjudged when they end before it."""
    if recovered is not None:
        if recovered > recovery_s:
            verdict.broken.append(
                f"{name}: every family within bounds again only {recovered:.1f} s after "
                f"its end (allowed {recovery_s:.0f})"
            )
        return
    if sampled_until is None or sampled_until < fault.end + recovery_s:
        reach = (
            "no samples"
            if sampled_until is None
            else (f"the samples end {sampled_until - fault.end:.1f} s after its end")
        )
        verdict.unjudged.append(
            f"{name}: recovery not judged, {reach}, inside the {recovery_s:.0f} s allowed"
        )
        return
    verdict.broken.append(
        f"{name}: never every family within bounds again after its end "
        f"(samples until {sampled_until:.0f}s, allowed {recovery_s:.0f} s)"
    )


def judge(
    samples: Sequence[HealthSample],
    livez: Sequence[LivezSample],
    faults: Sequence[Fault],
    *,
    settle_s: float = 20.0,
    detect_s: float = 10.0,
    recovery_s: float = RECOVERY_S,
) -> HealthVerdict:
    """Every expectation of the module docstring, with one line per broken one."""
    verdict = HealthVerdict()
    sampled_until = max((s.t for s in samples), default=None)
    for number, fault in enumerate(faults):
        name = f"fault {number} {fault.kind.value} at {fault.start:.0f}s"
        seen = []
        during = [s for s in samples if fault.start <= s.t <= fault.end + detect_s]
        for expected in EXPECTED.get(fault.kind, ()):
            hit = any(
                s.families is not None
                and s.families.get(expected.family, ("", ()))[0] == expected.classification
                and any(expected.reason in r for r in s.families[expected.family][1])
                for s in during
            )
            if hit:
                seen.append(f"{expected.family}={expected.classification}")
            else:
                verdict.broken.append(
                    f"{name}: {expected.family} never {expected.classification} "
                    f"with '{expected.reason}'"
                )
        verdict.seen_expected.append(seen)
        recovered = next(
            (
                s.t - fault.end
                for s in samples
                if s.t >= fault.end
                and s.families is not None
                and all(s.families.get(f, ("",))[0] == WITHIN for f in FAMILIES)
            ),
            None,
        )
        verdict.recovery_s.append(recovered)
        _judge_recovery(verdict, name, fault, recovered, sampled_until, recovery_s)

    first_outside: dict[str, str] = {}
    for s in samples:
        if s.t < settle_s or in_fault(s.t, faults, recovery_s):
            continue
        if s.families is None:
            verdict.off_bounds_outside["/health unanswered"] += 1
            first_outside.setdefault("/health unanswered", f"at {s.t:.0f}s")
            continue
        for family in FAMILIES:
            classification, reasons = s.families.get(family, ("missing", ()))
            if classification != WITHIN:
                verdict.off_bounds_outside[family] += 1
                first_outside.setdefault(
                    family, f"at {s.t:.0f}s {classification}: {'; '.join(reasons)}"
                )
    for family, count in sorted(verdict.off_bounds_outside.items()):
        verdict.broken.append(
            f"{family}: {count} samples not within bounds outside fault windows "
            f"(first {first_outside[family]})"
        )

    dead = Counter(s.relay for s in livez if s.expected_live and not s.ok)
    for relay, count in sorted(dead.items()):
        verdict.broken.append(f"/livez of live relay {relay} failed {count} times")
    return verdict
