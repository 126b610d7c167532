-- migrate: no-transaction
-- A writer may carry a W3C tracestate with its traceparent: the vendor-specific part of the
-- trace context, which the relay forwards as the record's tracestate header (and links to
-- in its publish span). Nullable and without a default, so adding it rewrites nothing; its
-- check is added NOT VALID and then validated, which reads the table without blocking
-- writers. Each statement runs on its own, and each gives up on a lock it would wait for
-- rather than queue writers behind it (migrate can simply be run again).
SET lock_timeout = '2s';

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS tracestate text;

DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_constraint
        WHERE conrelid = 'outbox'::regclass AND conname = 'outbox_tracestate_check'
    ) THEN
        -- W3C Trace Context: at most 512 characters of printable ASCII.
        ALTER TABLE outbox ADD CONSTRAINT outbox_tracestate_check CHECK (
            tracestate IS NULL
            OR (octet_length(tracestate) <= 512 AND tracestate ~ '^[ -~]*$')
        ) NOT VALID;
    END IF;
END
$$;

ALTER TABLE outbox VALIDATE CONSTRAINT outbox_tracestate_check;

RESET lock_timeout;
