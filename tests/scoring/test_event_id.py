"""The terminal event id: stable, derived only from job and outcome, unambiguous layout."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from scoring.event_id import OutcomeKind, terminal_event_id, terminal_event_layout


def test_the_id_is_stable_across_releases() -> None:
    # Pinned: changing the derivation would mint a second event for a replayed outcome.
    assert terminal_event_id("job-7f3a", OutcomeKind.COMPLETED, "r-1") == uuid.UUID(
        "6f78001f-93f1-823d-896f-5877aa77314a"
    )


def test_it_is_an_rfc9562_version_8_uuid() -> None:
    event_id = terminal_event_id("job-1", OutcomeKind.FAILED, "lease_expired")
    assert event_id.version == 8
    assert event_id.variant == uuid.RFC_4122


def test_outcome_kind_and_ref_each_change_the_id() -> None:
    ids = {
        terminal_event_id("job-1", OutcomeKind.COMPLETED, "x"),
        terminal_event_id("job-1", OutcomeKind.FAILED, "x"),
        terminal_event_id("job-1", OutcomeKind.COMPLETED, "y"),
        terminal_event_id("job-2", OutcomeKind.COMPLETED, "x"),
    }
    assert len(ids) == 4


def test_a_shifted_split_is_a_different_layout() -> None:
    assert terminal_event_layout("ab", OutcomeKind.COMPLETED, "c") != terminal_event_layout(
        "a", OutcomeKind.COMPLETED, "bc"
    )
    assert terminal_event_id("ab", OutcomeKind.COMPLETED, "c") != terminal_event_id(
        "a", OutcomeKind.COMPLETED, "bc"
    )


@given(
    job_a=st.text(min_size=1, max_size=12),
    ref_a=st.text(min_size=1, max_size=12),
    job_b=st.text(min_size=1, max_size=12),
    ref_b=st.text(min_size=1, max_size=12),
)
def test_different_splits_never_share_a_layout(
    job_a: str, ref_a: str, job_b: str, ref_b: str
) -> None:
    # The layout is injective, so equal ids can only come from equal inputs (or a
    # SHA-256 collision); in particular job + ref concatenating alike is not enough.
    same_input = (job_a, ref_a) == (job_b, ref_b)
    layout_a = terminal_event_layout(job_a, OutcomeKind.COMPLETED, ref_a)
    layout_b = terminal_event_layout(job_b, OutcomeKind.COMPLETED, ref_b)
    assert (layout_a == layout_b) == same_input
    assert (
        terminal_event_id(job_a, OutcomeKind.COMPLETED, ref_a)
        == terminal_event_id(job_b, OutcomeKind.COMPLETED, ref_b)
    ) == same_input


@given(
    job=st.text(min_size=1, max_size=8), ref=st.text(min_size=1, max_size=8), cut=st.integers(0, 16)
)
def test_resplitting_the_same_characters_changes_the_id(job: str, ref: str, cut: int) -> None:
    joined = job + ref
    cut = min(cut, len(joined))
    other_job, other_ref = joined[:cut], joined[cut:]
    if (other_job, other_ref) != (job, ref):
        assert terminal_event_id(job, OutcomeKind.FAILED, ref) != terminal_event_id(
            other_job, OutcomeKind.FAILED, other_ref
        )
