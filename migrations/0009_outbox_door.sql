-- The door: a row is measured and checked once, when it is inserted.
--
-- The relay's fetch used to measure every candidate row by printing it, and to decide
-- which rows a held row holds back by computing and testing topic names row against row.
-- Both cost every healthy row, and both leaked: jsonb keeps 1e131071 in a few bytes and
-- prints it as 131,072 digits, so a 2 kB row made every fetch print more than 1 GiB and
-- fail; a key the server built from a few sent bytes was transferred whole; a key with
-- thousands of held topics cost every fetch of it thousands of tests.
--
-- Now the writer pays, once: a BEFORE INSERT trigger refuses a row that can never become a
-- Kafka record, with an error its writer sees (program_limit_exceeded, naming the column
-- and the limit), and stores the size the relay will fetch in size_bytes; the fetch reads
-- that column. Limits (contracts/limits.py holds the same values):
--   aggregateid at most 1,024 bytes (the record's key), type at most 1,024,
--   aggregatetype and topic at most 249 (a Kafka topic name's limit);
--   the header set (headers as jsonb prints them, tenant_ref, schema_version,
--   correlation_ref, causation_ref) at most 65,536 bytes;
--   the payload as jsonb prints it at most 1,572,864 bytes (1.5 x the 1 MiB record:
--   jsonb prints ", " and ": " where the compact JSON the relay sends has "," and ":", so
--   a longer one can never fit; a row in between gets the relay's exact check);
--   no number of more than 1,000 digits before its decimal point, nor a non-zero one
--   with more than 1,000 zeros after it.
-- The payload is measured without printing what could print huge: a stored form larger
-- than 4 x the limit is refused unprinted (jsonb's binary form is at most about 3 x its
-- text); numbers are compared by magnitude (jsonpath, in C); in a payload of more than
-- 4 kB, the scales of its numbers (decimals the server may have set without storing
-- them: 0.1 + 0e-16383 prints 16,385 characters) are summed before anything is printed.
--
-- Lengths are checked by the trigger, not by CHECK constraints: a constraint, even NOT
-- VALID, is checked on every UPDATE of a row, so a row stored before the door with a
-- longer key could never have its failure or quarantine recorded. The trigger fires on
-- INSERT and on an UPDATE of a measured column only; the relay's bookkeeping changes none.
--
-- For every role, the owner and superusers included (only the created_at rewrite of 0006
-- spares the owner). A writer cannot set size_bytes: the trigger overwrites it.
--
-- Rows stored before this migration have no size: the relay measures each once, by
-- setting its size_bytes to NULL, which fires outbox_relay_remeasure. That one never
-- refuses, and holds such a row to what provably keeps it from being a record, not to the
-- door's limits (it was accepted before them): a payload as above, a key or type over
-- 1 MiB, a header set over 5 MiB. Such a row gets the size 2147483647, and the relay
-- quarantines it as too large without transferring it.
--
-- A held row (quarantined, or waiting to be retried) holds its key back on one topic.
-- The relay records which when it records the failure (held_topic: the topic it resolved
-- the row to; '' for a topic that can never be valid, which holds nothing else; '*' for
-- a row nobody resolved, such as one held before this migration, which holds its key on
-- every topic) and under which topic template (held_template). A relay re-resolves the
-- held rows of a lane it gains that were resolved under another template (or never) before
-- it fetches them, so its fetch decides with one index probe (0010).
--
-- Adding columns without a volatile default rewrites nothing; each statement gives up on a
-- lock it would wait for rather than queue writers behind it (migrate can be run again).
SET LOCAL lock_timeout = '1s';

ALTER TABLE outbox
    ADD COLUMN size_bytes integer,
    ADD COLUMN held_topic text DEFAULT '*',
    ADD COLUMN held_template text;

CREATE FUNCTION outbox_relay_measure() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- 'refuse' (INSERT, or an UPDATE of a measured column): the door's limits, and an
    -- error for a row over one. 'mark' (a measurement the relay asked for, of a row stored
    -- before the door): only what provably keeps a row from ever being a record, marked
    -- with a size over every limit. Either way the payload is never printed where it
    -- could print huge.
    refuse constant boolean := TG_ARGV[0] = 'refuse';
    record_limit constant bigint := 1048576;
    payload_limit constant bigint := 1572864;
    header_limit constant bigint := CASE WHEN refuse THEN 65536 ELSE 5 * record_limit END;
    stored integer;
    payload_bytes bigint := 0;
    header_bytes bigint;
    at_column text;
    why text;
BEGIN
    IF TG_OP = 'UPDATE' AND (NEW.topic IS DISTINCT FROM OLD.topic
                             OR NEW.aggregatetype IS DISTINCT FROM OLD.aggregatetype) THEN
        -- re-routed by hand: where it holds its key is not known until a relay resolves it
        NEW.held_topic := '*';
        NEW.held_template := NULL;
    END IF;
    IF refuse THEN
        IF octet_length(NEW.aggregateid) > 1024 THEN
            at_column := 'aggregateid';
            why := format('is %s bytes, over the limit of 1024', octet_length(NEW.aggregateid));
        ELSIF octet_length(NEW.aggregatetype) > 249 THEN
            at_column := 'aggregatetype';
            why := format('is %s bytes, over the limit of 249', octet_length(NEW.aggregatetype));
        ELSIF octet_length(NEW.type) > 1024 THEN
            at_column := 'type';
            why := format('is %s bytes, over the limit of 1024', octet_length(NEW.type));
        ELSIF octet_length(NEW.topic) > 249 THEN
            at_column := 'topic';
            why := format('is %s bytes, over the limit of 249', octet_length(NEW.topic));
        END IF;
    ELSIF octet_length(NEW.aggregateid) > record_limit OR octet_length(NEW.type) > record_limit THEN
        at_column := 'aggregateid';  -- a key (or type) larger than any record
    END IF;

    IF at_column IS NULL THEN
        header_bytes := coalesce(octet_length(NEW.tenant_ref), 0)
            + coalesce(octet_length(NEW.schema_version), 0)
            + coalesce(octet_length(NEW.correlation_ref), 0)
            + coalesce(octet_length(NEW.causation_ref), 0);
        IF NEW.headers IS NOT NULL THEN
            -- an object of strings prints about as long as it is stored: one much
            -- longer is over the limit without being printed
            IF pg_column_size(NEW.headers) > 2 * header_limit THEN
                header_bytes := header_bytes + pg_column_size(NEW.headers);
            ELSE
                header_bytes := header_bytes + octet_length(NEW.headers::text);
            END IF;
        END IF;
        IF header_bytes > header_limit THEN
            at_column := 'headers';
            why := format('with tenant_ref, schema_version, correlation_ref and causation_ref '
                          'is %s bytes, over the limit of %s', header_bytes, header_limit);
        END IF;
    END IF;

    IF at_column IS NULL AND NEW.payload IS NOT NULL THEN
        stored := pg_column_size(NEW.payload);
        IF stored > 4 * payload_limit THEN
            at_column := 'payload';
            why := format('is stored in %s bytes: its text is over the limit of %s',
                          stored, payload_limit);
        ELSIF jsonb_path_exists(NEW.payload,
                'strict $.** ? (@.type() == "number" && (@ >= 1e1000 || @ <= -1e1000'
                ' || (@ != 0 && @ < 1e-1000 && @ > -1e-1000)))') THEN
            at_column := 'payload';
            why := 'holds a number of more than 1000 digits before its decimal point, or '
                   'with more than 1000 zeros after it: over the limit of what a record carries';
        ELSIF stored > 4096 AND (
                SELECT sum(scale(n::numeric))
                FROM jsonb_path_query(NEW.payload, 'strict $.** ? (@.type() == "number")') AS q(n)
              ) > payload_limit THEN
            at_column := 'payload';
            why := format('holds numbers whose decimals print over the limit of %s',
                          payload_limit);
        ELSE
            payload_bytes := octet_length(NEW.payload::text);
            IF payload_bytes > payload_limit THEN
                at_column := 'payload';
                why := format('is %s bytes as text, over the limit of %s',
                              payload_bytes, payload_limit);
            END IF;
        END IF;
    END IF;

    IF at_column IS NOT NULL THEN
        IF refuse THEN
            RAISE EXCEPTION USING
                ERRCODE = 'program_limit_exceeded',
                MESSAGE = format('outbox %s %s', at_column, why),
                COLUMN = at_column,
                TABLE = TG_TABLE_NAME,
                SCHEMA = TG_TABLE_SCHEMA,
                HINT = 'such a row can never become a Kafka record; see the limits in the '
                       'outbox-relay documentation';
        END IF;
        NEW.size_bytes := 2147483647;
        RETURN NEW;
    END IF;
    -- What the relay's fetch transfers of the row: the event id as text and every text
    -- column, the payload and headers as jsonb prints them.
    NEW.size_bytes := 36 + octet_length(NEW.aggregatetype) + octet_length(NEW.aggregateid)
        + octet_length(NEW.type) + payload_bytes + header_bytes
        + coalesce(octet_length(NEW.topic), 0)
        + coalesce(octet_length(NEW.traceparent), 0)
        + coalesce(octet_length(NEW.tracestate), 0);
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_relay_measure
    BEFORE INSERT OR UPDATE OF aggregatetype, aggregateid, type, payload, tenant_ref,
        schema_version, correlation_ref, causation_ref, traceparent, tracestate, headers, topic
    ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_relay_measure('refuse');

CREATE TRIGGER outbox_relay_remeasure
    BEFORE UPDATE OF size_bytes
    ON outbox
    FOR EACH ROW EXECUTE FUNCTION outbox_relay_measure('mark');

-- Nobody calls a trigger function directly; a trigger fires without EXECUTE.
REVOKE EXECUTE ON FUNCTION outbox_relay_measure() FROM PUBLIC;
