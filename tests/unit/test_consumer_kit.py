"""The consumer kit: docs/asyncapi.yaml is an AsyncAPI 3 document the AsyncAPI parser reads
without a diagnostic (and a planted error is refused); its headers are exactly those the
relay writes (relay/records.py maps a row with every optional column set); its scoring
events' payload is the generated schema file, and the documented deduplication key is the
pair (ce_source, id) wherever consumers read."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from relay.records import OutboxRow, RecordMapper
from tests.support.consumer_kit import errors, headers_validator
from tests.support.node import asyncapi_diagnostics

REPO = Path(__file__).resolve().parents[2]
ASYNCAPI = REPO / "docs" / "asyncapi.yaml"
DEDUPLICATION_KEY = "(`ce_source`, `id`)"


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ASYNCAPI.read_text())
    return loaded


def test_the_asyncapi_parser_reads_the_document_without_a_diagnostic() -> None:
    assert document()["asyncapi"].startswith("3.")
    assert asyncapi_diagnostics(ASYNCAPI) == []


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (("action: send", "action: publish"), "asyncapi-document-resolved"),  # AsyncAPI 2's word
        (('$ref: "schemas/scoring-outcome-event', '$ref: "schemas/gone'), "invalid-ref"),
        (("#/components/schemas/eventHeaders", "#/components/schemas/nothing"), "invalid-ref"),
    ],
)
def test_a_planted_error_is_refused(tmp_path: Path, change: tuple[str, str], code: str) -> None:
    # A copy beside a copy of the schemas it references.
    shutil.copytree(ASYNCAPI.parent / "schemas", tmp_path / "schemas")
    planted = tmp_path / ASYNCAPI.name
    planted.write_text(ASYNCAPI.read_text().replace(*change, 1))
    errors = [d for d in asyncapi_diagnostics(planted) if d["severity"] == 0]
    assert errors
    assert {e["code"] for e in errors} == {code}


def _record_headers() -> dict[str, str]:
    row = OutboxRow(
        seq=1,
        id="0190a0b0-0000-7000-8000-000000000001",
        aggregatetype="scoring_job",
        aggregateid="job-1",
        type="scoring.result.completed",
        payload='{"a": 1}',
        tenant_ref="tenant-1",
        schema_version="1",
        correlation_ref="corr-1",
        causation_ref="cause-1",
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        headers='{"x-own": "v"}',
        topic=None,
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        lane=0,
        attempts=0,
    )
    record = RecordMapper(topic_template="outbox.event.{aggregatetype}", ce_source="urn:x")
    return {name: value.decode() for name, value in record.to_record(row).headers}


def test_the_documented_headers_are_those_the_relay_writes() -> None:
    schemas = document()["components"]["schemas"]
    written = _record_headers()
    documented = set(schemas["headers"]["properties"]) | {"content-type"}
    # All but the row's own header and tracestate (this row has none).
    assert set(written) - {"x-own"} == documented - {"tracestate"}
    # And what it wrote is valid against the document's event headers; a scoring event's
    # headers too, and not as a tombstone's (which carry no content-type).
    assert errors(headers_validator("eventHeaders"), written) == []
    assert errors(headers_validator("scoringHeaders"), written) == []
    assert errors(headers_validator("tombstoneHeaders"), written) != []
    assert errors(headers_validator("eventHeaders"), {**written, "id": "not-a-uuid"}) != []


def test_the_scoring_events_payload_is_the_generated_schema() -> None:
    payload = document()["components"]["messages"]["scoringOutcome"]["payload"]
    reference = payload["schema"]["$ref"]
    assert (ASYNCAPI.parent / reference).resolve() == REPO / "docs" / "schemas" / (
        "scoring-outcome-event.schema.json"
    )


@pytest.mark.parametrize("where", ["README.md", "docs/relay.md", "docs/asyncapi.yaml"])
def test_consumers_read_the_deduplication_key_where_they_read(where: str) -> None:
    assert DEDUPLICATION_KEY in (REPO / where).read_text()
