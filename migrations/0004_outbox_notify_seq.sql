-- The NOTIFY says which rows the inserting statement wrote: '<lowest seq>,<highest seq>'.
--
-- seq is taken at INSERT, not at COMMIT, so with concurrent writers a transaction can
-- commit rows below seqs the relay has already read. The relay starts a light-load fetch
-- from where it stopped instead of from the beginning of the outbox (whose index still
-- holds the entries of published rows until vacuum), and goes back to the lowest seq it
-- is told of, so a late commit is fetched at once. The highest seq tells it which
-- committed rows it has heard of (docs/relay.md, "Fetching: passes"). The notification is
-- still delivered only at commit, and a relay that finds no payload it understands makes
-- a full pass, as before.
--
-- The function keeps its name and owner, so its grants (none) stay as they are.
CREATE OR REPLACE FUNCTION outbox_relay_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    lowest  bigint;
    highest bigint;
BEGIN
    SELECT min(seq), max(seq) INTO lowest, highest FROM outbox_relay_inserted;
    IF lowest IS NOT NULL THEN  -- an INSERT of no rows has nothing to announce
        PERFORM pg_notify('outbox_relay', lowest || ',' || highest);
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER outbox_relay_notify ON outbox;
CREATE TRIGGER outbox_relay_notify
    AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS outbox_relay_inserted
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_relay_notify();
