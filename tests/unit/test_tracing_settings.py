"""What the standard OTEL_* variables ask of `run`: nothing unless they ask for an export
(and OTEL_SDK_DISABLED wins); OTLP over HTTP where they do; an exporter or protocol the
image does not carry is refused at start with one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from contracts.errors import ConfigError
from outbox_relay.cli import build_parser
from outbox_relay.options import resolve
from outbox_relay.settings import ServiceSettings
from outbox_relay.tracing import TracingExport, tracing_export

BASE = {"DATABASE_URL": "postgresql://u@localhost/db", "KAFKA_BOOTSTRAP_SERVERS": "k:9092"}


@pytest.mark.parametrize(
    ("environ", "export"),
    [
        ({}, None),
        ({"OTEL_SERVICE_NAME": "relay", "OTEL_TRACES_SAMPLER": "always_on"}, None),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, None),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, TracingExport("http://localhost:4318")),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
            TracingExport("http://collector:4318"),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://user:token@c.example:443/v1/traces?x=y"
            },
            TracingExport("https://c.example:443"),  # no user info, path or query shown
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",  # the traces' own setting wins
            },
            TracingExport("http://collector:4318"),
        ),
    ],
)
def test_only_an_export_the_variables_ask_for_is_configured(
    environ: dict[str, str], export: TracingExport | None
) -> None:
    assert tracing_export(environ) == export


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER: only otlp"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER: only otlp"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL: only http/protobuf",
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: only http/protobuf",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "not an http"),
    ],
)
def test_what_the_image_cannot_export_is_refused(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tracing_export(environ)


def test_run_carries_the_export_in_its_settings() -> None:
    args = build_parser().parse_args(["run", "--relay-only"])
    settings = resolve(args, {**BASE, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert isinstance(settings, ServiceSettings)
    assert settings.tracing == TracingExport("http://c:4318")
    settings = resolve(args, BASE)
    assert isinstance(settings, ServiceSettings)
    assert settings.tracing is None


def test_run_refuses_an_exporter_the_image_lacks_in_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "outbox_relay", "run", "--relay-only"],
        env={**BASE, "OTEL_TRACES_EXPORTER": "jaeger", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == (
        "outbox-relay: error: OTEL_TRACES_EXPORTER: only otlp (or none) is available to run\n"
    )
