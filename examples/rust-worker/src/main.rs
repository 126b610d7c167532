//! A scoring worker in Rust over outbox-relay's SQL functions (docs/writer.md, "From any
//! language"). Every rule of the Python writer holds because the functions hold it: the
//! fenced transition and its outbox event in the caller's transaction, exact replay, an
//! event id derived only from the job and its outcome, the payload canonicalised (RFC 8785)
//! and digested in the database. A refusal comes back as a row with a stable code and
//! leaves the transaction usable; only a conflicting replay raises (SQLSTATE OR001).
//!
//! Enqueueing and claiming write no event: they are the scoring service's own statements on
//! its own table, shown here as it would run them.
//!
//! Usage: `outbox-relay-rust-worker DATABASE_URL` runs a walkthrough of every operation and
//! prints one JSON line per step (the test suite reads them: tests/scoring/test_rust_worker.py).

use std::error::Error;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, GenericClient, NoTls, Row};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

// -- the scoring service's own statements (no event) ------------------------------------------

const ENQUEUE: &str = "
INSERT INTO scoring_job_state (scoring_job_ref, scoring_request_ref, scoring_state, max_attempts)
VALUES ($1, $2, 'queued', $3)
ON CONFLICT (scoring_job_ref) DO NOTHING";

// The oldest due job, by created_at then ref; the fencing token is the new attempt count.
const CLAIM_NEXT_DUE: &str = "
WITH clock AS MATERIALIZED (
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000::numeric)::bigint AS now_unix_ms
),
next_job AS (
    SELECT j.scoring_job_ref FROM scoring_job_state j
    WHERE j.scoring_state IN ('queued', 'retry_scheduled')
      AND (j.scoring_state = 'queued' OR j.next_attempt_at_unix_ms <= (SELECT now_unix_ms FROM clock))
    ORDER BY j.created_at, j.scoring_job_ref
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE scoring_job_state j
SET scoring_state = 'leased', attempt_count = j.attempt_count + 1,
    active_worker_ref = $1, active_lease_ref = $2,
    active_fencing_token = j.attempt_count + 1,
    active_lease_expires_at_unix_ms = clock.now_unix_ms + $3::bigint,
    next_attempt_at_unix_ms = NULL, updated_at = clock_timestamp()
FROM next_job, clock
WHERE j.scoring_job_ref = next_job.scoring_job_ref
RETURNING j.scoring_job_ref, j.active_fencing_token";

// -- the functions (migration 0012): named arguments, one row of outbox_relay_outcome -----------

const OUTCOME: &str = "job_ref, outcome, enqueue, event_id::text, occurred_at_unix_ms,
    next_attempt_at_unix_ms, refusal, refusal_field, refusal_message";

// The payload goes as text and becomes jsonb in the statement: no JSON library needed here.
fn complete_job_sql() -> String {
    format!(
        "SELECT {OUTCOME} FROM outbox_relay_complete_job(
            job_ref => $1, fencing_token => $2, result_ref => $3, payload => $4::text::jsonb,
            source => $5, tenant_ref => $6, correlation_ref => $7, schema_version => $8,
            traceparent => $9, tracestate => $10)"
    )
}

fn fail_job_permanently_sql() -> String {
    format!(
        "SELECT {OUTCOME} FROM outbox_relay_fail_job_permanently(
            job_ref => $1, fencing_token => $2, cause_code => $3, detail => $4::text::jsonb,
            source => $5, tenant_ref => $6, correlation_ref => $7, schema_version => $8,
            traceparent => $9, tracestate => $10)"
    )
}

fn fail_retryable_sql() -> String {
    format!(
        "SELECT {OUTCOME} FROM outbox_relay_fail_retryable(
            job_ref => $1, fencing_token => $2, cause_code => $3, detail => $4::text::jsonb,
            source => $5, tenant_ref => $6, correlation_ref => $7, schema_version => $8,
            traceparent => $9, tracestate => $10, retry_delay_ms => $11)"
    )
}

// "limit" is a reserved word: quoted, like the parameter.
fn expire_leases_sql() -> String {
    format!(
        "SELECT {OUTCOME} FROM outbox_relay_expire_leases(
            \"limit\" => $1, source => $2, tenant_ref => $3, correlation_ref => $4,
            schema_version => $5, traceparent => $6, tracestate => $7)"
    )
}

/// What the worker says about its events (`EventDetails` in Python).
struct EventDetails {
    source: &'static str,
    tenant_ref: &'static str,
    correlation_ref: &'static str,
    schema_version: &'static str,
    traceparent: Option<&'static str>,
    tracestate: Option<&'static str>,
}

const DETAILS: EventDetails = EventDetails {
    source: "urn:scoring-worker",
    tenant_ref: "tenant-a",
    correlation_ref: "corr-1",
    schema_version: "1",
    traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    tracestate: Some("vendor=opaque"),
};

/// One row of outbox_relay_outcome.
struct Outcome {
    job_ref: Option<String>,
    outcome: String,
    enqueue: Option<String>,
    event_id: Option<String>,
    occurred_at_unix_ms: Option<i64>,
    next_attempt_at_unix_ms: Option<i64>,
    refusal: Option<String>,
    refusal_field: Option<String>,
    refusal_message: Option<String>,
}

impl Outcome {
    fn from_row(row: &Row) -> Self {
        Outcome {
            job_ref: row.get(0),
            outcome: row.get(1),
            enqueue: row.get(2),
            event_id: row.get(3),
            occurred_at_unix_ms: row.get(4),
            next_attempt_at_unix_ms: row.get(5),
            refusal: row.get(6),
            refusal_field: row.get(7),
            refusal_message: row.get(8),
        }
    }

    /// One JSON line, for the step named.
    fn print(&self, step: &str) {
        let text = |v: &Option<String>| v.as_deref().map_or("null".to_string(), json_string);
        let number = |v: &Option<i64>| v.map_or("null".to_string(), |n| n.to_string());
        println!(
            "{{\"step\":{},\"job_ref\":{},\"outcome\":{},\"enqueue\":{},\"event_id\":{},\
             \"occurred_at_unix_ms\":{},\"next_attempt_at_unix_ms\":{},\"refusal\":{},\
             \"refusal_field\":{},\"refusal_message\":{}}}",
            json_string(step),
            text(&self.job_ref),
            json_string(&self.outcome),
            text(&self.enqueue),
            text(&self.event_id),
            number(&self.occurred_at_unix_ms),
            number(&self.next_attempt_at_unix_ms),
            text(&self.refusal),
            text(&self.refusal_field),
            text(&self.refusal_message),
        );
    }
}

fn json_string(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// -- the operations ------------------------------------------------------------------------------

async fn enqueue(db: &impl GenericClient, job_ref: &str, max_attempts: i32) -> Result<()> {
    db.execute(
        ENQUEUE,
        &[&job_ref, &format!("req-{job_ref}"), &max_attempts],
    )
    .await?;
    Ok(())
}

/// The claimed job's ref and fencing token, if a job was due.
async fn claim(db: &impl GenericClient, lease_ms: i64) -> Result<Option<(String, i64)>> {
    let lease_ref = format!("lease-rust-{}-{lease_ms}", std::process::id());
    let row = db
        .query_opt(CLAIM_NEXT_DUE, &[&"worker-rust", &lease_ref, &lease_ms])
        .await?;
    Ok(row.map(|r| (r.get(0), r.get(1))))
}

async fn complete(
    db: &impl GenericClient,
    job_ref: &str,
    fencing_token: i64,
    result_ref: &str,
    payload: &str,
) -> Result<Outcome> {
    let d = &DETAILS;
    let row = db
        .query_one(
            &complete_job_sql(),
            &[
                &job_ref,
                &fencing_token,
                &result_ref,
                &payload,
                &d.source,
                &d.tenant_ref,
                &d.correlation_ref,
                &d.schema_version,
                &d.traceparent,
                &d.tracestate,
            ],
        )
        .await?;
    Ok(Outcome::from_row(&row))
}

async fn fail_permanently(
    db: &impl GenericClient,
    job_ref: &str,
    fencing_token: i64,
    cause_code: &str,
    detail: &str,
) -> Result<Outcome> {
    let d = &DETAILS;
    let row = db
        .query_one(
            &fail_job_permanently_sql(),
            &[
                &job_ref,
                &fencing_token,
                &cause_code,
                &detail,
                &d.source,
                &d.tenant_ref,
                &d.correlation_ref,
                &d.schema_version,
                &d.traceparent,
                &d.tracestate,
            ],
        )
        .await?;
    Ok(Outcome::from_row(&row))
}

async fn fail_retryable(
    db: &impl GenericClient,
    job_ref: &str,
    fencing_token: i64,
    cause_code: &str,
    retry_delay_ms: i64,
) -> Result<Outcome> {
    let d = &DETAILS;
    let row = db
        .query_one(
            &fail_retryable_sql(),
            &[
                &job_ref,
                &fencing_token,
                &cause_code,
                &"null",
                &d.source,
                &d.tenant_ref,
                &d.correlation_ref,
                &d.schema_version,
                &d.traceparent,
                &d.tracestate,
                &retry_delay_ms,
            ],
        )
        .await?;
    Ok(Outcome::from_row(&row))
}

async fn expire_leases(db: &impl GenericClient, limit: i64) -> Result<Vec<Outcome>> {
    let d = &DETAILS;
    let rows = db
        .query(
            &expire_leases_sql(),
            &[
                &limit,
                &d.source,
                &d.tenant_ref,
                &d.correlation_ref,
                &d.schema_version,
                &d.traceparent,
                &d.tracestate,
            ],
        )
        .await?;
    Ok(rows.iter().map(Outcome::from_row).collect())
}

/// A conflicting replay is the one refusal that is an error: the function has aborted the
/// transaction, so that the transition it wrote can never commit without its event.
fn is_conflicting_replay(error: &tokio_postgres::Error) -> bool {
    error.code() == Some(&SqlState::from_code("OR001"))
}

// -- the walkthrough -------------------------------------------------------------------------------

async fn walkthrough(client: &mut Client) -> Result<()> {
    // A completion, and its exact replay. The payload is spelt as this worker spells it:
    // the database canonicalises it, so 0.730 and a key order of its own make the same row
    // a Python worker writes from {"score": 0.73, "labels": [...], "model": "m-3"}.
    enqueue(client, "job-rust-1", 3).await?;
    let (job, fence) = claim(client, 60_000)
        .await?
        .ok_or("job-rust-1 was not due")?;
    let payload = r#"{"model": "m-3", "score": 0.730, "labels": ["a", "b"]}"#;
    complete(client, &job, fence, "r-1", payload)
        .await?
        .print("complete");
    complete(client, &job, fence, "r-1", payload)
        .await?
        .print("replay");

    // A stale fence, refused inside the worker's own transaction, which goes on: a retryable
    // failure under the right fence commits in it.
    enqueue(client, "job-rust-2", 3).await?;
    let (job, fence) = claim(client, 60_000)
        .await?
        .ok_or("job-rust-2 was not due")?;
    let tx = client.transaction().await?;
    complete(&tx, &job, fence + 1, "r-2", "null")
        .await?
        .print("stale_fence");
    fail_retryable(&tx, &job, fence, "timeout", 60_000)
        .await?
        .print("fail_retryable");
    tx.commit().await?;

    // A permanent failure.
    enqueue(client, "job-rust-3", 3).await?;
    let (job, fence) = claim(client, 60_000)
        .await?
        .ok_or("job-rust-3 was not due")?;
    let detail = r#"{"reason": "unreadable input", "line": 7}"#;
    fail_permanently(client, &job, fence, "bad_input", detail)
        .await?
        .print("fail_permanently");

    // Two leases that expire: one with budget left (rescheduled), one without (quarantined,
    // with its event).
    enqueue(client, "job-rust-4", 1).await?;
    claim(client, 1).await?.ok_or("job-rust-4 was not due")?;
    enqueue(client, "job-rust-5", 2).await?;
    claim(client, 1).await?.ok_or("job-rust-5 was not due")?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    for outcome in expire_leases(client, 10).await? {
        outcome.print("expire_leases");
    }
    Ok(())
}

fn main() -> Result<()> {
    let url = std::env::args()
        .nth(1)
        .ok_or("usage: outbox-relay-rust-worker DATABASE_URL")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("rust-worker: connection lost: {error}");
            }
        });
        match walkthrough(&mut client).await {
            Err(error) => {
                if let Some(db) = error.downcast_ref::<tokio_postgres::Error>() {
                    if is_conflicting_replay(db) {
                        eprintln!("rust-worker: conflicting replay; the transaction rolled back");
                    }
                }
                Err(error)
            }
            ok => ok,
        }
    })
}
