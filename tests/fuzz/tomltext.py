"""Writing TOML text from Python values, for fuzzing what the operator's file may hold.

Only what the generators need: tables with string keys, inline tables, arrays, and the
scalar types (floats include nan and inf, which TOML spells ``nan`` and ``inf``).
"""

from __future__ import annotations

import datetime as dt
import json
import math
from typing import Any


def toml_key(key: str) -> str:
    """A key as a TOML basic string (always quoted, so any text is a key)."""
    return _basic_string(key)


def toml_value(value: Any) -> str:
    """One TOML value, inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _basic_string(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    raise TypeError(type(value).__name__)


def toml_document(document: dict[str, Any]) -> str:
    """A document of top-level keys; a dict value becomes a ``[section]``."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in document.items() if not _is_table(v)]
    for name, section in document.items():
        if _is_table(section):
            lines.append(f"[{toml_key(name)}]")
            lines.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in section.items())
    return "\n".join(lines) + "\n"


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _basic_string(text: str) -> str:
    # JSON's escapes are TOML's, except that TOML also wants DEL escaped.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")
