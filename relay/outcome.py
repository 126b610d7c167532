"""What became of one batch: rows the broker acknowledged, rows that failed. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
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

    members: list[int]
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
    rows: Sequence[OutboxRow],
    acknowledgements: Iterable[Acknowledgement],
    early_failures: Mapping[int, BaseException],
) -> Outcome:
    """Sort a batch's rows (indexed by the acknowledgements) into published and failed."""
    published: list[PublishedGroup] = []
    refused: list[FailedRow] = []
    for members, result in acknowledgements:
        if isinstance(result, Landed):
            group = [rows[index] for index in members]
            published.append(
                PublishedGroup(result.topic, result.partition, result.base_offset, group)
            )
        else:
            failure = classify_failure(result)
            refused.extend(FailedRow(rows[index], failure) for index in members)
    rejected = [
        FailedRow(rows[index], classify_failure(exc)) for index, exc in early_failures.items()
    ]
    return Outcome(published, refused, rejected)
