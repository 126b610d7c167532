"""How acknowledged partition batches are laid out as RECORD_PUBLISHED's arrays, and how a
fetch's columns become a row. Pure."""

from __future__ import annotations

import re

from relay import sql
from relay.outcome import PublishedGroup
from relay.records import OutboxRow
from relay.store import PublishedArrays, published_arrays, seq_ranges
from tests.support.rows import make_row


def test_one_seq_per_event_and_one_entry_per_partition_batch() -> None:
    groups = [
        PublishedGroup("orders", 2, 100, [make_row(seq=11), make_row(seq=12), make_row(seq=15)]),
        PublishedGroup("orders", 0, 7, [make_row(seq=13)]),
        PublishedGroup("users", 1, 0, [make_row(seq=14), make_row(seq=16)]),
    ]
    assert published_arrays(groups) == PublishedArrays(
        seqs=[11, 12, 15, 13, 14, 16],
        topics=["orders", "orders", "users"],
        partitions=[2, 0, 1],
        base_offsets=[100, 7, 0],
        firsts=[1, 4, 5],  # 1-based positions in seqs, as SQL's WITH ORDINALITY counts
        lasts=[3, 4, 6],
    )


def test_nothing_published_is_six_empty_arrays() -> None:
    assert published_arrays([]) == PublishedArrays([], [], [], [], [], [])


def test_rows_of_one_partition_batch_recorded_one_by_one_are_one_entry_again() -> None:
    """The engine hands its outcome over row by row (so a row the database refuses can be
    recorded apart from the others); the statement joins every seq with every entry, so an
    entry per row made recording quadratic in the batch (149 ms for 1,000 rows in
    `make bench`, ten times the rest of the drain)."""
    rows = [make_row(seq=seq) for seq in range(1, 1001)]
    one_by_one = [PublishedGroup("orders", 3, 500 + i, [row]) for i, row in enumerate(rows)]
    assert published_arrays(one_by_one) == PublishedArrays(
        seqs=list(range(1, 1001)),
        topics=["orders"],
        partitions=[3],
        base_offsets=[500],
        firsts=[1],
        lasts=[1000],
    )


def test_rows_are_joined_only_where_their_offsets_run_on_in_one_partition() -> None:
    groups = [
        PublishedGroup("orders", 0, 10, [make_row(seq=1)]),
        PublishedGroup("orders", 0, 11, [make_row(seq=2)]),
        PublishedGroup("orders", 0, 13, [make_row(seq=3)]),  # a gap: a new entry
        PublishedGroup("orders", 1, 14, [make_row(seq=4)]),  # another partition
        PublishedGroup("users", 1, 15, [make_row(seq=5)]),  # another topic
    ]
    arrays = published_arrays(groups)
    assert arrays.base_offsets == [10, 13, 14, 15]
    assert (arrays.firsts, arrays.lasts) == ([1, 3, 4, 5], [2, 3, 4, 5])
    assert arrays.seqs == [1, 2, 3, 4, 5]


def test_the_fetch_names_its_columns_as_the_row_s_fields_in_their_order() -> None:
    """The store builds each row from the statement's columns by position (the hot path):
    the statement's own names for them must be the row's fields, in the same order."""
    select_list = sql.FETCH_READY.split("\nFROM (", 1)[0]
    aliases = re.findall(r" AS (\w+),?$", select_list, flags=re.MULTILINE)
    assert aliases == list(OutboxRow._fields)


def test_the_rows_in_flight_a_fetch_meets_are_named_as_runs_of_seqs() -> None:
    assert seq_ranges([]) == "{}"
    assert seq_ranges([3, 4, 5, 7, 9, 10]) == "{[3,6),[7,8),[9,11)}"
