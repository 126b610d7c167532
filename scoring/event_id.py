"""The id of a scoring job's terminal event, derived only from the job and its outcome.

A retried call recomputes the same id, so it can never mint a second event. The input
is length-prefixed so that no two different (job ref, outcome) splits share bytes:
("ab", "c") and ("a", "bc") hash different layouts.
"""

from __future__ import annotations

import enum
import hashlib
import uuid
from typing import Final

# Versioned domain separator: a future layout gets a new tag, never a colliding id.
_DOMAIN: Final = b"outbox-relay/scoring-terminal-event/v1"


class OutcomeKind(enum.StrEnum):
    """The two terminal outcomes that carry an event."""

    COMPLETED = "completed"
    FAILED = "failed"


def _field(value: bytes) -> bytes:
    return len(value).to_bytes(8, "big") + value


def terminal_event_layout(job_ref: str, kind: OutcomeKind, outcome_ref: str) -> bytes:
    """The exact bytes hashed: each field as an 8-byte big-endian length, then its UTF-8."""
    parts = (_DOMAIN, job_ref.encode(), kind.value.encode(), outcome_ref.encode())
    return b"".join(_field(part) for part in parts)


def terminal_event_id(job_ref: str, kind: OutcomeKind, outcome_ref: str) -> uuid.UUID:
    """RFC 9562 UUIDv8 from SHA-256 over the layout; ``outcome_ref`` is the result ref or cause code."""
    raw = bytearray(hashlib.sha256(terminal_event_layout(job_ref, kind, outcome_ref)).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x80  # version 8
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 9562 variant
    return uuid.UUID(bytes=bytes(raw))
