-- The scoring service's job table, column for column and constraint for constraint
-- as its migration 0002 defines it. Created here only where it is absent (development,
-- tests); where the scoring service already created it, this statement changes nothing.

CREATE TABLE IF NOT EXISTS scoring_job_state (
    scoring_job_ref                 text        NOT NULL,
    scoring_request_ref             text        NOT NULL,
    scoring_state                   text        NOT NULL,
    attempt_count                   integer     NOT NULL DEFAULT 0,
    max_attempts                    integer     NOT NULL,
    next_attempt_at_unix_ms         bigint,
    last_failure_code               text,
    active_worker_ref               text,
    active_lease_ref                text,
    active_fencing_token            bigint,
    active_lease_expires_at_unix_ms bigint,
    result_ref                      text,
    completed_fencing_token         bigint,
    created_at                      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at                      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT scoring_job_state_pkey PRIMARY KEY (scoring_job_ref),
    CONSTRAINT scoring_job_state_state_check CHECK (
        scoring_state IN ('queued', 'leased', 'retry_scheduled', 'completed', 'quarantined', 'cancelled')
    ),
    -- Every *_ref: trimmed, non-empty, not numeric-looking.
    CONSTRAINT scoring_job_state_job_ref_check CHECK (
        scoring_job_ref = btrim(scoring_job_ref) AND scoring_job_ref <> ''
        AND NOT (scoring_job_ref ~ '^[0-9+,.eE-]+$' AND scoring_job_ref ~ '[0-9]')
    ),
    CONSTRAINT scoring_job_state_request_ref_check CHECK (
        scoring_request_ref = btrim(scoring_request_ref) AND scoring_request_ref <> ''
        AND NOT (scoring_request_ref ~ '^[0-9+,.eE-]+$' AND scoring_request_ref ~ '[0-9]')
    ),
    CONSTRAINT scoring_job_state_worker_ref_check CHECK (
        active_worker_ref IS NULL OR (
            active_worker_ref = btrim(active_worker_ref) AND active_worker_ref <> ''
            AND NOT (active_worker_ref ~ '^[0-9+,.eE-]+$' AND active_worker_ref ~ '[0-9]'))
    ),
    CONSTRAINT scoring_job_state_lease_ref_check CHECK (
        active_lease_ref IS NULL OR (
            active_lease_ref = btrim(active_lease_ref) AND active_lease_ref <> ''
            AND NOT (active_lease_ref ~ '^[0-9+,.eE-]+$' AND active_lease_ref ~ '[0-9]'))
    ),
    CONSTRAINT scoring_job_state_result_ref_check CHECK (
        result_ref IS NULL OR (
            result_ref = btrim(result_ref) AND result_ref <> ''
            AND NOT (result_ref ~ '^[0-9+,.eE-]+$' AND result_ref ~ '[0-9]'))
    ),
    CONSTRAINT scoring_job_state_attempts_check CHECK (
        max_attempts > 0 AND attempt_count >= 0 AND attempt_count <= max_attempts
    ),
    -- The four active_* columns are set exactly when the job is leased.
    CONSTRAINT scoring_job_state_active_check CHECK (
        CASE WHEN scoring_state = 'leased' THEN
            active_worker_ref IS NOT NULL AND active_lease_ref IS NOT NULL
            AND active_fencing_token IS NOT NULL AND active_lease_expires_at_unix_ms IS NOT NULL
            AND active_fencing_token = attempt_count
            AND active_lease_expires_at_unix_ms > 0
        ELSE
            active_worker_ref IS NULL AND active_lease_ref IS NULL
            AND active_fencing_token IS NULL AND active_lease_expires_at_unix_ms IS NULL
        END
    ),
    CONSTRAINT scoring_job_state_shape_check CHECK (
        CASE scoring_state
            WHEN 'queued' THEN
                attempt_count = 0 AND next_attempt_at_unix_ms IS NULL AND last_failure_code IS NULL
                AND result_ref IS NULL AND completed_fencing_token IS NULL
            WHEN 'leased' THEN
                attempt_count > 0
            WHEN 'retry_scheduled' THEN
                attempt_count > 0 AND attempt_count < max_attempts
                AND next_attempt_at_unix_ms IS NOT NULL AND last_failure_code IS NOT NULL
            WHEN 'completed' THEN
                result_ref IS NOT NULL AND completed_fencing_token IS NOT NULL
                AND completed_fencing_token = attempt_count
            WHEN 'quarantined' THEN
                attempt_count > 0 AND last_failure_code IS NOT NULL AND result_ref IS NULL
            WHEN 'cancelled' THEN
                next_attempt_at_unix_ms IS NULL AND result_ref IS NULL
                AND completed_fencing_token IS NULL
            ELSE false
        END
    )
);
