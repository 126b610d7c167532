-- A row written without an id gets a time-ordered one: an RFC 9562 UUIDv7, whose first 48
-- bits are the insert's Unix milliseconds.
--
-- The id is also the key of the row's delivery receipt, and receipts are kept for the
-- retention window (seven days by default), so that index grows large. A random id puts
-- every receipt in a random leaf of it; a time-ordered one puts it at the right-hand edge,
-- which stays in memory. With 5,000,000 receipts the receipt insert cost PostgreSQL
-- 7.5-12.4 us of CPU and 764 bytes of WAL per row with random ids, 3.3-3.8 us and 280
-- bytes with time-ordered ones (docs/benchmarks.md, "Time-ordered event ids").
--
-- PostgreSQL 18 has uuidv7(). Older servers get the same layout from built-in functions
-- (milliseconds only, the rest random): the default stays an expression of built-ins, so
-- no new object needs a grant. Rows already written keep their ids; an id the writer gives
-- (the scoring writer derives its own, docs/writer.md) is stored as given.
DO $$
BEGIN
    IF current_setting('server_version_num')::integer >= 180000 THEN
        EXECUTE 'ALTER TABLE outbox ALTER COLUMN id SET DEFAULT uuidv7()';
    ELSE
        -- gen_random_uuid() with its first six bytes replaced by the milliseconds and its
        -- version nibble turned from 4 (0100) into 7 (0111).
        EXECUTE $sql$
            ALTER TABLE outbox ALTER COLUMN id SET DEFAULT encode(
                set_bit(set_bit(
                    overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(floor(
                                extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                            FROM 1 FOR 6),
                    52, 1), 53, 1),
                'hex')::uuid
        $sql$;
    END IF;
END
$$;
