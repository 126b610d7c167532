"""What became of one batch: rows the broker acknowledged, rows that failed. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from relay.records import OutboxRow
from relay.retry import PRODUCER_STATE, FailureClass, classify_failure


@dataclass(frozen=True, slots=True)
class Landed:
    """Where the broker put a partition batch: its records have offsets base_offset, +1, …"""

    topic: str
    partition: int
    base_offset: int


class Acknowledgement(NamedTuple):
    """The broker's answer for one partition batch: where it landed, or why not."""

    rows: list[OutboxRow]  # in the batch's order: offsets base_offset, +1, …
    result: Landed | BaseException


class PublishedGroup(NamedTuple):
    """Rows the broker acknowledged in one partition batch, at base_offset, +1, +2, …"""

    topic: str
    partition: int
    base_offset: int
    rows: list[OutboxRow]


class FailedRow(NamedTuple):
    """A row that was not published, and why."""

    row: OutboxRow
    failure: FailureClass


@dataclass(frozen=True)
class Outcome:
    """A batch sorted by the broker's answers."""

    published: list[PublishedGroup]
    # Rows the broker failed (or never answered for), in submission order.
    refused: list[FailedRow]
    # Rows that failed before they were sent (rejected, or their batch could not be sent).
    rejected: list[FailedRow]

    @property
    def failed(self) -> list[FailedRow]:
        """Every row not published: the broker's failures first, then the early ones."""
        return self.refused + self.rejected

    @property
    def published_count(self) -> int:
        """How many rows the broker acknowledged."""
        return sum(len(group.rows) for group in self.published)

    @property
    def producer_broken(self) -> bool:
        """True when the producer's sequence state no longer matches the broker's."""
        return any(failure is PRODUCER_STATE for _, failure in self.refused)


def sort_outcome(
    acknowledgements: Iterable[Acknowledgement],
    early_failures: Sequence[tuple[OutboxRow, BaseException]],
) -> Outcome:
    """Sort a batch's rows into published and failed: each partition batch by the broker's
    answer, then the rows that failed before they were sent."""
    published: list[PublishedGroup] = []
    refused: list[FailedRow] = []
    for rows, result in acknowledgements:
        if isinstance(result, Landed):
            published.append(
                PublishedGroup(result.topic, result.partition, result.base_offset, rows)
            )
        else:
            failure = classify_failure(result)
            refused.extend(FailedRow(row, failure) for row in rows)
    rejected = [FailedRow(row, classify_failure(exc)) for row, exc in early_failures]
    return Outcome(published, refused, rejected)


class Delayed(NamedTuple):
    """A failed row and how long it waits before it is tried again."""

    failed: FailedRow
    delay_ms: int


ToRecord = PublishedGroup | Delayed
"""One entry of the outcomes one statement records: rows acknowledged at consecutive
offsets, or a failed row with its retry delay."""


def rows_in(part: Sequence[ToRecord]) -> int:
    """How many rows ``part`` records."""
    return sum(len(entry.rows) if isinstance(entry, PublishedGroup) else 1 for entry in part)


def halves(part: Sequence[ToRecord]) -> tuple[list[ToRecord], list[ToRecord]]:
    """``part`` in two, for recording a refused statement's rows apart (call it with more
    than one row): by its entries, or a lone group by its rows, each half a group of
    consecutive offsets again."""
    if len(part) > 1:
        middle = len(part) // 2
        return list(part[:middle]), list(part[middle:])
    (group,) = part
    if not isinstance(group, PublishedGroup) or len(group.rows) < 2:
        raise ValueError("one row cannot be halved")
    middle = len(group.rows) // 2
    first = PublishedGroup(group.topic, group.partition, group.base_offset, group.rows[:middle])
    second = PublishedGroup(
        group.topic, group.partition, group.base_offset + middle, group.rows[middle:]
    )
    return [first], [second]
