"""The horizon margin the completion tracker keeps below ``min(clock - grace, oldest open)``:
only what the grace does not already cover (health/families/completion_tracker.py)."""

from __future__ import annotations

import pytest

from health.families.completion_tracker import HORIZON_MARGIN_MS, horizon_margin_ms


@pytest.mark.parametrize(
    ("margin_ms", "grace_ms", "expected"),
    [
        (1000, 0, 1000),  # no grace: the whole margin
        (1000, 400, 600),  # part of it is covered by the grace
        (1000, 1000, 0),
        (1000, 30_000, 0),  # the example policy: the grace covers it all
        (0, 0, 0),
        (0, 30_000, 0),
    ],
)
def test_margin_is_what_the_grace_leaves_uncovered(
    margin_ms: int, grace_ms: int, expected: int
) -> None:
    assert horizon_margin_ms(margin_ms, grace_ms) == expected


def test_the_default_margin_is_kept_without_grace() -> None:
    assert horizon_margin_ms(HORIZON_MARGIN_MS, 0) == HORIZON_MARGIN_MS
