"""A report's values in text: an instant, a duration, a measurement's name, a reason."""

from __future__ import annotations

import datetime as dt
import re

from health.families.base import Measurement


def iso_time(unix_ms: int) -> str:
    """An instant as ISO 8601 in UTC, to the millisecond (``2026-01-02T03:04:05.678Z``)."""
    moment = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def label(m: Measurement) -> str:
    """A measurement's name in words: ``expired_lease_count`` in leases → "expired leases"."""
    if m.name.endswith("_count"):
        words = m.name.removesuffix("_count").split("_")
        if m.unit.startswith(words[-1]):
            words[-1] = m.unit
        else:
            words.append(m.unit)
        return " ".join(words)
    return m.name.replace("_", " ")


def duration(ms: int) -> str:
    """Milliseconds as people read them: 850 ms, 12.5 s, 4.2 min, 3.1 h."""
    if abs(ms) < 1000:
        return f"{ms} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def amount(value: int | None, unit: str) -> str:
    """A measurement's value in words: a duration for milliseconds, none when missing."""
    if value is None:
        return "none"
    return duration(value) if unit == "ms" else str(value)


_FIELD = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


def in_words(reason: str) -> str:
    """A reason as a sentence: field names as words, ``>`` as "exceeds"."""

    def words(match: re.Match[str]) -> str:
        name = match.group(0)
        for suffix in ("_unix_ms", "_ms", "_count"):
            name = name.removesuffix(suffix)
        return name.replace("_", " ")

    return _FIELD.sub(words, reason).replace(" > ", " exceeds ")
