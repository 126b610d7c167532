"""Each relay loop's allowance before /livez calls it stuck. Pure, on a fake clock."""

from __future__ import annotations

import pytest

from relay.config import RelayConfig
from relay.liveness import Liveness, allowance_s, blocking_ms


@pytest.mark.parametrize(
    ("every_ms", "blocking", "expected_s"),
    [(1_000, 0, 3.0), (200, 5_000, 5.6), (0, 2_500, 2.5)],
)
def test_allowance_is_three_rounds_plus_what_a_round_may_block_for(
    every_ms: int, blocking: int, expected_s: float
) -> None:
    assert allowance_s(every_ms, blocking_ms=blocking) == pytest.approx(expected_s)


def test_a_round_may_block_on_every_in_flight_acknowledgement_and_a_lease() -> None:
    config = RelayConfig(
        database_url=None,
        kafka_bootstrap="k:9092",
        max_in_flight_batches=4,
        send_timeout_ms=1_500,
        lease_ttl_ms=9_000,
    )
    assert blocking_ms(config) == 4 * 2 * 1_500 + 9_000
    assert Liveness.for_relay(config).blocking_ms == blocking_ms(config)


def test_a_loop_is_stale_only_after_its_own_allowance() -> None:
    now = [100.0]
    liveness = Liveness(blocking_ms=1_000, clock=lambda: now[0])
    liveness.tick("fast", 100)  # due by 101.3
    liveness.tick("slow", 1_000)  # due by 104.0
    assert liveness.stale() == []
    now[0] = 102.0
    assert liveness.stale() == ["fast"]
    liveness.tick("fast", 100)
    now[0] = 105.0
    assert liveness.stale() == ["fast", "slow"]
