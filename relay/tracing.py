"""Publish spans (OpenTelemetry), when its API is installed (the ``otel`` extra).

One producer span per batch the relay hands to Kafka, named and attributed as the
messaging semantic conventions say (``send <topic>``, ``messaging.system = kafka``), from
the hand-over to the broker's answer, and linked to the trace context of every row that
carries one (its ``traceparent`` and ``tracestate``): the writer's trace shows where its
event was published. The row's own trace context is forwarded unchanged in the record's
headers either way (relay/records.py).

Without the API nothing here costs more than a check for ``None``; with the API but no
SDK (or a sampler that drops the span) no link is built. A span takes at most the
provider's link limit of links (``OTEL_SPAN_LINK_COUNT_LIMIT``, 128 by default): a batch
with more trace contexts is published under as many spans as the limit needs, so every
row is linked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from contracts import __version__
from relay.records import OutboxRow

try:
    from opentelemetry import trace
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
    from opentelemetry.trace.span import TraceState
except ImportError:  # the extra is not installed: no spans
    trace = None  # type: ignore[assignment]

_LINK_LIMIT_VARIABLE = "OTEL_SPAN_LINK_COUNT_LIMIT"
_DEFAULT_LINK_LIMIT = 128  # the specification's default
_VOID_VERSION = "ff"


def link_limit() -> int:
    """The most links a span keeps, as the SDK reads it from the environment."""
    try:
        return max(1, int(os.environ.get(_LINK_LIMIT_VARIABLE, _DEFAULT_LINK_LIMIT)))
    except ValueError:
        return _DEFAULT_LINK_LIMIT


def _span_context(row: OutboxRow) -> Any | None:
    """The row's trace context as a remote span context; None without a usable one."""
    if row.traceparent is None:
        return None
    version, trace_id, parent_id, flags = row.traceparent.split("-")  # the column's CHECK
    if version == _VOID_VERSION or not int(trace_id, 16) or not int(parent_id, 16):
        return None
    state = TraceState.from_header([row.tracestate]) if row.tracestate else None
    return SpanContext(
        int(trace_id, 16),
        int(parent_id, 16),
        is_remote=True,
        trace_flags=TraceFlags(int(flags, 16) & TraceFlags.SAMPLED),
        trace_state=state,
    )


@dataclass
class PublishSpans:
    """The spans of one batch, ended together once the broker answered."""

    spans: list[Any] = field(default_factory=list)

    def current(self) -> AbstractContextManager[object]:
        """The batch's first span as the current one (ended or not), so that what is logged
        about the batch carries its trace and span ids; nothing without a span."""
        if not self.spans:
            return nullcontext()
        return trace.use_span(self.spans[0], end_on_exit=False)

    def end(self, failure: str | None) -> None:
        """End every span: OK, or an error named by the failure class of its rows."""
        for span in self.spans:
            if failure is not None:
                span.set_attribute("error.type", failure)
                span.set_status(Status(StatusCode.ERROR, failure))
            span.end()


_NO_SPANS = PublishSpans()


class PublishTracing:
    """Starts the publish spans of batches (nothing when the API is not installed)."""

    def __init__(self, *, client_id: str, tracer_provider: Any = None) -> None:
        self._client_id = client_id
        # The global provider unless one is given (an application that embeds the relay).
        self._tracer = (
            None
            if trace is None
            else trace.get_tracer("outbox-relay", __version__, tracer_provider=tracer_provider)
        )

    @property
    def enabled(self) -> bool:
        """True when the OpenTelemetry API is installed."""
        return self._tracer is not None

    def start(self, rows: Sequence[OutboxRow], topics: Iterable[str]) -> PublishSpans:
        """The spans of a batch about to be handed over, going to ``topics`` (read only
        when a span records)."""
        if self._tracer is None:
            return _NO_SPANS
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.client.id": self._client_id,
            "messaging.batch.message_count": len(rows),
        }
        first = self._tracer.start_span("send", kind=SpanKind.PRODUCER, attributes=attributes)
        if not first.is_recording():
            first.end()  # a no-op span: no SDK, or not sampled
            return _NO_SPANS
        name = "send"
        destinations = set(topics)
        if len(destinations) == 1:
            (destination,) = destinations
            attributes["messaging.destination.name"] = destination
            name = f"send {destination}"
            first.set_attribute("messaging.destination.name", destination)
            first.update_name(name)
        contexts = [context for row in rows if (context := _span_context(row)) is not None]
        limit = link_limit()
        spans = [first]
        for start in range(0, len(contexts), limit):
            span = first
            if start:
                span = self._tracer.start_span(name, kind=SpanKind.PRODUCER, attributes=attributes)
                spans.append(span)
            for context in contexts[start : start + limit]:
                span.add_link(context)
        return PublishSpans(spans)
