"""The per-key order check the fault scenarios rely on, on made-up histories. Pure."""

from __future__ import annotations

import pytest

from tests.support.order import Seen, order_violations


def _history(*versions: int) -> list[Seen]:
    """Versions as a consumer saw them; the id of version n is n (a redelivery repeats it)."""
    return [Seen(n, str(n).encode()) for n in versions]


@pytest.mark.parametrize(
    ("seen", "latest", "broken"),
    [
        ((1, 2, 3), 3, []),
        ((1, 2, 2, 3), 3, []),  # a redelivery in place is fine
        ((1, 2, 3, 3), 3, []),
        ((1, 2, 1, 2, 3), 3, []),  # a replay that ends on the latest is fine
        ((1, 2, 3, 1, 2), 3, ["last"]),  # hand-over during a slow send
        ((1, 2, 3, 2), 3, ["last"]),  # a stale copy after SIGTERM
        ((2, 3, 1), 3, ["first", "last"]),  # rejection, then redrive
        ((2, 1), 2, ["first", "last"]),
        ((1, 3), 3, ["first"]),  # one missing
        ((), 1, ["first", "last"]),
    ],
)
def test_order_violations(seen: tuple[int, ...], latest: int, broken: list[str]) -> None:
    problems = order_violations({"k": _history(*seen)}, {"k": latest})
    kinds = ["first" if "first occurrences" in p else "last" for p in problems]
    assert kinds == broken


def test_a_record_with_a_new_id_counts_as_a_new_first_occurrence() -> None:
    # The same version under another id is another event: the writer counted wrong.
    seen = [Seen(1, b"a"), Seen(1, b"b"), Seen(2, b"c")]
    assert order_violations({"k": seen}, {"k": 2})


def test_keys_are_checked_independently() -> None:
    histories = {"a": _history(1, 2), "b": _history(2, 1)}
    [problem, _] = order_violations(histories, {"a": 2, "b": 2})
    assert problem.startswith("b:")
