"""The scoring outcome writer against a real PostgreSQL: atomic completion/failure + event."""

from __future__ import annotations

import dataclasses
import json
import uuid

import asyncpg
import pytest

from contracts.envelope import JobCompleted, JobFailed, data_digest, decode_outcome_event
from scoring.errors import (
    ConflictingCompletion,
    ConflictingFailure,
    ConflictingReplay,
    EventIdMismatch,
    InvalidArgument,
    InvalidEnvelope,
    LeaseExpired,
    NotLeased,
    StaleLease,
    UnknownJob,
)
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.worker import claim_next_due, enqueue_job, expire_leases
from scoring.writer import (
    INSERT_EVENT_SQL,
    Completion,
    Enqueue,
    EventDetails,
    Failure,
    complete_job,
    fail_job_permanently,
    prepare_event,
    prepare_failure_event,
)
from tests.scoring.conftest import TRACEPARENT
from tests.scoring.support import events, expire_lease, job, leased_job, publish, receipts

RESULT = {"score": 0.73, "labels": ["a", "b"], "model": "m-3"}


async def _insert_event_row(conn: asyncpg.Connection, prepared: object, occurred: int) -> None:
    """Write an event row directly, as an earlier partial (non-atomic) writer would have."""
    from scoring.writer import AGGREGATE_TYPE, PreparedEvent

    assert isinstance(prepared, PreparedEvent)
    env = prepared.envelope
    await conn.execute(
        INSERT_EVENT_SQL,
        prepared.event_id,
        AGGREGATE_TYPE,
        prepared.job_ref,
        env.event_type,
        prepared.body(occurred),
        env.tenant_ref,
        env.schema_version,
        env.correlation_ref,
        env.causation_ref,
        prepared.traceparent,
    )


def _completion_event(
    job_ref: str, result_ref: str, result: object, details: EventDetails
) -> object:
    data = {
        "outcome": "completed",
        "scoring_job_ref": job_ref,
        "result_ref": result_ref,
        "result": result,
    }
    return prepare_event(
        job_ref=job_ref,
        kind=OutcomeKind.COMPLETED,
        outcome_ref=result_ref,
        data=data,  # type: ignore[arg-type]
        details=details,
    )


# -- completion ----------------------------------------------------------------------------


async def test_completion_and_its_event_commit_together(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    outcome = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=details,
    )
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.INSERTED)
    assert outcome.event_id == terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")

    row = await job(db)
    assert row["scoring_state"] == "completed"
    assert row["result_ref"] == "r-1"
    assert row["completed_fencing_token"] == row["attempt_count"] == claimed.fencing_token
    assert row["active_lease_ref"] is None
    assert row["active_fencing_token"] is None
    assert outcome.occurred_at_unix_ms == row["updated_at_unix_ms"]

    [event] = await events(db)
    assert event["id"] == outcome.event_id
    assert (event["aggregatetype"], event["aggregateid"], event["type"]) == (
        "scoring_job",
        "job-1",
        "scoring.result.completed",
    )
    assert (event["tenant_ref"], event["schema_version"]) == ("tenant-a", "1")
    assert (event["correlation_ref"], event["causation_ref"]) == ("corr-1", "req-1")
    assert event["traceparent"] == TRACEPARENT

    body = decode_outcome_event(event["payload"])
    assert body.envelope.event_ref == str(outcome.event_id)
    assert body.envelope.subject_ref == "job-1"
    assert body.envelope.occurred_at_unix_ms == outcome.occurred_at_unix_ms
    assert body.envelope.source == "urn:scoring-worker"
    assert body.data == JobCompleted(scoring_job_ref="job-1", result_ref="r-1", result=RESULT)
    # A consumer recomputes the digest from what PostgreSQL hands out.
    assert data_digest(event["payload"]) == body.envelope.payload_digest


async def test_an_exact_replay_is_a_duplicate_with_no_second_event(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    first = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=details,
    )
    # A retry may carry new attempt metadata (trace, correlation): still the same outcome.
    retried = dataclasses.replace(details, correlation_ref="corr-2", traceparent=None)
    again = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=retried,
    )
    assert (again.completion, again.enqueue) == (Completion.DUPLICATE, Enqueue.DUPLICATE)
    assert (again.event_id, again.occurred_at_unix_ms) == (
        first.event_id,
        first.occurred_at_unix_ms,
    )
    assert len(await events(db)) == 1


async def test_a_different_outcome_for_a_completed_job_conflicts(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    before = await job(db)
    with pytest.raises(ConflictingCompletion):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-2",
            event=details,
        )
    with pytest.raises(ConflictingCompletion):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token + 1,
            result_ref="r-1",
            event=details,
        )
    with pytest.raises(ConflictingFailure):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            cause_code="bad_input",
            event=details,
        )
    assert await job(db) == before
    assert len(await events(db)) == 1


async def test_same_result_ref_with_a_different_payload_is_a_conflicting_replay(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=details,
    )
    with pytest.raises(ConflictingReplay) as caught:
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            payload={"score": 0.1},
            event=details,
        )
    assert caught.value.event_id == terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    [event] = await events(db)
    assert decode_outcome_event(event["payload"]).data == JobCompleted("job-1", "r-1", RESULT)


async def test_a_late_outbox_conflict_rolls_the_completion_back(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    # Another writer already put different content under the id this completion derives.
    foreign = _completion_event("job-1", "r-1", {"score": 0.99}, details)
    await _insert_event_row(db, foreign, 1)
    before = await job(db)

    with pytest.raises(ConflictingReplay):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            payload=RESULT,
            event=details,
        )

    after = await job(db)
    assert after["scoring_state"] == "leased"
    assert after["active_fencing_token"] == claimed.fencing_token
    assert after["active_lease_ref"] == claimed.lease_ref
    assert after["result_ref"] is None
    assert after == before
    [event] = await events(db)
    assert decode_outcome_event(event["payload"]).data == JobCompleted(
        "job-1", "r-1", {"score": 0.99}
    )


async def test_a_late_conflict_in_the_callers_transaction_can_only_roll_back(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await _insert_event_row(db, _completion_event("job-1", "r-1", {"score": 0.99}, details), 1)
    tr = db.transaction()
    await tr.start()
    await enqueue_job(db, job_ref="job-side-effect", request_ref="req-x", max_attempts=1)
    with pytest.raises(ConflictingReplay):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            payload=RESULT,
            event=details,
        )
    # Even a caller that ignores the error cannot commit the half: COMMIT rolls back.
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        await db.fetchval("SELECT 1")
    await tr.commit()
    assert (await job(db))["scoring_state"] == "leased"
    assert (
        await db.fetchval(
            "SELECT count(*) FROM scoring_job_state WHERE scoring_job_ref = 'job-side-effect'"
        )
        == 0
    )
    assert len(await events(db)) == 1


async def test_refused_completions_enqueue_nothing(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    first = await leased_job(db)
    await expire_lease(db, "job-1")
    # Expired lease (database clock): refused although the fence is current.
    with pytest.raises(LeaseExpired) as expired:
        await complete_job(
            db, job_ref="job-1", fencing_token=first.fencing_token, result_ref="r-1", event=details
        )
    assert expired.value.expired_at_unix_ms < expired.value.now_unix_ms
    # The sweeper reschedules it and another worker claims it: the first fence is stale.
    assert (await expire_leases(db, limit=10, event=details)).rescheduled == ("job-1",)
    second = await claim_next_due(db, worker_ref="worker-b", lease_ms=60_000)
    assert second is not None
    assert second.fencing_token == first.fencing_token + 1
    with pytest.raises(StaleLease) as stale:
        await complete_job(
            db, job_ref="job-1", fencing_token=first.fencing_token, result_ref="r-1", event=details
        )
    assert (stale.value.given, stale.value.current) == (first.fencing_token, second.fencing_token)
    # Not leased at all, and no such job.
    await enqueue_job(db, job_ref="job-queued", request_ref="req-q", max_attempts=1)
    with pytest.raises(NotLeased) as not_leased:
        await complete_job(
            db, job_ref="job-queued", fencing_token=1, result_ref="r-1", event=details
        )
    assert not_leased.value.state == "queued"
    with pytest.raises(UnknownJob):
        await complete_job(db, job_ref="job-nope", fencing_token=1, result_ref="r-1", event=details)

    assert await events(db) == []
    row = await job(db)
    assert (row["scoring_state"], row["active_fencing_token"], row["result_ref"]) == (
        "leased",
        second.fencing_token,
        None,
    )


async def test_completed_without_an_outbox_row_reconciles_as_duplicate_inserted(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    # The scoring service's own, non-atomic completion: the job row only.
    await db.execute(
        """UPDATE scoring_job_state SET scoring_state = 'completed', result_ref = 'r-1',
           completed_fencing_token = attempt_count, active_worker_ref = NULL, active_lease_ref = NULL,
           active_fencing_token = NULL, active_lease_expires_at_unix_ms = NULL,
           updated_at = clock_timestamp() WHERE scoring_job_ref = 'job-1'"""
    )
    completed = await job(db)
    outcome = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=details,
    )
    assert (outcome.completion, outcome.enqueue) == (Completion.DUPLICATE, Enqueue.INSERTED)
    # The event says when the job completed, not when it was reconciled.
    assert outcome.occurred_at_unix_ms == completed["updated_at_unix_ms"]
    assert await job(db) == completed
    [event] = await events(db)
    assert event["id"] == outcome.event_id


async def test_an_outbox_row_with_the_job_still_leased_reconciles_as_completed_duplicate(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await _insert_event_row(db, _completion_event("job-1", "r-1", RESULT, details), 1)
    outcome = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload=RESULT,
        event=details,
    )
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.DUPLICATE)
    assert (await job(db))["scoring_state"] == "completed"
    assert len(await events(db)) == 1


async def test_an_already_published_event_is_not_enqueued_again(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    first = await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    await publish(db, first.event_id)
    assert await events(db) == []
    again = await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    assert (again.completion, again.enqueue) == (Completion.DUPLICATE, Enqueue.DUPLICATE)
    assert await events(db) == []
    assert [r["id"] for r in await receipts(db)] == [first.event_id]


async def test_a_receipt_with_the_job_still_leased_reconciles_as_completed_duplicate(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    prepared = _completion_event("job-1", "r-1", None, details)
    await _insert_event_row(db, prepared, 1)
    await publish(db, terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1"))
    outcome = await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.DUPLICATE)
    assert await events(db) == []


async def test_a_receipt_of_another_event_type_under_the_id_conflicts(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    event_id = terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    await db.execute(
        """INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, kafka_partition,
           kafka_offset, created_at) VALUES ($1, 'scoring_job', 'job-1', 'something.else', 't', 0, 0, now())""",
        event_id,
    )
    with pytest.raises(ConflictingReplay):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        )
    assert (await job(db))["scoring_state"] == "leased"
    assert await events(db) == []


# -- caller-owned transactions -------------------------------------------------------------


async def test_a_callers_transaction_that_rolls_back_leaves_nothing(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    before = await job(db)
    tr = db.transaction()
    await tr.start()
    outcome = await complete_job(
        db, job_ref="job-1", fencing_token=claimed.fencing_token, result_ref="r-1", event=details
    )
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.INSERTED)
    assert db.is_in_transaction()  # the writer did not commit the caller's transaction
    await tr.rollback()
    assert await job(db) == before
    assert await events(db) == []


async def test_a_callers_transaction_commits_its_own_writes_with_the_outcome(
    db: asyncpg.Connection, db2: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    async with db.transaction():
        await db.execute("CREATE TABLE score_result (ref text PRIMARY KEY)")
        await db.execute("INSERT INTO score_result VALUES ('r-1')")
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        )
        # Nothing is visible to others before the caller commits.
        assert await events(db2) == []
    assert await db2.fetchval("SELECT ref FROM score_result") == "r-1"
    assert len(await events(db2)) == 1


# -- validation before any write -----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "payload", "field"),
    [
        ({"tenant_ref": "123"}, None, "tenant_ref"),
        ({"correlation_ref": " c"}, None, "correlation_ref"),
        ({"schema_version": "x" * 65}, None, "schema_version"),
        ({"event_type": "t" * 129}, None, "event_type"),
        ({"source": ""}, None, "source"),
        ({"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}, None, "traceparent"),
        ({"traceparent": "not-a-traceparent"}, None, "traceparent"),
        ({}, {"score": float("nan")}, "payload.result.score"),
        ({}, {"big": 2**60}, "payload.result.big"),
    ],
)
async def test_an_invalid_envelope_is_refused_before_any_write(
    db: asyncpg.Connection,
    details: EventDetails,
    changes: dict[str, object],
    payload: object,
    field: str,
) -> None:
    claimed = await leased_job(db)
    before = await job(db)
    with pytest.raises(InvalidEnvelope) as caught:
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            payload=payload,  # type: ignore[arg-type]
            event=dataclasses.replace(details, **changes),  # type: ignore[arg-type]
        )
    assert caught.value.field == field
    assert await job(db) == before
    assert await events(db) == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"job_ref": "42"}, "job_ref"),
        ({"result_ref": " r"}, "result_ref"),
        ({"result_ref": "1e3"}, "result_ref"),
        ({"fencing_token": 0}, "fencing_token"),
        ({"fencing_token": True}, "fencing_token"),
    ],
)
async def test_invalid_arguments_are_refused_before_any_write(
    db: asyncpg.Connection, details: EventDetails, kwargs: dict[str, object], field: str
) -> None:
    claimed = await leased_job(db)
    call: dict[str, object] = {
        "job_ref": "job-1",
        "fencing_token": claimed.fencing_token,
        "result_ref": "r-1",
    }
    call.update(kwargs)
    with pytest.raises(InvalidArgument) as caught:
        await complete_job(db, event=details, **call)  # type: ignore[arg-type]
    assert caught.value.field == field
    assert await events(db) == []


async def test_a_caller_supplied_event_id_must_be_the_derived_one(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    with pytest.raises(EventIdMismatch):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=dataclasses.replace(details, event_id=uuid.uuid4()),
        )
    assert (await job(db))["scoring_state"] == "leased"
    derived = terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    outcome = await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        event=dataclasses.replace(details, event_id=derived),
    )
    assert outcome.event_id == derived


# -- permanent failure -----------------------------------------------------------------------


async def test_permanent_failure_and_its_event_commit_together(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    outcome = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        detail={"field": "age"},
        event=details,
    )
    assert (outcome.failure, outcome.enqueue) == (Failure.QUARANTINED, Enqueue.INSERTED)
    assert outcome.event_id == terminal_event_id("job-1", OutcomeKind.FAILED, "bad_input")
    row = await job(db)
    assert (row["scoring_state"], row["last_failure_code"], row["result_ref"]) == (
        "quarantined",
        "bad_input",
        None,
    )
    assert row["active_lease_ref"] is None
    [event] = await events(db)
    assert (event["id"], event["type"]) == (outcome.event_id, "scoring.job.failed")
    body = decode_outcome_event(event["payload"])
    assert body.data == JobFailed(
        scoring_job_ref="job-1", cause_code="bad_input", detail={"field": "age"}
    )
    assert body.envelope.occurred_at_unix_ms == row["updated_at_unix_ms"]
    assert data_digest(event["payload"]) == body.envelope.payload_digest

    again = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        detail={"field": "age"},
        event=details,
    )
    assert (again.failure, again.enqueue) == (Failure.DUPLICATE, Enqueue.DUPLICATE)
    with pytest.raises(ConflictingFailure):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            cause_code="other",
            event=details,
        )
    with pytest.raises(ConflictingCompletion):
        await complete_job(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            result_ref="r-1",
            event=details,
        )
    assert len(await events(db)) == 1


async def test_refused_failures_enqueue_nothing(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    with pytest.raises(StaleLease):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token + 1,
            cause_code="bad_input",
            event=details,
        )
    await expire_lease(db, "job-1")
    with pytest.raises(LeaseExpired):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            cause_code="bad_input",
            event=details,
        )
    await enqueue_job(db, job_ref="job-queued", request_ref="req-q", max_attempts=1)
    with pytest.raises(NotLeased):
        await fail_job_permanently(
            db, job_ref="job-queued", fencing_token=1, cause_code="bad_input", event=details
        )
    with pytest.raises(InvalidArgument):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            cause_code="has space",
            event=details,
        )
    assert await events(db) == []
    assert (await job(db))["scoring_state"] == "leased"


async def test_quarantined_without_an_outbox_row_reconciles_as_duplicate_inserted(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await db.execute(
        """UPDATE scoring_job_state SET scoring_state = 'quarantined', last_failure_code = 'bad_input',
           active_worker_ref = NULL, active_lease_ref = NULL, active_fencing_token = NULL,
           active_lease_expires_at_unix_ms = NULL, updated_at = clock_timestamp()
           WHERE scoring_job_ref = 'job-1'"""
    )
    outcome = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        event=details,
    )
    assert (outcome.failure, outcome.enqueue) == (Failure.DUPLICATE, Enqueue.INSERTED)
    assert outcome.occurred_at_unix_ms == (await job(db))["updated_at_unix_ms"]
    assert len(await events(db)) == 1


async def test_a_failure_event_with_the_job_still_leased_reconciles_as_quarantined_duplicate(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    prepared = prepare_failure_event(
        job_ref="job-1", cause_code="bad_input", detail=None, event=details
    )
    await _insert_event_row(db, prepared, 1)
    outcome = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        event=details,
    )
    assert (outcome.failure, outcome.enqueue) == (Failure.QUARANTINED, Enqueue.DUPLICATE)
    assert len(await events(db)) == 1


async def test_a_late_outbox_conflict_rolls_the_failure_back(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    foreign = prepare_failure_event(
        job_ref="job-1", cause_code="bad_input", detail={"other": True}, event=details
    )
    await _insert_event_row(db, foreign, 1)
    before = await job(db)
    with pytest.raises(ConflictingReplay):
        await fail_job_permanently(
            db,
            job_ref="job-1",
            fencing_token=claimed.fencing_token,
            cause_code="bad_input",
            event=details,
        )
    assert await job(db) == before
    assert len(await events(db)) == 1


async def test_a_published_failure_event_is_not_enqueued_again(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    first = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        event=details,
    )
    await publish(db, first.event_id)
    again = await fail_job_permanently(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        cause_code="bad_input",
        event=details,
    )
    assert (again.failure, again.enqueue) == (Failure.DUPLICATE, Enqueue.DUPLICATE)
    assert await events(db) == []


async def test_stored_payload_is_the_canonical_body(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    claimed = await leased_job(db)
    await complete_job(
        db,
        job_ref="job-1",
        fencing_token=claimed.fencing_token,
        result_ref="r-1",
        payload={"z": 1, "a": [1.5, "é", None]},
        event=details,
    )
    [event] = await events(db)
    body = json.loads(event["payload"])
    assert set(body) == {"envelope", "data"}
    assert body["data"] == {
        "outcome": "completed",
        "scoring_job_ref": "job-1",
        "result_ref": "r-1",
        "result": {"z": 1, "a": [1.5, "é", None]},
    }
