"""The expected privilege matrix, written out by hand: the model must produce exactly this.

Notation as in docs/security.md: whole-table privileges, then column-level ones.
"""

from __future__ import annotations

from migrations.grants import FUNCTIONS
from tests.support.roles import NONE

# The scoring functions a worker calls (migration 0012); every other function is called by
# no role (trigger functions fire without EXECUTE; the helpers run as the functions' owner).
SCORING_CALLS = (
    "function outbox_relay_complete_job(text, bigint, text, text, text, text, text, jsonb, "
    "text, text, text, text, uuid, bigint)",
    "function outbox_relay_fail_job_permanently(text, bigint, text, text, text, text, text, "
    "jsonb, text, text, text, text, uuid, bigint)",
    "function outbox_relay_fail_retryable(text, bigint, text, bigint, text, text, text, text, "
    "jsonb, text, text, text, text, uuid, bigint)",
    "function outbox_relay_expire_leases(bigint, text, text, text, text, text, text, text, "
    "text, bigint, text[])",
)
_CALLS_THEM = dict.fromkeys(SCORING_CALLS, "EXECUTE")

_NOTHING = {
    "outbox": NONE,
    "outbox_receipt": NONE,
    "relay_lane": NONE,
    "relay_instance": NONE,
    "scoring_job_state": NONE,
    "outbox_relay_migration": NONE,
    "outbox_relay_writer_route": NONE,
    "sequence outbox_seq_seq": NONE,
    **{f"function {function}": NONE for function in FUNCTIONS},
    # SECURITY DEFINER, for every role that inserts (from PUBLIC): the door reads its
    # routes through it (migration 0011)
    "function outbox_relay_writer_routes(name)": "EXECUTE",
    "schema public": "USAGE",
}

WRITER = {
    **_NOTHING,
    **_CALLS_THEM,
    "outbox": "SELECT, INSERT",
    "outbox_receipt": "SELECT",
    "scoring_job_state": "SELECT, UPDATE(active_fencing_token, active_lease_expires_at_unix_ms, "
    "active_lease_ref, active_worker_ref, attempt_count, completed_fencing_token, "
    "last_failure_code, next_attempt_at_unix_ms, result_ref, scoring_state, updated_at)",
}

# A scoring worker in any language: the four functions, nothing else.
SCORING_WORKER = {**_NOTHING, **_CALLS_THEM}

# DESIGN §3.1: the core columns and the optional ones a writer may set. The scoring
# functions (migration 0012) set all but headers and topic: their events go by the template.
SCORING_EVENT_COLUMNS = (
    "id",
    "aggregatetype",
    "aggregateid",
    "type",
    "payload",
    "tenant_ref",
    "schema_version",
    "correlation_ref",
    "causation_ref",
    "traceparent",
    "tracestate",
)
EVENT_WRITER_COLUMNS = (*SCORING_EVENT_COLUMNS, "headers", "topic")

# Column-level INSERT of the contract's writer columns, and nothing else.
EVENT_WRITER = {**_NOTHING, "outbox": f"INSERT({', '.join(sorted(EVENT_WRITER_COLUMNS))})"}

RELAY = {
    **_NOTHING,
    "outbox": "SELECT, DELETE, UPDATE(attempts, held_template, held_topic, last_error_class, "
    "next_attempt_at, quarantined_at, size_bytes)",
    "outbox_receipt": "SELECT, INSERT, DELETE, "
    "UPDATE(kafka_offset, kafka_partition, published_at, topic)",
    "relay_lane": "SELECT, UPDATE(fence, lease_expires_at, owner_id)",
    "relay_instance": "SELECT, INSERT, DELETE, "
    "UPDATE(heartbeat_at, last_publish_at, published_total, topic_template)",
    "outbox_relay_migration": "SELECT",
    "sequence outbox_seq_seq": "SELECT",
}

SIDECAR = {
    **_NOTHING,
    "outbox": "SELECT",
    "outbox_receipt": "SELECT",
    "relay_lane": "SELECT",
    "relay_instance": "SELECT",
    "scoring_job_state": "SELECT",
    "outbox_relay_migration": "SELECT",
}

# `run` without --no-relay: one process, one role, both parts.
RELAY_AND_SIDECAR = {**RELAY, "scoring_job_state": "SELECT"}

BY_PART = {
    "writer": WRITER,
    "scoring-worker": SCORING_WORKER,
    "event-writer": EVENT_WRITER,
    "relay": RELAY,
    "sidecar": SIDECAR,
}
