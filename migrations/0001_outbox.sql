-- The transactional outbox, its delivery receipts and the relay's lane bookkeeping.
--
-- A writer inserts only the Debezium core columns (and optionally the documented
-- extras); everything else has a default. The table holds only events that are not
-- yet published: the relay deletes a row in the same statement that records its
-- delivery receipt, so the hot table stays as small as the backlog itself.

CREATE TABLE outbox (
    id               uuid        NOT NULL DEFAULT gen_random_uuid(),
    aggregatetype    text        NOT NULL,
    aggregateid      text        NOT NULL,
    type             text        NOT NULL,
    payload          jsonb,
    tenant_ref       text,
    schema_version   text,
    correlation_ref  text,
    causation_ref    text,
    traceparent      text,
    headers          jsonb,
    topic            text,
    -- Relay bookkeeping. seq is the insert order; writers of one aggregate serialise
    -- on it, so within one aggregateid seq order is commit order.
    seq              bigint      GENERATED ALWAYS AS IDENTITY,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    lane             smallint    GENERATED ALWAYS AS ((hashtext(aggregateid) & 63)::smallint) STORED,
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz,
    last_error_class text,
    quarantined_at   timestamptz,
    CONSTRAINT outbox_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_seq_key UNIQUE (seq),
    CONSTRAINT outbox_aggregatetype_check CHECK (aggregatetype <> ''),
    CONSTRAINT outbox_aggregateid_check CHECK (aggregateid <> ''),
    CONSTRAINT outbox_type_check CHECK (type <> ''),
    CONSTRAINT outbox_topic_check CHECK (topic IS NULL OR topic <> ''),
    CONSTRAINT outbox_headers_check CHECK (
        headers IS NULL
        OR (jsonb_typeof(headers) = 'object'
            AND NOT jsonb_path_exists(headers, '$.* ? (@.type() != "string")'))
    ),
    CONSTRAINT outbox_traceparent_check CHECK (
        traceparent IS NULL
        OR traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
    ),
    CONSTRAINT outbox_attempts_check CHECK (attempts >= 0)
);

-- The relay scans ready rows in seq order.
CREATE INDEX outbox_ready_idx ON outbox (seq) WHERE quarantined_at IS NULL;
-- Rows that hold back their key (backing off or quarantined); empty when healthy.
CREATE INDEX outbox_held_idx ON outbox (aggregateid, seq)
    WHERE quarantined_at IS NOT NULL OR next_attempt_at IS NOT NULL;
-- Oldest pending age for the health probe.
CREATE INDEX outbox_pending_created_idx ON outbox (created_at) WHERE quarantined_at IS NULL;
CREATE INDEX outbox_quarantined_idx ON outbox (quarantined_at) WHERE quarantined_at IS NOT NULL;
-- Links a terminal scoring job to its event (completion_outbox family).
CREATE INDEX outbox_scoring_job_idx ON outbox (aggregateid) WHERE aggregatetype = 'scoring_job';

-- Deletes are the normal path; vacuum them early so the scan stays short.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_analyze_scale_factor = 0.0,
    autovacuum_analyze_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 10000,
    fillfactor = 90
);

-- One NOTIFY per inserting statement; PostgreSQL folds equal notifications of one
-- transaction and delivers them only at commit, which is exactly the wake-up we want.
CREATE FUNCTION outbox_relay_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_relay', '');
    RETURN NULL;
END
$$;

CREATE TRIGGER outbox_relay_notify
    AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_relay_notify();

-- Delivery receipts: where the broker put each published event. Kept for an
-- operator-set window, pruned in bounded batches.
CREATE TABLE outbox_receipt (
    id              uuid        NOT NULL,
    aggregatetype   text        NOT NULL,
    aggregateid     text        NOT NULL,
    type            text        NOT NULL,
    topic           text        NOT NULL,
    kafka_partition integer     NOT NULL,
    kafka_offset    bigint      NOT NULL,
    created_at      timestamptz NOT NULL,
    published_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT outbox_receipt_pkey PRIMARY KEY (id)
);
CREATE INDEX outbox_receipt_published_idx ON outbox_receipt (published_at);
CREATE INDEX outbox_receipt_scoring_job_idx ON outbox_receipt (aggregateid)
    WHERE aggregatetype = 'scoring_job';

-- Lanes split the key space between relay instances: a key's lane is fixed by the
-- hash above, and a lane is published by its lease holder only. fence grows on every
-- change of owner, so a stale owner's writes are refused.
CREATE TABLE relay_lane (
    lane             smallint    NOT NULL,
    owner_id         text,
    fence            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    CONSTRAINT relay_lane_pkey PRIMARY KEY (lane),
    CONSTRAINT relay_lane_range_check CHECK (lane BETWEEN 0 AND 63),
    CONSTRAINT relay_lane_owner_check CHECK ((owner_id IS NULL) = (lease_expires_at IS NULL))
);
INSERT INTO relay_lane (lane) SELECT generate_series(0, 63);

-- One row per running relay instance: its heartbeat and progress.
CREATE TABLE relay_instance (
    instance_id     text        NOT NULL,
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_publish_at timestamptz,
    published_total bigint      NOT NULL DEFAULT 0,
    CONSTRAINT relay_instance_pkey PRIMARY KEY (instance_id)
);
