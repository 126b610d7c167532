"""Tracing in the image: a process started as the image starts it (its entry point, command
and environment), given the standard OTEL_* variables, exports its publish spans with OTLP
over HTTP to a receiver on loopback; what arrived, decoded with opentelemetry-proto, names
the service, links each row's trace context and marks a failed batch, and the JSON log
line about that failure carries the failed span's ids. With OTEL_TRACES_EXPORTER=none
nothing is sent."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from contracts import __version__
from tests.deploy.conftest import REPO
from tests.deploy.pods import Pod, running
from tests.support.http import get
from tests.support.kafka import read_topic
from tests.support.otlp import OtlpReceiver, attributes, otlp_receiver
from tests.support.ports import free_port
from tests.support.waiting import wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
_INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload, traceparent, topic)
VALUES ('order', $1, 'order.placed', '{"total": 42}', $2, $3)
"""


def _image_process(
    image: dict[str, Any], database_url: str, bootstrap: str, namespace: str, **env: str
) -> Pod:
    """``docker run IMAGE`` here: the entry point and command, the image's environment, the
    settings a deployment gives it, and ``env``."""
    environment = {k: v for k, v in image["env"].items() if k != "PATH"}
    port = free_port()
    environment.update(
        PORT=str(port),
        DATABASE_URL=database_url,
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        OUTBOX_RELAY_POLICY=str(REPO / "deploy" / "base" / "policy.toml"),
        OUTBOX_RELAY_TOPIC_TEMPLATE=f"{namespace}.{{aggregatetype}}",
        OUTBOX_RELAY_ALLOWED_TOPICS=rf"{namespace}\..*",
        OUTBOX_RELAY_INSTANCE_ID="relay-otlp",
        OUTBOX_RELAY_RECEIPT_RETENTION_MS="604800000",
        **env,
    )
    entrypoint = str(Path(sys.executable).parent / image["entrypoint"][0])
    return Pod("image", [entrypoint, *image["cmd"]], environment, port)


async def _ready(pod: Pod) -> bool:
    assert pod.port is not None
    try:
        return (await get(("127.0.0.1", pod.port), "/readyz")).status == 200
    except OSError:
        return False


def _log_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            continue
    return lines


def _failed(receiver: OtlpReceiver) -> list[Span]:
    return [span for _, span in receiver.spans() if span.status.code == Status.STATUS_CODE_ERROR]


def _spans_named(receiver: OtlpReceiver, name: str) -> list[tuple[dict[str, Any], Span]]:
    return [(resource, span) for resource, span in receiver.spans() if span.name == name]


@dataclass
class TracedImage:
    """The image's process, ready, beside the receiver its OTEL_* variables name."""

    receiver: OtlpReceiver
    process: asyncio.subprocess.Process
    log: Path

    async def stop(self) -> list[dict[str, Any]]:
        """SIGTERM, as a rollout stops it; its JSON log lines, the last ones included."""
        if self.process.returncode is None:
            self.process.terminate()
            await asyncio.wait_for(self.process.wait(), 30)
        return _log_lines(self.log)


@pytest.fixture
async def traced_image(
    request: pytest.FixtureRequest,
    image: dict[str, Any],
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    tmp_path: Path,
) -> AsyncIterator[TracedImage]:
    """The image's process exporting to a receiver on loopback every 100 ms, given the
    OTEL_* variables of an indirect parameter besides; stopped at the end if still running."""
    async with otlp_receiver() as receiver:
        pod = _image_process(
            image,
            database_url,
            kafka_bootstrap,
            topic_namespace,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="100",
            **getattr(request, "param", {}),
        )
        async with running(pod, tmp_path) as process:
            await wait_until(lambda: _ready(pod), what="the process ready", timeout=60)
            yield TracedImage(receiver, process, tmp_path / f"{pod.name}.log")


@pytest.mark.timeout(300)
async def test_the_image_exports_spans_over_otlp_http_when_otel_variables_say_so(
    traced_image: TracedImage, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    receiver = traced_image.receiver
    topic = f"{topic_namespace}.order"
    conn = await asyncpg.connect(database_url)
    try:
        traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
        await conn.execute(_INSERT, "order-1", traceparent, None)
        published = await read_topic(kafka_bootstrap, topic, count=1, timeout=60)
        assert [r.key for r in published] == [b"order-1"]
        # Routed outside --allowed-topics: fails in its batch, which is a span too.
        await conn.execute(_INSERT, "order-2", None, "elsewhere.order")
    finally:
        await conn.close()
    await wait_until(
        lambda: _spans_named(receiver, f"send {topic}") and _failed(receiver),
        what="both batches' spans at the receiver",
        timeout=60,
    )
    lines = await traced_image.stop()

    assert {path for path, _, _ in receiver.requests} == {"/v1/traces"}
    assert {kind for _, kind, _ in receiver.requests} == {"application/x-protobuf"}
    ((resource, sent),) = _spans_named(receiver, f"send {topic}")
    assert resource["service.name"] == "outbox-relay"
    assert resource["service.version"] == __version__
    assert resource["service.instance.id"] == "relay-otlp"
    assert sent.kind == Span.SPAN_KIND_PRODUCER
    assert attributes(sent.attributes)["messaging.system"] == "kafka"
    assert attributes(sent.attributes)["messaging.destination.name"] == topic
    (link,) = sent.links
    assert (link.trace_id.hex(), link.span_id.hex()) == (TRACE_ID, PARENT_ID)

    # A row the relay refuses has no destination: its batch's span is named `send`.
    (failed,) = _failed(receiver)
    assert failed.name == "send"
    assert attributes(failed.attributes)["error.type"] == "topic_not_allowed"
    (said,) = [
        line
        for line in lines
        if line["msg"] == "publish failed" and "topic_not_allowed" in json.dumps(line)
    ]
    assert (said["trace_id"], said["span_id"]) == (failed.trace_id.hex(), failed.span_id.hex())
    # A line said outside any span carries no ids.
    (started,) = [line for line in lines if line["msg"] == "started"]
    assert "trace_id" not in started and "span_id" not in started
    # The image installs uvloop with the runtime lock; `run` runs on it.
    assert started["event_loop"] == "uvloop"
    (exporting,) = [line for line in lines if line["msg"] == "exporting spans with OTLP over HTTP"]
    assert exporting["endpoint"] == receiver.endpoint


@pytest.mark.parametrize("traced_image", [{"OTEL_TRACES_EXPORTER": "none"}], indirect=True)
async def test_with_the_exporter_none_nothing_is_sent(
    traced_image: TracedImage, database_url: str, kafka_bootstrap: str, topic_namespace: str
) -> None:
    topic = f"{topic_namespace}.order"
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(_INSERT, "order-1", f"00-{TRACE_ID}-{PARENT_ID}-01", None)
    finally:
        await conn.close()
    # Published, and given the schedule delay many times over to export: nothing.
    await read_topic(kafka_bootstrap, topic, count=1, timeout=60, settle=2.0)
    lines = await traced_image.stop()
    assert traced_image.receiver.requests == []
    assert not [line for line in lines if line["msg"].startswith("exporting spans")]
