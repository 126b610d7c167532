"""The final audit (pure): the writers' ledger and the scoring jobs' end states held against
every record a consumer read from Kafka.

- lost: a committed event id that no record carries;
- order: per key, first occurrences (by id) in commit order and the last record the latest
  event (the fault tests' own rule, :func:`tests.support.order.order_violations`);
- jobs: every terminal job has exactly one event id on its topic, and no other job has one;
- duplicates: records whose id was read before, each attributed to the latest-begun fault
  whose window (stretched by the relay's lease and the recovery allowance) holds its
  produce time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tests.soak.schedule import RECOVERY_S, Fault
from tests.support.order import Seen, order_violations


@dataclass(frozen=True)
class Committed:
    """One ledger line: an event the writer saw commit, with its key's counter."""

    id: str
    key: str
    n: int
    topic: str


@dataclass(frozen=True)
class Record:
    """One record as the consumer read it (``n`` is None for scoring events)."""

    topic: str
    partition: int
    offset: int
    key: str
    id: str
    n: int | None
    timestamp_ms: int  # the producer's create time


@dataclass
class AuditResult:
    events: int
    records: int
    lost: list[str]
    order_violations: list[str]
    duplicates: int
    duplicates_by_fault: Counter[str] = field(default_factory=Counter)
    unexplained_duplicates: int = 0
    terminal_jobs: int = 0
    job_problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not (self.lost or self.order_violations or self.job_problems)


def audit(
    ledger: Sequence[Committed],
    records: Iterable[Record],
    *,
    job_topic: str,
    terminal_jobs: set[str],
    faults: Sequence[Fault] = (),
    run_started_ms: int = 0,
    explain_slack_s: float = 10.0,
) -> AuditResult:
    """Everything the ledger and the job table promise, checked against what Kafka holds."""
    ordered = sorted(records, key=lambda r: (r.topic, r.partition, r.offset))
    seen_ids: set[str] = set()
    duplicates: list[Record] = []
    histories: dict[str, list[Seen]] = {}
    job_ids: dict[str, set[str]] = {}
    for record in ordered:
        if record.id in seen_ids:
            duplicates.append(record)
        seen_ids.add(record.id)
        if record.topic == job_topic:
            job_ids.setdefault(record.key, set()).add(record.id)
        elif record.n is not None:
            histories.setdefault(record.key, []).append(Seen(record.n, record.id.encode()))

    latest: dict[str, int] = {}
    for entry in ledger:
        latest[entry.key] = max(latest.get(entry.key, 0), entry.n)
    lost = [entry.id for entry in ledger if entry.id not in seen_ids]

    job_problems = []
    for job in sorted(terminal_jobs):
        count = len(job_ids.get(job, ()))
        if count != 1:
            job_problems.append(f"terminal job {job} has {count} event ids")
    job_problems += [
        f"job {job} is not terminal but has an event"
        for job in sorted(set(job_ids) - terminal_jobs)
    ]

    by_fault: Counter[str] = Counter()
    unexplained = 0
    for record in duplicates:
        at = (record.timestamp_ms - run_started_ms) / 1000
        # Windows overlap (each runs on after its fault): the latest fault to begin is the
        # one the duplicate came from, not an earlier one still in its tail.
        holding = [
            f
            for f in faults
            if f.start - explain_slack_s <= at <= f.end + RECOVERY_S + explain_slack_s
        ]
        if holding:
            by_fault[max(holding, key=lambda f: f.start).kind.value] += 1
        else:
            unexplained += 1

    return AuditResult(
        events=len(ledger),
        records=len(ordered),
        lost=lost,
        order_violations=order_violations(histories, latest),
        duplicates=len(duplicates),
        duplicates_by_fault=by_fault,
        unexplained_duplicates=unexplained,
        terminal_jobs=len(terminal_jobs),
        job_problems=job_problems,
    )
