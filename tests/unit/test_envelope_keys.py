"""Object keys of an event's data: a key the envelope cannot encode is the writer's own
error (``InvalidEnvelope`` naming where), like the same text as a value."""

from __future__ import annotations

import pytest

from contracts.envelope import EnvelopeError, canonical_json
from scoring.errors import InvalidEnvelope
from scoring.events import EventDetails, prepare_completion_event


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
    with pytest.raises(InvalidEnvelope) as caught:
        prepare_completion_event(
            job_ref="job-1",
            result_ref="r-1",
            payload={"score": {"\ud800": 1}},
            event=EventDetails(
                source="urn:test", tenant_ref="t-1", correlation_ref="c-1", schema_version="1"
            ),
        )
    assert caught.value.field is not None
    assert caught.value.field.startswith("payload")


def test_a_surrogate_pair_as_a_key_is_fine() -> None:
    # A proper astral character (one code point) is valid Unicode.
    assert canonical_json({"\U0001f600": 1}) == '{"\U0001f600":1}'.encode()
