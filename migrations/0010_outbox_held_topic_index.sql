-- migrate: no-transaction
-- Does an earlier held row of this key hold it back on its topic? The relay's fetch asks
-- for every row it reads, and the answer is one probe of this index: the key enters as a
-- 64-bit hash, so entries have one size whatever the key (the fetch compares the keys
-- themselves too), and the topic is the one the relay recorded with the failure
-- (held_topic, 0009), looked up together with '*' (a row nobody resolved holds its key on
-- every topic). Empty while all is well. outbox_held_key_idx, which the previous release's
-- relay reads, stays until the release after this one.
--
-- Built without blocking writers; a lock the build must wait for is given up after a
-- second rather than queueing writers behind it (migrate can simply be run again).
SET lock_timeout = '1s';

CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_held_topic_idx
    ON outbox (hashtextextended(aggregateid, 0::bigint), held_topic, seq)
    WHERE quarantined_at IS NOT NULL OR next_attempt_at IS NOT NULL;

RESET lock_timeout;
