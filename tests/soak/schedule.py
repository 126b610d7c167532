"""The seeded fault schedule and what health must say during and after each fault (pure).

A schedule is a list of faults, one at a time, each followed by a quiet gap at least as
long as the recovery allowance, so "within bounds again within R seconds" can be judged
fault by fault. The seed fixes the order, the targets and the gaps; a run prints it, and
the same seed and duration give the same schedule.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass


class FaultKind(enum.StrEnum):
    RELAY_KILL = "relay_kill"  # kill -9 of a relay, a new one started after the window
    RELAY_FREEZE = "relay_freeze"  # SIGSTOP for longer than its lease, then SIGCONT
    POSTGRES_RESTART = "postgres_restart"  # fast shutdown, down a while, started again
    BROKER_RESTART = "broker_restart"  # controlled shutdown, down a while, started again
    KAFKA_PATH = "kafka_path"  # the proxied relay's Kafka path stalled, then cut
    TERMINATE_BACKENDS = "terminate_backends"  # pg_terminate_backend of relay connections
    WORKER_KILL = "worker_kill"  # kill -9 of a scoring worker holding a lease


# How long each fault lasts (seconds from its start to its end, recovery not included).
# The relay's lease is 6 s (FAST_RELAY): a freeze of 10 s outlives it; a killed worker's
# lease (WORKER_LEASE_S) expires well inside its window, and the reaper waits for the end.
WORKER_LEASE_S = 4.0
WINDOW_S: dict[FaultKind, float] = {
    FaultKind.RELAY_KILL: 8.0,
    FaultKind.RELAY_FREEZE: 10.0,
    FaultKind.POSTGRES_RESTART: 6.0,
    FaultKind.BROKER_RESTART: 14.0,
    FaultKind.KAFKA_PATH: 8.0,
    FaultKind.TERMINATE_BACKENDS: 1.0,
    FaultKind.WORKER_KILL: WORKER_LEASE_S + 8.0,
}

# Within this many seconds after a fault's end every family must be within bounds again
# (and stay so until the next fault): the longest honest catch-up on this machine is a
# broker restart's backlog plus the pending-age bound (10 s) plus two evaluations.
RECOVERY_S = 25.0

# A run below this share of what its configuration asks for tested too little: at least
# half the configured events committed and scoring jobs terminal, and a /health sample for
# at least half its seconds of load. Faults and a loaded machine slow a run, never by half.
MIN_SHARE = 0.5


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: what, when (seconds from the run's start), against which process."""

    kind: FaultKind
    start: float
    window: float
    target: int  # relay or worker index where the kind has one, else 0

    @property
    def end(self) -> float:
        return self.start + self.window


@dataclass(frozen=True)
class Expectation:
    """A classification a family must show at least once during a fault (with a reason)."""

    family: str
    classification: str
    reason: str  # a substring of one of its reasons


FAMILIES = ("outbox", "scoring_jobs", "completion_outbox", "relay")

# What each fault must make the sidecar say. Faults not listed must not be invisible
# either, but what they show (a short unowned-lane blip, a backlog) depends on timing; they
# are held only to "within bounds again within RECOVERY_S".
EXPECTED: dict[FaultKind, tuple[Expectation, ...]] = {
    FaultKind.POSTGRES_RESTART: tuple(
        Expectation(family, "unknown", "database unavailable") for family in FAMILIES
    ),
    FaultKind.WORKER_KILL: (Expectation("scoring_jobs", "stalled", "expired_lease_count"),),
    FaultKind.BROKER_RESTART: (Expectation("outbox", "stalled", "oldest pending age"),),
}


def build_schedule(
    seed: int,
    duration_s: float,
    *,
    relays: int,
    workers: int,
    warmup_s: float = 15.0,
    tail_s: float = 10.0,
) -> list[Fault]:
    """Faults from ``warmup_s`` until ``duration_s - tail_s``: kinds in seeded rounds (each
    kind once per round, in a shuffled order), a gap of RECOVERY_S plus up to 5 s between."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = warmup_s
    kinds: list[FaultKind] = []
    while True:
        if not kinds:
            kinds = list(FaultKind)
            rng.shuffle(kinds)
        kind = kinds[0]
        window = WINDOW_S[kind]
        if at + window + RECOVERY_S > duration_s - tail_s:
            # Try a shorter kind of this round before giving up.
            fitting = [k for k in kinds if at + WINDOW_S[k] + RECOVERY_S <= duration_s - tail_s]
            if not fitting:
                return faults
            kind = fitting[0]
            window = WINDOW_S[kind]
        kinds.remove(kind)
        if kind in (FaultKind.RELAY_KILL, FaultKind.RELAY_FREEZE):
            # The proxied relay (index 0) has its own fault; the others take these.
            target = rng.randrange(1, relays)
        elif kind is FaultKind.WORKER_KILL:
            target = rng.randrange(workers)
        else:
            target = 0
        faults.append(Fault(kind, round(at, 1), window, target))
        at += window + RECOVERY_S + rng.uniform(0.0, 5.0)
