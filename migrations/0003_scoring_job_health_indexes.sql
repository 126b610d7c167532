-- migrate: no-transaction
-- Partial indexes the health probes read. Built CONCURRENTLY so the scoring
-- service's writes are never blocked; each statement runs on its own, outside a
-- transaction. Their size follows the active sets, not the terminal history.

CREATE INDEX CONCURRENTLY IF NOT EXISTS scoring_job_state_active_created_idx
    ON scoring_job_state (created_at)
    WHERE scoring_state IN ('queued', 'leased', 'retry_scheduled');

CREATE INDEX CONCURRENTLY IF NOT EXISTS scoring_job_state_quarantined_created_idx
    ON scoring_job_state (created_at)
    WHERE scoring_state = 'quarantined';

CREATE INDEX CONCURRENTLY IF NOT EXISTS scoring_job_state_leased_expiry_idx
    ON scoring_job_state (active_lease_expires_at_unix_ms)
    WHERE scoring_state = 'leased';

-- completion_outbox reads terminal jobs within its look-back window only; carrying the
-- ref makes that scan index-only.
CREATE INDEX CONCURRENTLY IF NOT EXISTS scoring_job_state_terminal_updated_idx
    ON scoring_job_state (updated_at) INCLUDE (scoring_job_ref)
    WHERE scoring_state IN ('completed', 'quarantined');

-- Claim-next-due picks the oldest due job by created_at then ref.
CREATE INDEX CONCURRENTLY IF NOT EXISTS scoring_job_state_claimable_idx
    ON scoring_job_state (created_at, scoring_job_ref)
    WHERE scoring_state IN ('queued', 'retry_scheduled');
