"""Object keys of an event's data: a key the envelope cannot encode is the writer's own
error (``InvalidEnvelope`` naming where), like the same text as a value."""

from __future__ import annotations

import pytest

from contracts.envelope import EnvelopeError, canonical_json
from scoring.errors import InvalidEnvelope
from scoring.events import json_text


@pytest.mark.parametrize(
    "value",
    [
        {"\ud800": 1},
        {"ok": {"\udfff": "x"}},
        {"a": [{"k\udc80ey": None}]},
        # Two keys: the surrogate one must not reach the sort as the second either.
        {"b": 1, "\ud83d": 2},
    ],
)
def test_a_lone_surrogate_in_a_key_is_an_envelope_error(value: object) -> None:
    with pytest.raises(EnvelopeError, match="lone surrogate") as caught:
        canonical_json(value)
    # The error's own text can be printed and logged: it holds no surrogate itself.
    str(caught.value).encode("utf-8")
    caught.value.field.encode("utf-8")


def test_the_writer_refuses_such_a_payload_with_its_own_error() -> None:
    # Before anything is sent: PostgreSQL's text cannot hold it.
    with pytest.raises(InvalidEnvelope) as caught:
        json_text("payload.result", {"score": {"\ud800": 1}}, job_ref="job-1")
    assert caught.value.field == "payload.result.score"
    assert "lone surrogate" in str(caught.value)
    str(caught.value).encode("utf-8")


def test_a_surrogate_pair_as_a_key_is_fine() -> None:
    # A proper astral character (one code point) is valid Unicode.
    assert canonical_json({"\U0001f600": 1}) == '{"\U0001f600":1}'.encode()
