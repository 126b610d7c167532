"""How acknowledged partition batches are laid out as RECORD_PUBLISHED's arrays. Pure."""

from __future__ import annotations

from relay.outcome import PublishedGroup
from relay.store import PublishedArrays, published_arrays
from tests.unit.test_records import make_row


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
