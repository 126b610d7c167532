"""Every SQL query in docs/operations.md runs on the migrated schema, read-only."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
QUERIES = re.findall(r"```sql\n(.*?)```", RUNBOOK.read_text(), flags=re.DOTALL)


def test_the_runbook_has_queries() -> None:
    assert len(QUERIES) >= 10


@pytest.mark.parametrize("query", QUERIES, ids=[f"query-{n}" for n in range(len(QUERIES))])
async def test_a_runbook_query_runs_on_the_schema(db: asyncpg.Connection, query: str) -> None:
    # A leased job with an expired lease and a quarantined event, so the joins and
    # filters have something to read.
    await db.execute(
        "INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state,"
        " attempt_count, max_attempts, active_worker_ref, active_lease_ref,"
        " active_fencing_token, active_lease_expires_at_unix_ms)"
        " VALUES ('job-a', 'request-a', 'leased', 1, 3, 'worker-a', 'lease-a', 1, 1000)"
    )
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, attempts,"
        " last_error_class, quarantined_at)"
        " VALUES ('ledger', 'key-a', 't', '{}', 5, 'record_too_large', now())"
    )
    async with db.transaction(readonly=True):
        rows = await db.fetch(query)
    assert isinstance(rows, list)
