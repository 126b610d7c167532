"""RFC 8785 canonicalisation (against the RFC's own examples), envelope validation and schema."""

from __future__ import annotations

import hashlib
import json
import math
import struct

import msgspec
import pytest

from contracts.envelope import (
    Envelope,
    EnvelopeError,
    ScoringOutcomeEvent,
    canonical_json,
    check_ref,
    data_digest,
    decode_outcome_event,
    envelope_json_schema,
    outcome_event_json_schema,
    payload_digest,
)

# RFC 8785 Appendix B: IEEE-754 bit patterns and their ECMAScript serialisation.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


@pytest.mark.parametrize(("bits", "expected"), RFC8785_NUMBERS)
def test_numbers_serialise_as_rfc8785_appendix_b(bits: str, expected: str) -> None:
    value = struct.unpack(">d", bytes.fromhex(bits))[0]
    assert canonical_json(value) == expected.encode()


@pytest.mark.parametrize("bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_nan_and_infinities_are_refused(bits: str) -> None:
    with pytest.raises(EnvelopeError, match="NaN and infinities"):
        canonical_json(struct.unpack(">d", bytes.fromhex(bits))[0])


def test_rfc8785_section_3_2_2_example() -> None:
    text = r"""{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"""
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(json.loads(text)) == expected.encode("utf-8")


def test_rfc8785_section_3_2_3_sorting_by_utf16_code_units() -> None:
    value = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    order = [key for key in json.loads(canonical_json(value))]
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+FB33 in UTF-16
    # although it comes after it by code point.
    assert order == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


def test_integers_serialise_as_doubles_and_unsafe_ones_are_refused() -> None:
    assert canonical_json([0, -1, 2**53 - 1, 1.0, -0.0]) == b"[0,-1,9007199254740991,1,0]"
    with pytest.raises(EnvelopeError, match=r"payload\[0\]: integer beyond"):
        canonical_json([2**53])


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({1: "x"}, "object keys must be strings"),
        ((1, 2), "tuple is not a JSON value"),
        ({"a": {1, 2}}, "set is not a JSON value"),
        ("\ud800", "lone surrogate"),
        (math.nan, "NaN"),
    ],
)
def test_non_json_values_are_refused_with_the_path(value: object, problem: str) -> None:
    with pytest.raises(EnvelopeError, match=problem):
        canonical_json(value)


def test_control_characters_escape_as_lowercase_unicode() -> None:
    assert canonical_json("\x00\x1f\x7f\t") == b'"\\u0000\\u001f\x7f\\t"'


def test_payload_digest_is_sha256_over_the_canonical_bytes() -> None:
    value = {"b": 1, "a": [True, None]}
    expected = hashlib.sha256(b'{"a":[true,null],"b":1}').hexdigest()
    assert payload_digest(value) == f"sha256:{expected}"
    assert payload_digest({"a": [True, None], "b": 1.0}) == payload_digest(value)


@pytest.mark.parametrize(
    "ref",
    ["", " job", "job ", "123", "1.5e3", "-1", "+1,000", "job\n", "a\x00b"],
)
def test_refs_like_the_scoring_service_checks_are_refused(ref: str) -> None:
    with pytest.raises(EnvelopeError):
        check_ref("job_ref", ref)


@pytest.mark.parametrize("ref", ["job-7f3a", "e", "E-", "r 1", "1a", "Ünïcode"])
def test_ordinary_refs_pass(ref: str) -> None:
    assert check_ref("job_ref", ref) == ref


def _envelope(**changes: object) -> Envelope:
    fields: dict[str, object] = {
        "event_ref": "0190f0c4-0000-8000-8000-000000000001",
        "event_type": "scoring.result.completed",
        "schema_version": "1",
        "source": "urn:scoring",
        "tenant_ref": "tenant-a",
        "subject_ref": "job-1",
        "occurred_at_unix_ms": 1_700_000_000_000,
        "correlation_ref": "corr-1",
        "payload_digest": "sha256:" + "0" * 64,
    }
    fields.update(changes)
    return Envelope(**fields)  # type: ignore[arg-type]


def test_a_valid_envelope_round_trips() -> None:
    envelope = _envelope(causation_ref="cause-1")
    assert msgspec.json.decode(msgspec.json.encode(envelope), type=Envelope) == envelope


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"event_ref": "not-a-uuid"}, "event_ref"),
        ({"event_ref": "0190F0C4-0000-8000-8000-000000000001"}, "event_ref"),
        ({"event_type": "x" * 129}, "event_type"),
        ({"event_type": "é" * 65}, "event_type"),  # 130 bytes, 65 characters
        ({"event_type": "has space"}, "event_type"),
        ({"schema_version": "v" * 65}, "schema_version"),
        ({"schema_version": ""}, "schema_version"),
        ({"source": ""}, "source"),
        ({"tenant_ref": "42"}, "tenant_ref"),
        ({"subject_ref": " job"}, "subject_ref"),
        ({"occurred_at_unix_ms": 0}, "occurred_at_unix_ms"),
        ({"occurred_at_unix_ms": True}, "occurred_at_unix_ms"),
        ({"correlation_ref": ""}, "correlation_ref"),
        ({"causation_ref": "1e5"}, "causation_ref"),
        ({"payload_digest": "sha256:" + "A" * 64}, "payload_digest"),
        ({"payload_digest": "md5:" + "0" * 32}, "payload_digest"),
    ],
)
def test_invalid_envelopes_name_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(EnvelopeError) as caught:
        _envelope(**changes)
    assert caught.value.field == field


def test_event_type_limit_is_in_bytes_and_inclusive() -> None:
    assert _envelope(event_type="x" * 128).event_type == "x" * 128
    assert _envelope(schema_version="é" * 32).schema_version == "é" * 32


def test_decoding_validates_too() -> None:
    raw = msgspec.json.encode(_envelope()).replace(b'"tenant-a"', b'"007"')
    with pytest.raises(msgspec.ValidationError, match="tenant_ref"):
        msgspec.json.decode(raw, type=Envelope)


def test_json_schema_exports_the_contract() -> None:
    schema = envelope_json_schema()
    envelope = schema["$defs"]["Envelope"]
    assert set(envelope["required"]) == {
        "event_ref",
        "event_type",
        "schema_version",
        "source",
        "tenant_ref",
        "subject_ref",
        "occurred_at_unix_ms",
        "correlation_ref",
        "payload_digest",
    }
    props = envelope["properties"]
    assert props["payload_digest"]["pattern"] == "^sha256:[0-9a-f]{64}$"
    assert props["occurred_at_unix_ms"]["exclusiveMinimum"] == 0
    assert props["event_type"]["maxLength"] == 128
    event = outcome_event_json_schema()["$defs"]["ScoringOutcomeEvent"]
    assert set(event["required"]) == {"envelope", "data"}


def test_an_outcome_event_body_decodes_and_its_digest_verifies() -> None:
    data = {
        "outcome": "completed",
        "scoring_job_ref": "job-1",
        "result_ref": "r-1",
        "result": {"score": 0.5, "n": 3},
    }
    body = {
        "envelope": msgspec.to_builtins(_envelope(payload_digest=payload_digest(data))),
        "data": data,
    }
    raw = canonical_json(body)
    event = decode_outcome_event(raw)
    assert isinstance(event, ScoringOutcomeEvent)
    assert event.data.scoring_job_ref == "job-1"
    assert data_digest(raw) == event.envelope.payload_digest
    # jsonb spells 1e30 as a 31-digit integer; the consumer-side digest reads it as a double.
    assert data_digest(b'{"data": {"x": 1000000000000000000000000000000}}') == payload_digest(
        {"x": 1e30}
    )
