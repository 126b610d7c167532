"""Structured logs: one JSON object per line on stderr (or plain text for people)."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final

import msgspec

from contracts.unexpected import unexpected_fields

try:
    from opentelemetry import trace
except ImportError:  # the API is not installed: no span is ever current
    trace = None  # type: ignore[assignment]

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message"}
_encoder = msgspec.json.Encoder()

KAFKA_CLIENT_LOGGER: Final = "aiokafka"
# Lines aiokafka repeats for every attempt, at warning or error, while the relay says the
# same once per change with a classified cause: a broker it cannot reach or a metadata
# request that failed, a produce request it retries by itself, and a topic missing or
# denied, which it names in every metadata answer (the relay's topic look-ups ask again
# every few seconds). Matched on the format string, whatever the arguments.
KAFKA_RECONNECT_NOISE: Final = frozenset(
    {
        'Unable connect to "%s:%s": %s',
        'Unable to request metadata from "%s:%s": %s',
        "Unable to request metadata from node with id %s: %r",
        "Unable to update metadata from %s",
        "Unable connect to node with id %s: %s",
        "Cannot send %r to %s: %r",
        "Got error produce response on topic-partition %s, retrying. Error: %s",
        "Topic %s not found in cluster metadata",
        "Topic %s is not authorized for this client",
        "Topic %s is not available during auto-create initialization",
    }
)


def _exception_fields(record: logging.LogRecord, tracebacks: bool) -> dict[str, str]:
    if record.exc_info and record.exc_info[1] is not None:
        # Type and place only: an exception's text can echo connection details.
        return unexpected_fields(record.exc_info[1], with_traceback=tracebacks)
    return {}


def _trace_fields() -> dict[str, str]:
    """The current span's trace and span ids, as the W3C trace context writes them (lower-case
    hex); nothing when no span is current."""
    if trace is None:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


class JsonFormatter(logging.Formatter):
    """Message, level, logger, the current span's ``trace_id`` and ``span_id`` (when a span is
    current) and every ``extra`` field; an exception by its type and where it was raised,
    its whole traceback (without messages) when ``tracebacks`` is on."""

    def __init__(self, *, tracebacks: bool = False) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_trace_fields(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        entry.update(_exception_fields(record, self.tracebacks))
        return _encoder.encode(entry).decode()


class TextFormatter(logging.Formatter):
    """``level logger: message key=value …`` for a terminal; a traceback on the lines after."""

    def __init__(self, *, tracebacks: bool = False) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")
        }
        fields.update(_trace_fields())
        fields.update(_exception_fields(record, self.tracebacks))
        trace = fields.pop("traceback", None)
        extras = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        line = f"{line} {extras}" if extras else line
        return f"{line}\n{trace}" if trace else line


class _WithoutReconnectNoise(logging.Filter):
    """Drops the Kafka client's per-attempt reconnect lines (a handler filter: a logger's
    own filter would not see its children's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.name.startswith(KAFKA_CLIENT_LOGGER) and record.msg in KAFKA_RECONNECT_NOISE
        )


class _AsyncioWithoutReprs(logging.Filter):
    """asyncio reports an exception nobody retrieved with the repr of its task or callback,
    which holds the exception's text: only the words before the first repr are kept (the
    exception itself is shown by type and place, as everywhere)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncio" and record.exc_info:
            first_line = record.getMessage().partition("\n")[0]
            record.msg = first_line.split("(", 1)[0].split("<", 1)[0].rstrip(" :")
            record.args = None
        return True


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route the standard library's logging (ours and the drivers') through one handler."""
    root = logging.getLogger()
    root.setLevel(level.upper())  # first: logging's "Unknown level" leaves the rest as it was
    debug = root.level <= logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    handler.setFormatter(formatter(tracebacks=debug))
    handler.addFilter(_AsyncioWithoutReprs())
    if not debug:
        handler.addFilter(_WithoutReconnectNoise())
    root.handlers[:] = [handler]
    # The Kafka client's warnings and errors are logged (a crash of its sender task among
    # them), never its debug lines, not even at debug level: they print every request it
    # sends, and a PLAIN SaslAuthenticate request carries the password in the clear, a
    # Produce request the records' keys and values.
    kafka_client = logging.getLogger(KAFKA_CLIENT_LOGGER)
    kafka_client.setLevel(logging.INFO if debug else max(root.level, logging.WARNING))
