"""The integration envelope of a scoring outcome event, its payload canonicalisation
(RFC 8785, JSON Canonicalization Scheme) and the JSON body a downstream consumer reads.

Everything here is pure: it validates and encodes, it never touches a database.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from typing import Annotated, Any, Final, TypeAlias

import msgspec

# A JSON value the canonicaliser accepts. Numbers are integers within ±(2**53 - 1) and
# finite floats: RFC 8785 compares numbers as IEEE-754 doubles, and a larger integer
# would reach a consumer as a different number than the writer sent.
JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None

MAX_SAFE_INTEGER: Final = 2**53 - 1
EVENT_TYPE_MAX_BYTES: Final = 128
SCHEMA_VERSION_MAX_BYTES: Final = 64
SOURCE_MAX_BYTES: Final = 1024
_DIGEST_PATTERN: Final = r"^sha256:[0-9a-f]{64}$"
_DIGEST_RE: Final = re.compile(_DIGEST_PATTERN)
# The scoring service's CHECK calls a ref numeric-looking when it is made only of these
# characters and contains a digit (PostgreSQL's `~ '^[0-9+,.eE-]+$' AND ~ '[0-9]'`).
_NUMERIC_LOOKING_RE: Final = re.compile(r"[0-9+,.eE-]+")
_DIGIT_RE: Final = re.compile(r"[0-9]")
# Control characters: PostgreSQL text cannot hold NUL, and the rest are never
# meaningful in an identifier; refusing them here gives a clear error instead of a
# driver message.
_CONTROL_RE: Final = re.compile(r"[\x00-\x1f\x7f]")
_TOKEN_RE: Final = re.compile(r"\S+")


class EnvelopeError(ValueError):
    """A value that may not go into an envelope; ``field`` names which one."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


# -- field rules -------------------------------------------------------------------------


def check_ref(field: str, value: object) -> str:
    """Refuse a ref the scoring service's CHECKs would refuse: untrimmed, empty, numeric-looking."""
    if not isinstance(value, str):
        raise EnvelopeError(field, f"must be a string, not {type(value).__name__}")
    if value == "":
        raise EnvelopeError(field, "must not be empty")
    # PostgreSQL's btrim() without a character list trims spaces only.
    if value.strip(" ") != value:
        raise EnvelopeError(field, "must not start or end with a space")
    if _CONTROL_RE.search(value):
        raise EnvelopeError(field, "must not contain control characters")
    if _NUMERIC_LOOKING_RE.fullmatch(value) and _DIGIT_RE.search(value):
        raise EnvelopeError(field, f"must not look like a number ({value!r})")
    return value


def check_token(field: str, value: object, *, max_bytes: int) -> str:
    """A non-empty identifier without whitespace or control characters, at most ``max_bytes``."""
    if not isinstance(value, str):
        raise EnvelopeError(field, f"must be a string, not {type(value).__name__}")
    if not _TOKEN_RE.fullmatch(value) or _CONTROL_RE.search(value):
        raise EnvelopeError(field, "must be non-empty, without whitespace or control characters")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise EnvelopeError(field, f"is {size} bytes, at most {max_bytes} allowed")
    return value


def check_event_ref(value: object) -> str:
    """An event ref is a UUID in its canonical lowercase, hyphenated form."""
    if not isinstance(value, str):
        raise EnvelopeError("event_ref", f"must be a string, not {type(value).__name__}")
    try:
        canonical = str(uuid.UUID(value))
    except ValueError:
        raise EnvelopeError("event_ref", "must be a UUID") from None
    if canonical != value:
        raise EnvelopeError("event_ref", "must be a lowercase hyphenated UUID")
    return value


def check_unix_ms(field: str, value: object) -> int:
    """A positive integer number of milliseconds since the Unix epoch."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnvelopeError(field, f"must be an integer, not {type(value).__name__}")
    if value <= 0:
        raise EnvelopeError(field, "must be > 0")
    return value


def check_payload_digest(value: object) -> str:
    """``sha256:`` followed by 64 lowercase hex digits."""
    if not isinstance(value, str) or not _DIGEST_RE.fullmatch(value):
        raise EnvelopeError(
            "payload_digest", "must be 'sha256:' followed by 64 lowercase hex digits"
        )
    return value


# -- RFC 8785 ----------------------------------------------------------------------------


def _format_number(value: float) -> str:
    """ECMAScript Number.prototype.toString for a finite double (RFC 8785 §3.2.2.3)."""
    if value == 0:
        return "0"  # also -0
    if value < 0:
        return "-" + _format_number(-value)
    # repr() is the shortest string that round-trips, as ECMAScript requires; only
    # the layout (where the point goes, when to use an exponent) differs.
    mantissa, _, exp_text = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # n: the position of the decimal point relative to the first significant digit.
    n = len(whole) + (int(exp_text) if exp_text else 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    exponent = n - 1
    sign = "+" if exponent >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(exponent)}"


_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def _format_string(value: str, path: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise EnvelopeError(path, "contains a lone surrogate (not valid Unicode)") from None
    out = []
    for char in value:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif char < " ":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _utf16_key(key: str) -> bytes:
    # Big-endian UTF-16 bytes compare exactly like the sequence of UTF-16 code units.
    return key.encode("utf-16-be")


def _canonical(value: object, path: str, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if abs(value) > MAX_SAFE_INTEGER:
            raise EnvelopeError(
                path,
                "integer beyond ±(2**53 - 1) loses precision in JSON consumers; send it as a string",
            )
        out.append(_format_number(float(value)))
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise EnvelopeError(path, "NaN and infinities are not JSON numbers")
        out.append(_format_number(value))
    elif isinstance(value, str):
        out.append(_format_string(value, path))
    elif isinstance(value, list):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _canonical(item, f"{path}[{index}]", out)
        out.append("]")
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise EnvelopeError(path, f"object keys must be strings, not {type(key).__name__}")
            if not key.isascii():
                # Before the sort, which encodes every key as UTF-16; the key is left out
                # of the path, which would carry the surrogate into the message.
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    raise EnvelopeError(
                        path, "an object key contains a lone surrogate (not valid Unicode)"
                    ) from None
        out.append("{")
        for index, key in enumerate(sorted(value, key=_utf16_key)):
            if index:
                out.append(",")
            out.append(_format_string(key, f"{path}.{key}"))
            out.append(":")
            _canonical(value[key], f"{path}.{key}", out)
        out.append("}")
    else:
        raise EnvelopeError(path, f"{type(value).__name__} is not a JSON value")


def canonical_json(value: object, *, field: str = "payload") -> bytes:
    """RFC 8785 canonical UTF-8 bytes of a JSON value; anything else is an :class:`EnvelopeError`."""
    out: list[str] = []
    _canonical(value, field, out)
    return "".join(out).encode("utf-8")


def payload_digest(value: object) -> str:
    """``sha256:<hex>`` over the RFC 8785 canonical form of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


# -- contracts ---------------------------------------------------------------------------

_Ref = Annotated[
    str, msgspec.Meta(min_length=1, description="Trimmed, non-empty, not numeric-looking.")
]


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The integration envelope of one event, as the scoring service defines it."""

    event_ref: Annotated[
        str, msgspec.Meta(description="The event id: a lowercase hyphenated UUID.")
    ]
    event_type: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=EVENT_TYPE_MAX_BYTES, description="At most 128 UTF-8 bytes."
        ),
    ]
    schema_version: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=SCHEMA_VERSION_MAX_BYTES, description="At most 64 UTF-8 bytes."
        ),
    ]
    source: Annotated[
        str, msgspec.Meta(min_length=1, description="Who produced the event (a URI reference).")
    ]
    tenant_ref: _Ref
    subject_ref: Annotated[str, msgspec.Meta(min_length=1, description="The scoring job ref.")]
    occurred_at_unix_ms: Annotated[
        int, msgspec.Meta(gt=0, description="When the outcome was recorded (database clock).")
    ]
    correlation_ref: _Ref
    payload_digest: Annotated[
        str,
        msgspec.Meta(
            pattern=_DIGEST_PATTERN, description="sha256 over the RFC 8785 canonical data."
        ),
    ]
    causation_ref: _Ref | None = None

    def __post_init__(self) -> None:
        # Runs on construction and on decoding, so no invalid envelope exists anywhere.
        check_event_ref(self.event_ref)
        check_token("event_type", self.event_type, max_bytes=EVENT_TYPE_MAX_BYTES)
        check_token("schema_version", self.schema_version, max_bytes=SCHEMA_VERSION_MAX_BYTES)
        check_token("source", self.source, max_bytes=SOURCE_MAX_BYTES)
        check_ref("tenant_ref", self.tenant_ref)
        check_ref("subject_ref", self.subject_ref)
        check_unix_ms("occurred_at_unix_ms", self.occurred_at_unix_ms)
        check_ref("correlation_ref", self.correlation_ref)
        if self.causation_ref is not None:
            check_ref("causation_ref", self.causation_ref)
        check_payload_digest(self.payload_digest)


class JobCompleted(msgspec.Struct, frozen=True, tag_field="outcome", tag="completed"):
    """The data of a completion event: which job, which result, and the result itself."""

    scoring_job_ref: str
    result_ref: str
    result: Any = None


class JobFailed(msgspec.Struct, frozen=True, tag_field="outcome", tag="failed"):
    """The data of a permanent-failure event: which job, why, and optional detail."""

    scoring_job_ref: str
    cause_code: str
    detail: Any = None


class ScoringOutcomeEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The outbox payload (and Kafka value) of a scoring outcome: envelope plus digested data."""

    envelope: Envelope
    data: JobCompleted | JobFailed


_event_decoder: Final = msgspec.json.Decoder(ScoringOutcomeEvent)


def decode_outcome_event(raw: bytes | str) -> ScoringOutcomeEvent:
    """Decode and validate a scoring outcome event body (the outbox payload / Kafka value)."""
    return _event_decoder.decode(raw)


def data_digest(raw: bytes | str) -> str:
    """The digest of the ``data`` member of an event body, as a consumer recomputes it.

    Numbers are read as doubles first (``json`` with ``parse_int=float``) because RFC 8785
    canonicalises numbers as IEEE-754 doubles, whatever their spelling in transit.
    """
    body = json.loads(raw, parse_int=float)
    return payload_digest(body["data"])


def envelope_json_schema() -> dict[str, Any]:
    """JSON Schema of :class:`Envelope` for downstream consumers."""
    return msgspec.json.schema(Envelope)


def outcome_event_json_schema() -> dict[str, Any]:
    """JSON Schema of :class:`ScoringOutcomeEvent`, the whole outbox payload."""
    return msgspec.json.schema(ScoringOutcomeEvent)
