"""How relay instances split the 64 lanes, and when a held lane may take new work. Pure."""

from __future__ import annotations

import time

import pytest

from relay.lanes import LaneLeases, fair_share, lanes_to_release
from relay.sql import LANE_COUNT


def test_lane_count_matches_the_schema() -> None:
    assert LANE_COUNT == 64


@pytest.mark.parametrize(
    ("instances", "share"),
    [(0, 64), (-1, 64), (1, 64), (2, 32), (3, 22), (5, 13), (63, 2), (64, 1), (100, 1)],
)
def test_fair_share(instances: int, share: int) -> None:
    assert fair_share(64, instances) == share


@pytest.mark.parametrize("instances", range(1, 130))
def test_fair_shares_cover_every_lane(instances: int) -> None:
    share = fair_share(64, instances)
    assert share * instances >= 64  # nobody waits for a lane no one may take
    assert (share - 1) * instances < 64  # and the share is the smallest that covers them


def test_release_the_highest_lanes_beyond_the_share() -> None:
    assert lanes_to_release([5, 1, 9, 3, 7], 3) == [7, 9]
    assert lanes_to_release({40, 2, 63}, 1) == [40, 63]


def test_nothing_to_release_at_or_below_the_share() -> None:
    assert lanes_to_release([1, 2, 3], 3) == []
    assert lanes_to_release([1, 2], 5) == []
    assert lanes_to_release([], 0) == []


def test_release_everything_when_the_share_is_zero() -> None:
    assert lanes_to_release([3, 1, 2], 0) == [1, 2, 3]


def test_rebalancing_from_one_to_two_instances() -> None:
    held = list(range(64))
    release = lanes_to_release(held, fair_share(64, 2))
    assert release == list(range(32, 64))
    assert len(held) - len(release) == 32


def test_publishable_lanes_exclude_releasing_ones() -> None:
    leases = LaneLeases(fences={4: 1, 1: 7, 9: 2}, valid_until=time.monotonic() + 10, releasing={9})
    assert leases.publishable(margin_s=1.0) == [1, 4]


def test_nothing_is_publishable_when_the_lease_ends_within_the_margin() -> None:
    leases = LaneLeases(fences={1: 1, 2: 1}, valid_until=time.monotonic() + 2)
    assert leases.publishable(margin_s=0.5) == [1, 2]
    assert leases.publishable(margin_s=5.0) == []


def test_nothing_is_publishable_after_expiry_or_before_the_first_renewal() -> None:
    assert LaneLeases(fences={1: 1}, valid_until=time.monotonic() - 1).publishable(0.0) == []
    assert LaneLeases(fences={1: 1}).publishable(0.0) == []
    assert LaneLeases(valid_until=time.monotonic() + 10).publishable(0.0) == []


def test_fences_for_returns_held_lanes_and_their_fences_in_order() -> None:
    leases = LaneLeases(fences={3: 30, 1: 10, 2: 20})
    assert leases.fences_for([3, 1, 99, 3]) == ([1, 3], [10, 30])
    assert leases.fences_for([]) == ([], [])
