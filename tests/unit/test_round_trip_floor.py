"""bench/round_trip_floor.py's arithmetic: the round trips a relay's statement counts imply."""

from bench.round_trip_floor import floor_per_event, paced_calls

FLOOR = {"postgres_round_trip_us": 100.0, "produce_us": 300.0, "notification_us": 20.0}
FETCH = "relay: fetch (FETCH_READY)"
RECORD = "relay: acknowledgement (RECORD_PUBLISHED)"


def test_each_event_pays_its_share_of_a_fetch_a_produce_request_and_a_record() -> None:
    # two events a batch: half a fetch, half a produce request, half a record, a notification
    assert floor_per_event(FLOOR, {FETCH: 0.5, RECORD: 0.5}) == 50 + 150 + 50 + 20


def test_fetches_that_find_nothing_cost_a_round_trip_but_send_no_more_than_one_request() -> None:
    # more fetches than events: the empty ones still cost PostgreSQL round trips, but no
    # event is sent in more than one produce request
    assert floor_per_event(FLOOR, {FETCH: 1.5, RECORD: 1.0}) == 250 + 300 + 20


def test_without_statement_counts_only_the_notification_is_left() -> None:
    assert floor_per_event(FLOOR, {}) == 20


def test_a_paced_measurement_stays_near_its_length_but_never_below_a_hundred_calls() -> None:
    assert paced_calls(2000, 0.0025) == 2000  # 5 s at 2.5 ms
    assert paced_calls(2000, 0.01) == 500  # 5 s at 10 ms
    assert paced_calls(2000, 1.0) == 100  # a slow pace still measures enough calls
    assert paced_calls(50, 0.01) == 100
    assert paced_calls(2000, 0.0) == 2000  # back to back: every call asked for


def test_the_paced_floor_uses_the_same_statement_counts() -> None:
    paced = {**FLOOR, "produce_us": 600.0, "pace_ms": 2.5, "calls": 2000}
    assert floor_per_event(paced, {FETCH: 0.5, RECORD: 0.5}) == 50 + 300 + 50 + 20
