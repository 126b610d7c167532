-- What a role that inserts into the outbox can make the database run, and what it can make
-- the relay and the health checks believe.
--
-- Functions resolve the names in their bodies when they run, through the search_path of
-- the session that fired them. A role that may create objects in a schema on that path can
-- put an operator or function there that fits a call better than PostgreSQL's own (bigint
-- || unknown has no exact match in pg_catalog), and it then runs inside every inserting
-- transaction with the inserter's privileges. Each function here pins its search_path to
-- pg_catalog (pg_temp last, where only the session's own objects live) and qualifies what
-- it calls. The NOTIFY payload keeps its format, so a relay of the previous version reads
-- it as before.
--
-- A writer that may name every column can also set created_at: a time in the future makes
-- the outbox family unknown, one in the past makes it stalled. For every role but the
-- table's owner (hand replays, tests) the row's time is the database's own. Only rows whose
-- time lies outside the inserting statement's run reach the function: a defaulted
-- created_at is read from the clock during the statement, so the WHEN test is false for
-- it, and the common insert pays for two clock readings, not a function call.
--
-- completion_outbox counts a row with aggregatetype 'scoring_job' as a terminal job's
-- event. Only a role that may complete scoring jobs (UPDATE of scoring_state, which the
-- writer part holds and its owner has), or the outbox's owner, may insert one; for anyone
-- else, such as the event-writer part, it would be a forged completion.
--
-- A trigger and not row-level security: a policy applies to every statement of every
-- role but the owner, the relay's fetch and delete included, COPY FROM is refused for a
-- role under one, and the roles to scope it to are the operator's, not the migration's.
-- The trigger fires on INSERT only, and calls its function only for the rows above.
--
-- CREATE TRIGGER takes a lock that waits for open writers and makes new ones wait behind
-- it: give up quickly rather than hold writers up (migrate again to retry).
SET LOCAL lock_timeout = '2s';

CREATE OR REPLACE FUNCTION outbox_relay_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lowest  bigint;
    highest bigint;
BEGIN
    SELECT pg_catalog.min(seq), pg_catalog.max(seq) INTO lowest, highest
    FROM outbox_relay_inserted;
    IF lowest IS NOT NULL THEN  -- an INSERT of no rows has nothing to announce
        PERFORM pg_catalog.pg_notify('outbox_relay', pg_catalog.concat_ws(',', lowest, highest));
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION outbox_relay_guard_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_catalog.pg_has_role(
        (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID),
        'USAGE'
    ) THEN
        RETURN NEW;
    END IF;
    IF NEW.aggregatetype OPERATOR(pg_catalog.=) 'scoring_job' AND NOT pg_catalog.has_column_privilege(
        pg_catalog.format('%I.scoring_job_state', TG_TABLE_SCHEMA), 'scoring_state', 'UPDATE'
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = 'permission denied to insert a scoring_job event into the outbox',
            HINT = 'only a role that may complete scoring jobs writes their events';
    END IF;
    NEW.created_at := pg_catalog.clock_timestamp();
    RETURN NEW;
END
$$;

CREATE TRIGGER outbox_relay_guard_insert
    BEFORE INSERT ON outbox
    FOR EACH ROW
    WHEN (NEW.aggregatetype OPERATOR(pg_catalog.=) 'scoring_job'
          OR NEW.created_at OPERATOR(pg_catalog.<) pg_catalog.statement_timestamp()
          OR NEW.created_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
    EXECUTE FUNCTION outbox_relay_guard_insert();

-- Nobody calls a trigger function directly; a trigger fires without EXECUTE.
REVOKE EXECUTE ON FUNCTION outbox_relay_guard_insert() FROM PUBLIC;
