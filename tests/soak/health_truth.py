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
  within bounds.
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

    @property
    def passed(self) -> bool:
        return not self.broken


def in_fault(t: float, faults: Sequence[Fault], recovery_s: float = RECOVERY_S) -> bool:
    return any(f.start <= t <= f.end + recovery_s for f in faults)


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
    for number, fault in enumerate(faults):
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
                    f"fault {number} {fault.kind.value} at {fault.start:.0f}s: "
                    f"{expected.family} never {expected.classification} "
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
