"""The scoring outcome writer against a real PostgreSQL: atomic completion/failure + event."""

from __future__ import annotations

import dataclasses
import json
import uuid

import asyncpg
import pytest

from contracts.envelope import JobCompleted, data_digest, decode_outcome_event
from scoring.errors import (
    ConflictingReplay,
    EventIdMismatch,
    EventTooLarge,
    InvalidArgument,
    InvalidEnvelope,
    LeaseExpired,
    NotLeased,
    StaleLease,
    UnknownJob,
)
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.worker import ClaimedJob, claim_next_due, enqueue_job, expire_leases
from scoring.writer import DEFAULT_MAX_EVENT_BYTES, Completion, Enqueue, EventDetails
from tests.scoring.conftest import TRACEPARENT, CompleteClaimed
from tests.support.scoring_jobs import (
    COMPLETION,
    OUTCOMES,
    Outcome,
    events,
    expire_lease,
    insert_event_row,
    job,
    leased_job,
    other,
    publish,
    receipts,
)

RESULT = {"score": 0.73, "labels": ["a", "b"], "model": "m-3"}


# -- either outcome: completion and permanent failure ------------------------------------------
# The same scenario for both terminal outcomes; ``data`` is the completion's payload or the
# failure's detail.


@OUTCOMES
async def test_the_outcome_and_its_event_commit_together(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    written = await outcome.apply(
        db, fencing_token=claimed.fencing_token, data=RESULT, event=details
    )
    assert (outcome.result(written), written.enqueue) == (outcome.applied, Enqueue.INSERTED)
    assert written.event_id == outcome.event_id()

    row = await job(db)
    assert row["scoring_state"] == outcome.state
    assert {k: row[k] for k in outcome.settled_row(claimed.fencing_token)} == outcome.settled_row(
        claimed.fencing_token
    )
    assert row["attempt_count"] == claimed.fencing_token
    assert row["active_lease_ref"] is None
    assert row["active_fencing_token"] is None
    assert written.occurred_at_unix_ms == row["updated_at_unix_ms"]

    [event] = await events(db)
    assert event["id"] == written.event_id
    assert (event["aggregatetype"], event["aggregateid"], event["type"]) == (
        "scoring_job",
        "job-1",
        outcome.event_type,
    )
    assert (event["tenant_ref"], event["schema_version"]) == ("tenant-a", "1")
    assert (event["correlation_ref"], event["causation_ref"]) == ("corr-1", "req-1")
    assert event["traceparent"] == TRACEPARENT

    body = decode_outcome_event(event["payload"])
    assert body.envelope.event_ref == str(written.event_id)
    assert body.envelope.subject_ref == "job-1"
    assert body.envelope.occurred_at_unix_ms == written.occurred_at_unix_ms
    assert body.envelope.source == "urn:scoring-worker"
    assert body.data == outcome.data(RESULT)
    # A consumer recomputes the digest from what PostgreSQL hands out.
    assert data_digest(event["payload"]) == body.envelope.payload_digest


@OUTCOMES
async def test_an_exact_replay_is_a_duplicate_with_no_second_event(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    first = await outcome.apply(db, fencing_token=claimed.fencing_token, data=RESULT, event=details)
    # A retry may carry new attempt metadata (trace, correlation): still the same outcome.
    retried = dataclasses.replace(details, correlation_ref="corr-2", traceparent=None)
    for event in (details, retried):
        again = await outcome.apply(
            db, fencing_token=claimed.fencing_token, data=RESULT, event=event
        )
        assert (outcome.result(again), again.enqueue) == (outcome.duplicate, Enqueue.DUPLICATE)
        assert (again.event_id, again.occurred_at_unix_ms) == (
            first.event_id,
            first.occurred_at_unix_ms,
        )
    assert len(await events(db)) == 1


@OUTCOMES
async def test_a_different_outcome_for_a_finished_job_conflicts(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    await outcome.apply(db, fencing_token=claimed.fencing_token, event=details)
    before = await job(db)
    with pytest.raises(outcome.conflict):  # another result / cause
        await outcome.apply(db, fencing_token=claimed.fencing_token, ref="other-2", event=details)
    with pytest.raises(outcome.conflict):  # the same one under another fence
        await outcome.apply(db, fencing_token=claimed.fencing_token + 1, event=details)
    with pytest.raises(other(outcome).conflict):  # the other terminal outcome
        await other(outcome).apply(db, fencing_token=claimed.fencing_token, event=details)
    assert await job(db) == before
    assert len(await events(db)) == 1


@OUTCOMES
async def test_a_late_outbox_conflict_rolls_the_outcome_back(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    # Another writer already put different content under the id this outcome derives.
    other_content = await outcome.event_row(
        db, fencing_token=claimed.fencing_token, event=details, data={"score": 0.99}
    )
    await insert_event_row(db, other_content)
    before = await job(db)

    with pytest.raises(ConflictingReplay):
        await outcome.apply(db, fencing_token=claimed.fencing_token, data=RESULT, event=details)

    after = await job(db)
    assert after["scoring_state"] == "leased"
    assert after["active_fencing_token"] == claimed.fencing_token
    assert after["active_lease_ref"] == claimed.lease_ref
    assert after["result_ref"] is None
    assert after == before
    [event] = await events(db)
    assert decode_outcome_event(event["payload"]).data == outcome.data({"score": 0.99})


@OUTCOMES
async def test_refused_outcomes_enqueue_nothing(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome
) -> None:
    first = await leased_job(db)
    # A fence the lease never had is stale.
    with pytest.raises(StaleLease):
        await outcome.apply(db, fencing_token=first.fencing_token + 1, event=details)
    await expire_lease(db, "job-1")
    # Expired lease (database clock): refused although the fence is current.
    with pytest.raises(LeaseExpired) as expired:
        await outcome.apply(db, fencing_token=first.fencing_token, event=details)
    assert expired.value.expired_at_unix_ms < expired.value.now_unix_ms
    # The sweeper reschedules it and another worker claims it: the first fence is stale.
    assert (await expire_leases(db, limit=10, event=details)).rescheduled == ("job-1",)
    second = await claim_next_due(db, worker_ref="worker-b", lease_ms=60_000)
    assert second is not None
    assert second.fencing_token == first.fencing_token + 1
    with pytest.raises(StaleLease) as stale:
        await outcome.apply(db, fencing_token=first.fencing_token, event=details)
    assert (stale.value.given, stale.value.current) == (first.fencing_token, second.fencing_token)
    # Not leased at all, and no such job.
    await enqueue_job(db, job_ref="job-queued", request_ref="req-q", max_attempts=1)
    with pytest.raises(NotLeased) as not_leased:
        await outcome.apply(db, job_ref="job-queued", fencing_token=1, event=details)
    assert not_leased.value.state == "queued"
    with pytest.raises(UnknownJob):
        await outcome.apply(db, job_ref="job-nope", fencing_token=1, event=details)
    # A malformed result_ref / cause_code.
    with pytest.raises(InvalidArgument) as invalid:
        await outcome.apply(
            db, fencing_token=second.fencing_token, ref=outcome.invalid_ref, event=details
        )
    assert invalid.value.field == outcome.ref_field

    assert await events(db) == []
    row = await job(db)
    assert (row["scoring_state"], row["active_fencing_token"], row["result_ref"]) == (
        "leased",
        second.fencing_token,
        None,
    )


@OUTCOMES
async def test_a_job_row_settled_without_its_outbox_row_reconciles_as_duplicate_inserted(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    # The scoring service's own, non-atomic outcome: the job row only.
    await db.execute(outcome.settle_sql)
    settled = await job(db)
    assert settled["scoring_state"] == outcome.state
    written = await outcome.apply(
        db, fencing_token=claimed.fencing_token, data=RESULT, event=details
    )
    assert (outcome.result(written), written.enqueue) == (outcome.duplicate, Enqueue.INSERTED)
    # The event says when the job settled, not when it was reconciled.
    assert written.occurred_at_unix_ms == settled["updated_at_unix_ms"]
    assert await job(db) == settled
    [event] = await events(db)
    assert event["id"] == written.event_id


@OUTCOMES
async def test_an_outbox_row_with_the_job_still_leased_reconciles_as_applied_duplicate(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    same = await outcome.event_row(
        db, fencing_token=claimed.fencing_token, event=details, data=RESULT
    )
    await insert_event_row(db, same)
    written = await outcome.apply(
        db, fencing_token=claimed.fencing_token, data=RESULT, event=details
    )
    assert (outcome.result(written), written.enqueue) == (outcome.applied, Enqueue.DUPLICATE)
    assert (await job(db))["scoring_state"] == outcome.state
    assert len(await events(db)) == 1


@OUTCOMES
async def test_an_already_published_event_is_not_enqueued_again(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    first = await outcome.apply(db, fencing_token=claimed.fencing_token, event=details)
    await publish(db, first.event_id)
    assert await events(db) == []
    again = await outcome.apply(db, fencing_token=claimed.fencing_token, event=details)
    assert (outcome.result(again), again.enqueue) == (outcome.duplicate, Enqueue.DUPLICATE)
    assert await events(db) == []
    assert [r["id"] for r in await receipts(db)] == [first.event_id]


# -- completion ----------------------------------------------------------------------------


async def test_same_result_ref_with_a_different_payload_is_a_conflicting_replay(
    db: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    await complete_claimed(payload=RESULT)
    with pytest.raises(ConflictingReplay) as caught:
        await complete_claimed(payload={"score": 0.1})
    assert caught.value.event_id == terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    [event] = await events(db)
    assert decode_outcome_event(event["payload"]).data == JobCompleted("job-1", "r-1", RESULT)


async def test_a_late_conflict_in_the_callers_transaction_can_only_roll_back(
    db: asyncpg.Connection,
    details: EventDetails,
    claimed: ClaimedJob,
    complete_claimed: CompleteClaimed,
) -> None:
    other_content = await COMPLETION.event_row(
        db, fencing_token=claimed.fencing_token, event=details, data={"score": 0.99}
    )
    await insert_event_row(db, other_content)
    tr = db.transaction()
    await tr.start()
    await enqueue_job(db, job_ref="job-side-effect", request_ref="req-x", max_attempts=1)
    with pytest.raises(ConflictingReplay):
        await complete_claimed(payload=RESULT)
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


async def test_a_receipt_with_the_job_still_leased_reconciles_as_completed_duplicate(
    db: asyncpg.Connection,
    details: EventDetails,
    claimed: ClaimedJob,
    complete_claimed: CompleteClaimed,
) -> None:
    same = await COMPLETION.event_row(db, fencing_token=claimed.fencing_token, event=details)
    await insert_event_row(db, same)
    await publish(db, terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1"))
    outcome = await complete_claimed()
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.DUPLICATE)
    assert await events(db) == []


async def test_a_receipt_of_another_event_type_under_the_id_conflicts(
    db: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    event_id = terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    await db.execute(
        """INSERT INTO outbox_receipt (id, aggregatetype, aggregateid, type, topic, kafka_partition,
           kafka_offset, created_at) VALUES ($1, 'scoring_job', 'job-1', 'something.else', 't', 0, 0, now())""",
        event_id,
    )
    with pytest.raises(ConflictingReplay):
        await complete_claimed()
    assert (await job(db))["scoring_state"] == "leased"
    assert await events(db) == []


# -- caller-owned transactions -------------------------------------------------------------


async def test_a_callers_transaction_that_rolls_back_leaves_nothing(
    db: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    before = await job(db)
    tr = db.transaction()
    await tr.start()
    outcome = await complete_claimed()
    assert (outcome.completion, outcome.enqueue) == (Completion.COMPLETED, Enqueue.INSERTED)
    assert db.is_in_transaction()  # the writer did not commit the caller's transaction
    await tr.rollback()
    assert await job(db) == before
    assert await events(db) == []


async def test_a_callers_transaction_commits_its_own_writes_with_the_outcome(
    db: asyncpg.Connection, db2: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    async with db.transaction():
        await db.execute("CREATE TABLE score_result (ref text PRIMARY KEY)")
        await db.execute("INSERT INTO score_result VALUES ('r-1')")
        await complete_claimed()
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
    complete_claimed: CompleteClaimed,
    changes: dict[str, object],
    payload: object,
    field: str,
) -> None:
    before = await job(db)
    with pytest.raises(InvalidEnvelope) as caught:
        await complete_claimed(
            payload=payload,
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
    db: asyncpg.Connection,
    complete_claimed: CompleteClaimed,
    kwargs: dict[str, object],
    field: str,
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await complete_claimed(**kwargs)
    assert caught.value.field == field
    assert await events(db) == []


async def test_a_caller_supplied_event_id_must_be_the_derived_one(
    db: asyncpg.Connection, details: EventDetails, complete_claimed: CompleteClaimed
) -> None:
    with pytest.raises(EventIdMismatch):
        await complete_claimed(event=dataclasses.replace(details, event_id=uuid.uuid4()))
    assert (await job(db))["scoring_state"] == "leased"
    derived = terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    outcome = await complete_claimed(event=dataclasses.replace(details, event_id=derived))
    assert outcome.event_id == derived


async def test_stored_payload_is_the_canonical_body(
    db: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    await complete_claimed(payload={"z": 1, "a": [1.5, "é", None]})
    [event] = await events(db)
    body = json.loads(event["payload"])
    assert set(body) == {"envelope", "data"}
    assert body["data"] == {
        "outcome": "completed",
        "scoring_job_ref": "job-1",
        "result_ref": "r-1",
        "result": {"z": 1, "a": [1.5, "é", None]},
    }


async def test_an_event_over_the_broker_default_limit_is_refused_before_any_write(
    db: asyncpg.Connection, complete_claimed: CompleteClaimed
) -> None:
    # A completion whose event the broker (default max.message.bytes, 1 MiB) could never
    # take: it would be quarantined for ever while completion_outbox counts the job covered.
    before = await job(db)
    with pytest.raises(EventTooLarge) as caught:
        await complete_claimed(payload={"blob": "x" * (1024 * 1024)})
    assert caught.value.field == "payload"
    assert caught.value.size_bytes > caught.value.limit_bytes == DEFAULT_MAX_EVENT_BYTES
    assert await job(db) == before
    assert await events(db) == []


async def test_the_event_size_limit_is_the_callers_to_set(
    db: asyncpg.Connection, details: EventDetails, complete_claimed: CompleteClaimed
) -> None:
    small = dataclasses.replace(details, max_event_bytes=2_000)
    with pytest.raises(EventTooLarge):
        await complete_claimed(payload={"blob": "x" * 3_000}, event=small)
    assert await events(db) == []
    outcome = await complete_claimed(payload={"blob": "x" * 500}, event=small)
    assert outcome.completion is Completion.COMPLETED
    assert len(await events(db)) == 1


# -- trace context -------------------------------------------------------------------------------
@OUTCOMES
async def test_an_event_written_inside_a_span_carries_its_trace_context(
    db: asyncpg.Connection, details: EventDetails, outcome: Outcome, claimed: ClaimedJob
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import TraceState, set_span_in_context
    from opentelemetry.trace.span import NonRecordingSpan, SpanContext, TraceFlags

    parent = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=TraceState([("vendor", "opaque")]),
    )
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span(
        "work", context=set_span_in_context(NonRecordingSpan(parent))
    ) as span:
        await outcome.apply(
            db,
            fencing_token=claimed.fencing_token,
            data=RESULT,
            event=dataclasses.replace(details, traceparent=None),
        )
        context = span.get_span_context()
    [event] = await events(db)
    assert event["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
    assert event["tracestate"] == "vendor=opaque"


async def test_the_caller_s_own_trace_context_wins_over_the_current_span(
    db: asyncpg.Connection, details: EventDetails, claimed: ClaimedJob
) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    with TracerProvider().get_tracer("test").start_as_current_span("work"):
        await COMPLETION.apply(
            db,
            fencing_token=claimed.fencing_token,
            data=RESULT,
            event=dataclasses.replace(details, tracestate="vendor=mine"),
        )
    [event] = await events(db)
    assert (event["traceparent"], event["tracestate"]) == (TRACEPARENT, "vendor=mine")


@pytest.mark.parametrize(
    ("traceparent", "tracestate"),
    [(None, "vendor=x"), (TRACEPARENT, "x" * 513), (TRACEPARENT, "vendor=\u00e9")],
    ids=["without-traceparent", "too-long", "not-ascii"],
)
async def test_a_tracestate_the_contract_does_not_take_is_refused_before_any_write(
    db: asyncpg.Connection,
    details: EventDetails,
    claimed: ClaimedJob,
    traceparent: str | None,
    tracestate: str,
) -> None:
    with pytest.raises(InvalidEnvelope) as refused:
        await COMPLETION.apply(
            db,
            fencing_token=claimed.fencing_token,
            data=RESULT,
            event=dataclasses.replace(details, traceparent=traceparent, tracestate=tracestate),
        )
    assert refused.value.field == "tracestate"
    assert await events(db) == []
