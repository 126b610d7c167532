"""``run``'s own OpenTelemetry SDK: configured from the standard ``OTEL_*`` variables when
they ask for spans to be exported, and only then.

The variables that ask: ``OTEL_TRACES_EXPORTER`` (``otlp``; ``none`` asks for nothing),
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``;
``OTEL_SDK_DISABLED=true`` wins over them. Everything else the SDK reads itself, as
everywhere: the exporter's headers, timeout, compression and certificates, the batch
processor's ``OTEL_BSP_*``, the sampler, the span limits, ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (which win over this product's ``service.name`` =
``outbox-relay``, ``service.version`` and ``service.instance.id``). The image carries the
SDK and the OTLP/HTTP exporter (the ``otlp`` extra); asking for another exporter or
protocol is refused at start. The SDK is imported only when it is configured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from contracts import __version__
from contracts.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

_EXPORTER: Final = "OTEL_TRACES_EXPORTER"
_ENDPOINTS: Final = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_PROTOCOLS: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
_DISABLED: Final = "OTEL_SDK_DISABLED"
_PROTOCOL: Final = "http/protobuf"  # the only one the image's exporter speaks
_DEFAULT_ENDPOINT: Final = "http://localhost:4318"  # the specification's, for http/protobuf
# At exit: what the batch processor still holds is sent within this, then dropped.
FLUSH_TIMEOUT_MS: Final = 2_000


@dataclass(frozen=True)
class TracingExport:
    """Spans are exported with OTLP over HTTP to ``endpoint`` (as the log line shows it:
    scheme, host and port only)."""

    endpoint: str


def tracing_export(environ: Mapping[str, str]) -> TracingExport | None:
    """What the ``OTEL_*`` variables ask of ``run``; None when they ask for no export.
    A :class:`ConfigError` for an exporter or protocol the image does not carry."""
    if environ.get(_DISABLED, "").strip().lower() == "true":
        return None
    exporters = [e.strip().lower() for e in environ.get(_EXPORTER, "").split(",") if e.strip()]
    endpoint = next((environ[v].strip() for v in _ENDPOINTS if environ.get(v, "").strip()), "")
    if exporters == ["none"] or (not exporters and not endpoint):
        return None
    if exporters and exporters != ["otlp"]:
        raise ConfigError(f"{_EXPORTER}: only otlp (or none) is available to run")
    for variable in _PROTOCOLS:
        protocol = environ.get(variable, "").strip()
        if protocol and protocol != _PROTOCOL:
            raise ConfigError(f"{variable}: only {_PROTOCOL} is available to run")
        if protocol:
            break
    parts = urlsplit(endpoint or _DEFAULT_ENDPOINT)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("the OTLP endpoint (OTEL_EXPORTER_OTLP_*ENDPOINT) is not an http(s) URL")
    port = f":{parts.port}" if parts.port else ""
    return TracingExport(endpoint=f"{parts.scheme}://{parts.hostname}{port}")


def start_tracing(instance_id: str) -> TracerProvider:
    """The SDK as the global tracer provider, exporting in batches with OTLP over HTTP."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import (
        SERVICE_INSTANCE_ID,
        SERVICE_NAME,
        SERVICE_VERSION,
        OTELResourceDetector,
        Resource,
    )
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ours = Resource.create(
        {
            SERVICE_NAME: "outbox-relay",
            SERVICE_VERSION: __version__,
            SERVICE_INSTANCE_ID: instance_id,
        }
    )
    # The operator's OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over ours. No
    # shutdown at exit by the SDK (it waits up to 30 s): stop_tracing bounds the wait.
    provider = TracerProvider(
        resource=ours.merge(OTELResourceDetector().detect()), shutdown_on_exit=False
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


def stop_tracing(provider: TracerProvider) -> None:
    """Send what is still batched, for at most :data:`FLUSH_TIMEOUT_MS`: a collector that
    does not answer must not hold the exit past the pod's grace period. The exporting
    thread is a daemon, so what was not sent by then is dropped with the process."""
    provider.force_flush(FLUSH_TIMEOUT_MS)
