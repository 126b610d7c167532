"""Structured logs: one JSON object per line on stderr (or plain text for people)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}
_encoder = msgspec.json.Encoder()


class JsonFormatter(logging.Formatter):
    """Message, level, logger and every ``extra`` field; exceptions by type only."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            # Type only: driver exception text can echo connection details.
            entry["exc_type"] = record.exc_info[0].__name__
        return _encoder.encode(entry).decode()


class TextFormatter(logging.Formatter):
    """``level logger: message key=value …`` for a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
        )
        line = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        return f"{line} {extras}" if extras else line


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route the standard library's logging (ours and the drivers') through one handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiokafka logs every broker reconnect attempt at error level; the relay says it
    # once with a classified cause. At debug level the driver speaks again, but never
    # below info: its debug lines print every request it sends, and a PLAIN
    # SaslAuthenticate request carries the password in the clear, a Produce request the
    # records' keys and values.
    kafka_client = logging.getLogger("aiokafka")
    kafka_client.setLevel(logging.CRITICAL if root.level > logging.DEBUG else logging.INFO)
