"""An OTLP/HTTP receiver on loopback, as a collector would listen on 4318: every export
request to ``/v1/traces`` is answered 200 and decoded with opentelemetry-proto."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.ports import free_port


def attributes(pairs: Any) -> dict[str, Any]:
    """An OTLP attribute list as a dict (string, integer, boolean and double values)."""
    found = {}
    for pair in pairs:
        kind = pair.value.WhichOneof("value")
        found[pair.key] = getattr(pair.value, kind) if kind else None
    return found


@dataclass
class OtlpReceiver:
    """What arrived: each request's path, content type and decoded body."""

    port: int
    requests: list[tuple[str, str, ExportTraceServiceRequest]] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """Every span received, with its resource's attributes."""
        return [
            (attributes(resource_spans.resource.attributes), span)
            for _, _, request in self.requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
        ]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # the exporter keeps its connection open between exports
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines if line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                path = request_line.split(" ")[1]
                self.requests.append(
                    (
                        path,
                        headers.get("content-type", ""),
                        ExportTraceServiceRequest.FromString(body),
                    )
                )
                answer = ExportTraceServiceResponse().SerializeToString()
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                    + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """A receiver listening on a free loopback port until the block ends."""
    receiver = OtlpReceiver(free_port())
    server = await asyncio.start_server(receiver._serve, "127.0.0.1", receiver.port)
    try:
        yield receiver
    finally:
        server.close()
        await server.wait_closed()
