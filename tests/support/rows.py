"""Outbox rows as the relay reads them, built in memory for tests that need no database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from relay.records import OutboxRow

EVENT_ID = "6f1c2a9e-5d0b-4c7e-9a51-1b2c3d4e5f60"
CREATED_AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def make_row(**overrides: Any) -> OutboxRow:
    """A plain row of a scoring job's event (seq 1, lane 5, no optional column set), with
    the fields named in ``overrides`` replaced."""
    values: dict[str, Any] = {
        "seq": 1,
        "id": EVENT_ID,
        "aggregatetype": "scoring_job",
        "aggregateid": "job-7f3a",
        "type": "scoring.result.completed",
        "payload": '{"result_ref": "r-1"}',
        "tenant_ref": None,
        "schema_version": None,
        "correlation_ref": None,
        "causation_ref": None,
        "traceparent": None,
        "headers": None,
        "topic": None,
        "created_at": CREATED_AT,
        "lane": 5,
        "attempts": 0,
    }
    values.update(overrides)
    return OutboxRow(**values)
