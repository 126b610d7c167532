"""What the outbox's door refuses, the writer refuses first, before any write: a fenced
outcome can never fail after its transition and leave the job leased (contracts/limits.py)."""

from __future__ import annotations

import dataclasses

import asyncpg
import pytest

from contracts.limits import MAX_AGGREGATEID_BYTES, MAX_HEADER_SET_BYTES, MAX_RECORD_BYTES
from scoring.errors import InvalidArgument
from scoring.worker import ClaimedJob, claim_next_due, expire_leases
from scoring.writer import Enqueue, EventDetails
from tests.scoring.conftest import CompleteClaimed
from tests.support.scoring_jobs import COMPLETION, OUTCOMES, Outcome, events, expire_lease, job

# The scoring service's own enqueue takes any ref its CHECKs allow; this is its statement.
SCORING_SERVICE_ENQUEUE_SQL = """
INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state, max_attempts)
VALUES ($1, 'req-long', 'queued', $2)
"""


async def _claimed_by_ref(
    db: asyncpg.Connection, job_ref: str, max_attempts: int = 3
) -> ClaimedJob:
    await db.execute(SCORING_SERVICE_ENQUEUE_SQL, job_ref, max_attempts)
    claimed = await claim_next_due(db, worker_ref="worker-a", lease_ms=60_000)
    assert claimed is not None
    assert claimed.job_ref == job_ref
    return claimed


@OUTCOMES
@pytest.mark.parametrize(
    "job_ref",
    ["j" * (MAX_AGGREGATEID_BYTES + 1), "é" * (MAX_AGGREGATEID_BYTES // 2 + 1)],
    ids=["ascii", "two-byte-characters"],
)
async def test_a_job_ref_longer_than_the_key_limit_is_refused_before_any_write(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, job_ref: str
) -> None:
    # The job ref becomes the event's aggregateid, the record's key: the door refuses a key
    # over 1,024 bytes, and it would refuse it after the transition was written.
    claimed = await _claimed_by_ref(db, job_ref)
    before = await job(db, job_ref)
    with pytest.raises(InvalidArgument) as refused:
        await outcome.apply(db, job_ref=job_ref, fencing_token=claimed.fencing_token, event=details)
    assert refused.value.field == "job_ref"
    assert str(MAX_AGGREGATEID_BYTES) in str(refused.value)
    assert await job(db, job_ref) == before
    assert await events(db) == []


async def test_a_job_ref_of_exactly_the_key_limit_completes(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    job_ref = "é" * (MAX_AGGREGATEID_BYTES // 2)  # 1,024 bytes, 512 characters
    claimed = await _claimed_by_ref(db, job_ref)
    written = await COMPLETION.apply(
        db, job_ref=job_ref, fencing_token=claimed.fencing_token, event=details
    )
    assert written.enqueue is Enqueue.INSERTED
    [event] = await events(db)
    assert event["aggregateid"] == job_ref


async def test_an_expired_lease_whose_job_ref_is_over_the_key_limit_stays_leased(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    # With its budget spent the sweeper would quarantine it with an event the door refuses:
    # it is left leased (the health sidecar counts it as an expired lease) and reported.
    job_ref = "j" * (MAX_AGGREGATEID_BYTES + 1)
    await _claimed_by_ref(db, job_ref, max_attempts=1)
    await expire_lease(db, job_ref)
    before = await job(db, job_ref)
    swept = await expire_leases(db, limit=10, event=details)
    assert (swept.rescheduled, swept.quarantined, swept.conflicts) == ((), (), (job_ref,))
    assert await job(db, job_ref) == before
    assert await events(db) == []


@pytest.mark.parametrize("max_event_bytes", [MAX_RECORD_BYTES + 1, 2 * MAX_RECORD_BYTES])
async def test_max_event_bytes_above_the_record_limit_is_refused_before_any_write(
    db: asyncpg.Connection,
    details: EventDetails,
    complete_claimed: CompleteClaimed,
    max_event_bytes: int,
) -> None:
    # No broker takes a record over the producer's max.request.size: a limit above it is a
    # wrong argument, refused even for an event that would fit.
    before = await job(db)
    raised = dataclasses.replace(details, max_event_bytes=max_event_bytes)
    for payload in ({"score": 0.5}, {"blob": "x" * (MAX_RECORD_BYTES + 10)}):
        with pytest.raises(InvalidArgument) as refused:
            await complete_claimed(payload=payload, event=raised)
        assert refused.value.field == "max_event_bytes"
        assert str(MAX_RECORD_BYTES) in str(refused.value)
    assert await job(db) == before
    assert await events(db) == []


async def test_max_event_bytes_of_exactly_the_record_limit_is_taken(
    db: asyncpg.Connection, details: EventDetails, complete_claimed: CompleteClaimed
) -> None:
    written = await complete_claimed(
        payload={"score": 0.5}, event=dataclasses.replace(details, max_event_bytes=MAX_RECORD_BYTES)
    )
    assert written.enqueue is Enqueue.INSERTED


async def test_a_header_set_over_its_limit_is_refused_before_any_write(
    db: asyncpg.Connection, details: EventDetails, complete_claimed: CompleteClaimed
) -> None:
    # tenant_ref, schema_version, correlation_ref and causation_ref each become a record
    # header; the door refuses a row whose header set is over 64 KiB.
    before = await job(db)
    long_tenant = "t" * MAX_HEADER_SET_BYTES
    with pytest.raises(InvalidArgument) as refused:
        await complete_claimed(event=dataclasses.replace(details, tenant_ref=long_tenant))
    assert refused.value.field == "tenant_ref"
    assert str(MAX_HEADER_SET_BYTES) in str(refused.value)
    assert await job(db) == before
    assert await events(db) == []
