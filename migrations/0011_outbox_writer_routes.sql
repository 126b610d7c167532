-- Ids and routes belong to their owners, decided at the door.
--
-- A writer chooses a row's id, its aggregatetype and its own topic. What another
-- application could take from its owner that way:
-- - the scoring writer's ids: a scoring event's id is a version-8 UUID derived from the
--   job and its outcome (scoring/event_id.py), from public data. A writer that inserted
--   one first made the job's completion a conflicting replay, and the job stayed leased
--   for good. Only a role that may complete scoring jobs (or the table's owner) may insert
--   a version-8 id;
-- - another application's topics: a role may be given the aggregatetypes it writes (rows
--   routed by the relay's template) and the prefixes its own topics start with (rows with a
--   topic of their own), in outbox_relay_writer_route, written by `grant --to ROLE
--   --as event-writer --route-aggregatetype … --route-topic-prefix …`; a row of a role
--   that has routes, or of a member of such a role, is refused unless it keeps to them. A
--   role without routes, the table's owner and superusers keep every route.
-- (A published event's id taken by a row with other content is the relay's to find: it
-- quarantines such a row as duplicate_id, relay/sql.py.)
--
-- Checked once per inserting statement, over the rows it inserted, by the statement
-- trigger that already announces them: a statement of a thousand rows pays once. The
-- routes are read through a SECURITY DEFINER function (a writer may not read the table;
-- EXECUTE stays with PUBLIC, so a writer of the previous release keeps inserting before
-- `grant` runs again, and it answers no more than an INSERT would). The notification's
-- payload keeps its format, so a relay of the previous release reads it as before.
SET LOCAL lock_timeout = '1s';

CREATE TABLE outbox_relay_writer_route (
    writer         regrole NOT NULL,
    aggregatetypes text[]  NOT NULL,
    topic_prefixes text[]  NOT NULL,
    CONSTRAINT outbox_relay_writer_route_pkey PRIMARY KEY (writer)
);

-- The routes of the inserting role (current_user of the INSERT, who): every route of the
-- roles it is a member of; restricted is false for a role without any, the table's owner
-- and a superuser.
CREATE FUNCTION outbox_relay_writer_routes(
    who name, OUT restricted boolean, OUT aggregatetypes text[], OUT topic_prefixes text[]
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    restricted := false;
    IF pg_catalog.pg_has_role(
            who, (SELECT c.relowner FROM pg_catalog.pg_class c
                  WHERE c.oid OPERATOR(pg_catalog.=) 'outbox'::pg_catalog.regclass), 'USAGE')
       OR (SELECT r.rolsuper FROM pg_catalog.pg_roles r
           WHERE r.rolname OPERATOR(pg_catalog.=) who) THEN
        RETURN;
    END IF;
    SELECT pg_catalog.count(*) OPERATOR(pg_catalog.>) 0,
           coalesce(pg_catalog.array_agg(DISTINCT t.aggregatetype)
                        FILTER (WHERE t.aggregatetype IS NOT NULL), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.prefix)
                        FILTER (WHERE p.prefix IS NOT NULL), '{}')
    INTO restricted, aggregatetypes, topic_prefixes
    FROM outbox_relay_writer_route w
    LEFT JOIN LATERAL pg_catalog.unnest(w.aggregatetypes) AS t(aggregatetype) ON true
    LEFT JOIN LATERAL pg_catalog.unnest(w.topic_prefixes) AS p(prefix) ON true
    WHERE pg_catalog.pg_has_role(who, w.writer::pg_catalog.oid, 'MEMBER');
END
$$;

CREATE OR REPLACE FUNCTION outbox_relay_notify() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    lowest  bigint;
    highest bigint;
    routes  record;
    outside record;
BEGIN
    SELECT pg_catalog.min(seq), pg_catalog.max(seq) INTO lowest, highest
    FROM outbox_relay_inserted;
    IF lowest IS NULL THEN  -- an INSERT of no rows has nothing to announce
        RETURN NULL;
    END IF;
    IF EXISTS (SELECT 1 FROM outbox_relay_inserted i
               WHERE pg_catalog.substr(i.id::text, 15, 1) OPERATOR(pg_catalog.=) '8')
       AND NOT pg_catalog.pg_has_role(
               (SELECT c.relowner FROM pg_catalog.pg_class c
                WHERE c.oid OPERATOR(pg_catalog.=) TG_RELID), 'USAGE')
       AND NOT pg_catalog.has_column_privilege(
               pg_catalog.format('%I.scoring_job_state', TG_TABLE_SCHEMA), 'scoring_state',
               'UPDATE') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = 'permission denied to insert an outbox id of version 8',
            COLUMN = 'id', TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
            HINT = 'version-8 ids are the scoring writer''s; leave id to its default';
    END IF;
    routes := outbox_relay_writer_routes(current_user);
    IF routes.restricted THEN
        SELECT i.aggregatetype, i.topic INTO outside
        FROM outbox_relay_inserted i
        WHERE CASE WHEN i.topic IS NULL  -- routed by the template: by its aggregatetype
                   THEN NOT coalesce(
                       i.aggregatetype OPERATOR(pg_catalog.=) ANY (routes.aggregatetypes),
                       false)
                   ELSE NOT EXISTS (
                       SELECT 1 FROM pg_catalog.unnest(routes.topic_prefixes) AS p(prefix)
                       WHERE pg_catalog.starts_with(i.topic, p.prefix))
              END
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format(
                    'permission denied to route an outbox row of aggregatetype %L%s',
                    outside.aggregatetype,
                    CASE WHEN outside.topic IS NULL THEN ''
                         ELSE pg_catalog.format(' to topic %L', outside.topic) END),
                COLUMN = CASE WHEN outside.topic IS NULL THEN 'aggregatetype' ELSE 'topic' END,
                TABLE = TG_TABLE_NAME, SCHEMA = TG_TABLE_SCHEMA,
                HINT = 'the role''s routes are given by outbox-relay grant --as event-writer';
        END IF;
    END IF;
    PERFORM pg_catalog.pg_notify('outbox_relay', pg_catalog.concat_ws(',', lowest, highest));
    RETURN NULL;
END
$$;

-- The table and the function these name are this schema's: found here, after pg_catalog
-- (every call there is written exactly) and before any temporary object.
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER FUNCTION outbox_relay_writer_routes(name) '
        'SET search_path = pg_catalog, %1$I, pg_temp; '
        'ALTER FUNCTION outbox_relay_notify() SET search_path = pg_catalog, %1$I, pg_temp',
        pg_catalog.current_schema());
END
$$;
