"""The caller's trace context, when the OpenTelemetry API is installed (the ``otel``
extra): an event written inside a recording span carries that span's ``traceparent`` and
``tracestate`` unless the caller gave its own, so the relay's publish span links back to
the writer's trace. Without the API, or outside a valid span, there is none."""

from __future__ import annotations

try:
    from opentelemetry import trace
except ImportError:  # the extra is not installed: the caller gives the context or none
    trace = None  # type: ignore[assignment]


def current_trace_context() -> tuple[str, str | None] | None:
    """The current span's W3C ``traceparent`` and ``tracestate`` (None when empty), or None
    without a valid current span."""
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    state = context.trace_state.to_header() if context.trace_state else ""
    return traceparent, state or None
