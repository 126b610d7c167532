-- migrate: no-transaction
-- Indexes on the key that hold for any key the schema accepts, and the topic template each
-- relay instance runs with.
--
-- outbox_held_idx indexed (aggregateid, seq) of the rows that hold their key back. A B-tree
-- entry must fit a third of a page: a key of about 3 kB that does not compress made the
-- statement that records its failure (or its quarantine) fail, and with it the receipts of
-- the healthy rows recorded in the same transaction. A hash index stores the key's 32-bit
-- hash whatever its length, so recording an outcome can never fail on the key. A relay of
-- the previous version reads it too: its check is an equality on aggregateid.
--
-- outbox_pending_key_seq_idx finds a key's earlier pending rows by seq: a relay's cursor
-- fetch asks whether a row it read has an earlier row of its key that it has not sent
-- (a transaction that committed after the cursor passed its rows), from the table itself
-- rather than from notifications, which any role can send (docs/relay.md, "Fetching").
-- The key enters it as a 64-bit hash, so its entries have one size; the fetch compares the
-- keys themselves too.
--
-- Built without blocking writers; a lock the builds must wait for is given up after a
-- while rather than queueing writers behind it (migrate can simply be run again).
SET lock_timeout = '10s';

CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_held_key_idx ON outbox USING hash (aggregateid)
    WHERE quarantined_at IS NOT NULL OR next_attempt_at IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_pending_key_seq_idx
    ON outbox (hashtextextended(aggregateid, 0), seq)
    WHERE quarantined_at IS NULL;

DROP INDEX CONCURRENTLY IF EXISTS outbox_held_idx;

-- A held row holds its key on its topic only (docs/relay.md, "The unit of order"): the
-- topic a row goes to depends on the template of the relay that publishes it. Each
-- instance writes its template here, so the health sidecar applies the same rule without
-- knowing the relay's flags.
ALTER TABLE relay_instance ADD COLUMN IF NOT EXISTS topic_template text;

RESET lock_timeout;
