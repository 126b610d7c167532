-- The four operations that write a scoring job's terminal event, as SQL functions any client
-- calls inside its own transaction (docs/writer.md, "From any language"):
--
--   outbox_relay_complete_job          complete a leased job, enqueue scoring.result.completed
--   outbox_relay_fail_job_permanently  quarantine a leased job, enqueue scoring.job.failed
--   outbox_relay_fail_retryable        schedule a retry, or quarantine when the budget is spent
--   outbox_relay_expire_leases         end expired leases: retry, or quarantine with the event
--
-- One implementation of the rules: the Python writer calls these, so a Rust worker and a
-- Python one write the same rows. Each returns rows of outbox_relay_outcome; a refusal is a
-- row with a stable code (refusal) and writes nothing, so the caller's transaction stays
-- usable. Only a conflicting replay found after the transition was written raises (SQLSTATE
-- OR001) and so aborts the transaction: the job must never be terminal without its event.
--
-- SECURITY DEFINER, owned by the NOLOGIN role outbox_relay_scoring_functions, which holds
-- exactly the writer part (migrations/grants.py): a caller needs EXECUTE and nothing else
-- (`grant --as scoring-worker`). Every function pins search_path to pg_catalog, pg_temp and
-- qualifies what it calls, so nothing another role creates runs inside them; tables are
-- named with their schema (written @schema@ below and filled in when this file runs), so a
-- caller's temporary table of the same name is never the one written. EXECUTE is taken from
-- PUBLIC. The helpers are not SECURITY DEFINER: only the four call them, as their owner.
--
-- The event's payload is canonicalised (RFC 8785) and digested here, from the jsonb the
-- caller passes, so no client needs a canonicaliser of its own and none can diverge: the
-- stored payload is the canonical text, whatever spelling and key order the caller sent.
--
-- Where scoring_job_state already exists and belongs to the scoring service, this migration
-- cannot grant the functions' owner its privileges on it: the table's owner runs the GRANT
-- that docs/operations.md ("The scoring functions' owner") shows. Until then the functions
-- fail with 42501 on that table, and nothing is written.
SET LOCAL lock_timeout = '1s';

DO $migration$
DECLARE
    definer CONSTANT text := 'outbox_relay_scoring_functions';
    me CONSTANT text := current_user;
    server_version CONSTANT integer := pg_catalog.current_setting('server_version_num')::integer;
    schema_oid oid;
    schema_name text;
    schema_owner oid;
    superuser boolean;
    may_create_roles boolean;
    found_role pg_catalog.pg_roles%ROWTYPE;
    lent_create boolean := false;
    ddl text;
    signature text;
BEGIN
    SELECT c.relnamespace, n.nspname, n.nspowner INTO schema_oid, schema_name, schema_owner
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = pg_catalog.to_regclass('outbox');
    SELECT r.rolsuper, r.rolcreaterole INTO superuser, may_create_roles
    FROM pg_catalog.pg_roles r WHERE r.rolname = me;

    -- The owner of the functions: a role nobody logs in as, holding only the writer part.
    SELECT * INTO found_role FROM pg_catalog.pg_roles r WHERE r.rolname = definer;
    IF NOT FOUND THEN
        IF NOT (superuser OR may_create_roles) THEN
            RAISE EXCEPTION USING
                ERRCODE = 'insufficient_privilege',
                MESSAGE = pg_catalog.format(
                    'the scoring functions are owned by role %I, which does not exist and '
                    'which role %I may not create; a superuser runs once: CREATE ROLE %I '
                    'NOLOGIN; GRANT %I TO %I', definer, me, definer, definer, me);
        END IF;
        BEGIN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', definer);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;  -- roles are the cluster's: another database's migrate made it meanwhile
        END;
    ELSIF found_role.rolcanlogin OR found_role.rolsuper OR found_role.rolcreaterole
          OR found_role.rolcreatedb OR found_role.rolreplication OR found_role.rolbypassrls THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = pg_catalog.format(
                'role %I exists but is not a plain NOLOGIN role; the scoring functions run '
                'with its privileges, so it must hold nothing but what migrate grants it',
                definer);
    END IF;

    -- Handing a function to another owner needs membership in it and, for that owner,
    -- CREATE on the schema (only while this runs). A superuser needs neither.
    IF NOT superuser THEN
        IF NOT pg_catalog.pg_has_role(me, definer,
                                      CASE WHEN server_version >= 160000 THEN 'SET' ELSE 'MEMBER' END) THEN
            IF may_create_roles THEN
                EXECUTE pg_catalog.format('GRANT %I TO %I', definer, me);
            ELSE
                RAISE EXCEPTION USING
                    ERRCODE = 'insufficient_privilege',
                    MESSAGE = pg_catalog.format(
                        'role %I must be a member of %I to hand it the scoring functions; '
                        'a superuser runs once: GRANT %I TO %I', me, definer, definer, me);
            END IF;
        END IF;
        IF NOT pg_catalog.has_schema_privilege(definer, schema_oid, 'CREATE') THEN
            IF pg_catalog.pg_has_role(me, schema_owner, 'USAGE')
               OR pg_catalog.has_schema_privilege(me, schema_oid, 'CREATE WITH GRANT OPTION') THEN
                EXECUTE pg_catalog.format('GRANT CREATE ON SCHEMA %I TO %I', schema_name, definer);
                lent_create := true;
            ELSE
                RAISE EXCEPTION USING
                    ERRCODE = 'insufficient_privilege',
                    MESSAGE = pg_catalog.format(
                        'role %I may not own functions in schema %I; its owner runs: GRANT '
                        'CREATE ON SCHEMA %I TO %I (migrate then runs again)',
                        definer, schema_name, schema_name, definer);
            END IF;
        END IF;
    END IF;

    -- The writer part, on the tables this role may grant on. scoring_job_state is the
    -- scoring service's where it created it: then its owner grants (docs/operations.md).
    IF NOT pg_catalog.has_schema_privilege(definer, schema_oid, 'USAGE') THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %I', schema_name, definer);
    END IF;
    EXECUTE pg_catalog.format('GRANT SELECT, INSERT ON TABLE %I.outbox TO %I', schema_name, definer);
    EXECUTE pg_catalog.format('GRANT SELECT ON TABLE %I.outbox_receipt TO %I', schema_name, definer);
    IF pg_catalog.pg_has_role(me, (SELECT c.relowner FROM pg_catalog.pg_class c
                                   WHERE c.oid = pg_catalog.to_regclass(
                                       pg_catalog.format('%I.scoring_job_state', schema_name))),
                              'USAGE') THEN
        EXECUTE pg_catalog.format(
            'GRANT SELECT, UPDATE (scoring_state, attempt_count, next_attempt_at_unix_ms, '
            'last_failure_code, active_worker_ref, active_lease_ref, active_fencing_token, '
            'active_lease_expires_at_unix_ms, result_ref, completed_fencing_token, updated_at) '
            'ON TABLE %I.scoring_job_state TO %I', schema_name, definer);
    END IF;

    FOREACH ddl IN ARRAY ARRAY[
-- The result of every function: what happened to the job, and to its event.
$ddl$
CREATE TYPE @schema@.outbox_relay_outcome AS (
    job_ref                 text,
    -- completed | quarantined | duplicate | retry_scheduled | retry_duplicate |
    -- rescheduled | needs_event_details | refused
    outcome                 text,
    enqueue                 text,      -- inserted | duplicate, when the outcome has an event
    event_id                uuid,
    occurred_at_unix_ms     bigint,    -- the terminal transition's time (database clock)
    next_attempt_at_unix_ms bigint,    -- retry_scheduled, retry_duplicate, rescheduled
    refusal                 text,      -- the stable code when outcome is 'refused'
    refusal_field           text,      -- the argument refused, for the invalid_* codes
    refusal_message         text,
    refusal_detail          jsonb      -- state, given/current, expired_at/now, size/limit
)
$ddl$,
-- An event checked in full before any write, but for the time the transition stamps on it.
$ddl$
CREATE TYPE @schema@.outbox_relay_event AS (
    refusal         text,
    refusal_field   text,
    refusal_message text,
    refusal_detail  jsonb,
    event_id        uuid,
    job_ref         text,
    event_type      text,
    data            text,      -- the canonical text of the event's data
    payload_digest  text,
    source          text,
    tenant_ref      text,
    correlation_ref text,
    causation_ref   text,
    schema_version  text,
    traceparent     text,
    tracestate      text,
    -- the envelope's canonical text before and after its occurred_at_unix_ms value
    envelope_head   text,
    envelope_tail   text
)
$ddl$,
-- -- helpers ----------------------------------------------------------------------------------
-- A ref as the scoring service's CHECKs take it ('ref': trimmed of spaces, non-empty, not
-- numeric-looking; also no control characters), or a machine token ('token': non-empty, no
-- whitespace or control characters, at most max_bytes): NULL, or what is wrong with it.
-- Whitespace is spelled out rather than left to the database's locale.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_text_problem(value text, rule text, max_bytes integer)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT CASE
            WHEN rule OPERATOR(pg_catalog.=) 'ref'::text THEN CASE
                WHEN value OPERATOR(pg_catalog.=) ''::text THEN 'must not be empty'
                WHEN pg_catalog.btrim(value, ' '::text) OPERATOR(pg_catalog.<>) value
                    THEN 'must not start or end with a space'
                WHEN value OPERATOR(pg_catalog.~) '[\x01-\x1f\x7f]'::text
                    THEN 'must not contain control characters'
                WHEN value OPERATOR(pg_catalog.~) '^[0-9+,.eE-]+$'::text
                     AND value OPERATOR(pg_catalog.~) '[0-9]'::text
                    THEN pg_catalog.format('must not look like a number (%L)', value)
            END
            WHEN value OPERATOR(pg_catalog.=) ''::text
                 OR value OPERATOR(pg_catalog.~)
                    '[\x01-\x20\x7f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]'::text
                THEN 'must be non-empty, without whitespace or control characters'
            WHEN pg_catalog.octet_length(value) OPERATOR(pg_catalog.>) max_bytes
                THEN pg_catalog.format('is %s bytes, at most %s allowed',
                                       pg_catalog.octet_length(value), max_bytes)
        END
    );
END
$fn$
$ddl$,
-- RFC 8785 (JSON Canonicalization Scheme) text of a jsonb value, or NULL when a number in it
-- is not one an IEEE-754 double carries exactly as given, or it nests deeper than 64 levels
-- (outbox_relay_json_problem says where). Numbers print as ECMAScript prints a double
-- (shortest round trip; exponent outside 1e-6 .. 1e21); object members are sorted by their
-- names' UTF-16 code units; strings escape as jsonb escapes them, which is JCS's rule.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_json_canonical(value jsonb, depth integer DEFAULT 0)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
-- float8 text is the shortest that round-trips only while this is positive
SET extra_float_digits = 1
AS $fn$
DECLARE
    kind CONSTANT text := pg_catalog.jsonb_typeof(value);
    parts text;
    missing bigint;
    n numeric;
    shortest text;
    negative boolean;
    mantissa text;
    exponent integer;
    whole text;
    digits text;
    point integer;
    k integer;
    rounded numeric;
    candidate numeric;
    shortest_j integer;
    shortest_rounded numeric;
    printed text;
BEGIN
    IF kind OPERATOR(pg_catalog.=) 'object'::text OR kind OPERATOR(pg_catalog.=) 'array'::text THEN
        IF depth OPERATOR(pg_catalog.>=) 64 THEN
            RETURN NULL;
        END IF;
        IF kind OPERATOR(pg_catalog.=) 'object'::text THEN
            SELECT pg_catalog.string_agg(
                       pg_catalog.to_json(m.key)::text OPERATOR(pg_catalog.||) ':'::text
                           OPERATOR(pg_catalog.||) m.canonical,
                       ','::text
                       ORDER BY CASE
                           -- UTF-16 order differs from UTF-8's only for U+E000..U+FFFF, which
                           -- sort after the supplementary planes' surrogates: their lead
                           -- bytes (EE, EF) move above the supplementary ones (F0..F4).
                           WHEN m.key OPERATOR(pg_catalog.~) '[\uE000-\uFFFF]'::text THEN (
                               SELECT pg_catalog.string_agg(
                                          CASE WHEN pg_catalog.ascii(ch) OPERATOR(pg_catalog.>=) 57344
                                                    AND pg_catalog.ascii(ch) OPERATOR(pg_catalog.<=) 65535
                                               THEN pg_catalog.set_byte(
                                                        pg_catalog.convert_to(ch, 'UTF8'::name), 0,
                                                        pg_catalog.get_byte(pg_catalog.convert_to(ch, 'UTF8'::name), 0)
                                                            OPERATOR(pg_catalog.+) 7)
                                               ELSE pg_catalog.convert_to(ch, 'UTF8'::name)
                                          END,
                                          ''::bytea ORDER BY s.i)
                               FROM pg_catalog.regexp_split_to_table(m.key, ''::text)
                                    WITH ORDINALITY AS s (ch, i))
                           ELSE pg_catalog.convert_to(m.key, 'UTF8'::name)
                       END),
                   pg_catalog.count(*) FILTER (WHERE m.canonical IS NULL)
            INTO parts, missing
            FROM (
                SELECT e.key,
                       CASE WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=)
                                 ANY ('{string,boolean,null}'::text[])
                            THEN e.value::text
                            ELSE @schema@.outbox_relay_json_canonical(e.value, depth OPERATOR(pg_catalog.+) 1)
                       END AS canonical
                FROM pg_catalog.jsonb_each(value) AS e
                OFFSET 0  -- each member once: two aggregates read it, and may not re-run it
            ) AS m;
            IF missing OPERATOR(pg_catalog.>) 0 THEN
                RETURN NULL;
            END IF;
            RETURN '{'::text OPERATOR(pg_catalog.||) coalesce(parts, ''::text)
                   OPERATOR(pg_catalog.||) '}'::text;
        END IF;
        SELECT pg_catalog.string_agg(a.canonical, ','::text ORDER BY a.i),
               pg_catalog.count(*) FILTER (WHERE a.canonical IS NULL)
        INTO parts, missing
        FROM (
            SELECT e.i,
                   CASE WHEN pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.=)
                             ANY ('{string,boolean,null}'::text[])
                        THEN e.value::text
                        ELSE @schema@.outbox_relay_json_canonical(e.value, depth OPERATOR(pg_catalog.+) 1)
                   END AS canonical
            FROM pg_catalog.jsonb_array_elements(value) WITH ORDINALITY AS e (value, i)
            OFFSET 0  -- each element once: two aggregates read it, and may not re-run it
        ) AS a;
        IF missing OPERATOR(pg_catalog.>) 0 THEN
            RETURN NULL;
        END IF;
        RETURN '['::text OPERATOR(pg_catalog.||) coalesce(parts, ''::text)
               OPERATOR(pg_catalog.||) ']'::text;
    END IF;
    IF kind OPERATOR(pg_catalog.<>) 'number'::text THEN
        RETURN value::text;
    END IF;
    n := value::numeric;
    -- Beyond a double's range (the conversion below would fail): never carried.
    IF pg_catalog.abs(n) OPERATOR(pg_catalog.>) 1.7976931348623157e308::numeric
       OR (n OPERATOR(pg_catalog.<>) 0::numeric
           AND pg_catalog.abs(n) OPERATOR(pg_catalog.<) 4.9406564584124654e-324::numeric) THEN
        RETURN NULL;
    END IF;
    IF n OPERATOR(pg_catalog.=) 0::numeric THEN
        RETURN '0';
    END IF;
    -- An integer a double holds exactly prints as its digits.
    IF n OPERATOR(pg_catalog.=) pg_catalog.trunc(n)
       AND pg_catalog.abs(n) OPERATOR(pg_catalog.<=) 9007199254740991::numeric THEN
        RETURN pg_catalog.trunc(n)::text;
    END IF;
    -- The double's shortest digits and exponent, laid out as ECMAScript's Number::toString.
    shortest := n::double precision::text;
    negative := pg_catalog.left(shortest, 1) OPERATOR(pg_catalog.=) '-'::text;
    shortest := pg_catalog.ltrim(shortest, '-'::text);
    mantissa := pg_catalog.split_part(shortest, 'e'::text, 1);
    exponent := CASE WHEN pg_catalog.strpos(shortest, 'e'::text) OPERATOR(pg_catalog.>) 0
                     THEN pg_catalog.split_part(shortest, 'e'::text, 2)::integer ELSE 0 END;
    whole := pg_catalog.split_part(mantissa, '.'::text, 1);
    digits := whole OPERATOR(pg_catalog.||) pg_catalog.split_part(mantissa, '.'::text, 2);
    -- point: where the decimal point goes, counted from the first significant digit
    point := pg_catalog.length(whole) OPERATOR(pg_catalog.+) exponent
             OPERATOR(pg_catalog.-) (pg_catalog.length(digits)
                                     OPERATOR(pg_catalog.-) pg_catalog.length(pg_catalog.ltrim(digits, '0'::text)));
    digits := pg_catalog.rtrim(pg_catalog.ltrim(digits, '0'::text), '0'::text);
    k := pg_catalog.length(digits);
    -- PostgreSQL's shortest output leaves out the ends of a double's rounding interval, where
    -- ECMAScript takes them: the double nearest 1e23 prints as 9.999999999999999e+22 here,
    -- 1e+23 there. Only output of 16 or more digits can have a shorter such end, and then
    -- every rounding between it and the output reads back as the double too: when one digit
    -- fewer does, find the fewest that do.
    IF k OPERATOR(pg_catalog.>=) 16 THEN
        FOR j IN REVERSE k OPERATOR(pg_catalog.-) 1 .. 1 LOOP
            rounded := pg_catalog.left(digits, j)::numeric OPERATOR(pg_catalog.+)
                       CASE WHEN pg_catalog.ascii(pg_catalog.substr(digits, j OPERATOR(pg_catalog.+) 1, 1))
                                 OPERATOR(pg_catalog.>=) 53  -- '5'
                            THEN 1::numeric ELSE 0::numeric END;
            candidate := (rounded::text OPERATOR(pg_catalog.||) 'e'::text
                          OPERATOR(pg_catalog.||) (point OPERATOR(pg_catalog.-) j)::text)::numeric;
            EXIT WHEN candidate OPERATOR(pg_catalog.>) 1.7976931348623157e308::numeric
                      OR candidate::double precision OPERATOR(pg_catalog.<>) pg_catalog.abs(n)::double precision;
            shortest_j := j;
            shortest_rounded := rounded;
        END LOOP;
        IF shortest_j IS NOT NULL THEN
            -- rounding up may carry into one more digit (9.99… to 10)
            point := point OPERATOR(pg_catalog.+) pg_catalog.length(shortest_rounded::text)
                     OPERATOR(pg_catalog.-) shortest_j;
            digits := pg_catalog.rtrim(shortest_rounded::text, '0'::text);
            k := pg_catalog.length(digits);
        END IF;
    END IF;
    IF k OPERATOR(pg_catalog.<=) point AND point OPERATOR(pg_catalog.<=) 21 THEN
        printed := digits OPERATOR(pg_catalog.||) pg_catalog.repeat('0'::text, point OPERATOR(pg_catalog.-) k);
    ELSIF 0 OPERATOR(pg_catalog.<) point AND point OPERATOR(pg_catalog.<=) 21 THEN
        printed := pg_catalog.left(digits, point) OPERATOR(pg_catalog.||) '.'::text
                   OPERATOR(pg_catalog.||) pg_catalog.substr(digits, point OPERATOR(pg_catalog.+) 1);
    ELSIF -6 OPERATOR(pg_catalog.<) point AND point OPERATOR(pg_catalog.<=) 0 THEN
        printed := '0.'::text OPERATOR(pg_catalog.||) pg_catalog.repeat('0'::text, OPERATOR(pg_catalog.-) point)
                   OPERATOR(pg_catalog.||) digits;
    ELSE
        printed := CASE WHEN k OPERATOR(pg_catalog.=) 1 THEN digits
                        ELSE pg_catalog.left(digits, 1) OPERATOR(pg_catalog.||) '.'::text
                             OPERATOR(pg_catalog.||) pg_catalog.substr(digits, 2)
                   END
                   OPERATOR(pg_catalog.||) CASE WHEN point OPERATOR(pg_catalog.>=) 1 THEN 'e+'::text ELSE 'e-'::text END
                   OPERATOR(pg_catalog.||) pg_catalog.abs(point OPERATOR(pg_catalog.-) 1)::text;
    END IF;
    IF negative THEN
        printed := '-'::text OPERATOR(pg_catalog.||) printed;
    END IF;
    -- A number written with other digits than a double prints (2^53 + 1, 3.14159265358979323846)
    -- would reach a consumer as another number than the one written: refused, not rounded.
    -- Either shortest form is taken: ECMAScript's, and PostgreSQL's own float8 text, which
    -- is how a payload built from a float8 in SQL spells it.
    IF printed::numeric OPERATOR(pg_catalog.<>) n
       AND n::double precision::text::numeric OPERATOR(pg_catalog.<>) n THEN
        RETURN NULL;
    END IF;
    RETURN printed;
END
$fn$
$ddl$,
-- Where outbox_relay_json_canonical gave up, and why: {path, problem}, or NULL.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_json_problem(value jsonb, path text, depth integer DEFAULT 0)
RETURNS text[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $fn$
DECLARE
    kind CONSTANT text := pg_catalog.jsonb_typeof(value);
    member record;
    inner_problem text[];
BEGIN
    IF kind OPERATOR(pg_catalog.=) 'number'::text THEN
        IF @schema@.outbox_relay_json_canonical(value) IS NOT NULL THEN
            RETURN NULL;
        END IF;
        IF pg_catalog.abs(value::numeric) OPERATOR(pg_catalog.>) 1.7976931348623157e308::numeric
           OR pg_catalog.abs(value::numeric) OPERATOR(pg_catalog.<) 4.9406564584124654e-324::numeric THEN
            RETURN ARRAY[path, 'is beyond the range of an IEEE-754 double; send it as a string'];
        END IF;
        RETURN ARRAY[path, 'a JSON consumer reads it as a double, which does not hold this number '
                           'exactly (only integers within ±(2**53 - 1) and numbers as a double '
                           'prints them are carried); send it as a string'];
    END IF;
    IF kind OPERATOR(pg_catalog.<>) 'object'::text AND kind OPERATOR(pg_catalog.<>) 'array'::text THEN
        RETURN NULL;
    END IF;
    IF depth OPERATOR(pg_catalog.>=) 64 THEN
        RETURN ARRAY[path, 'nests deeper than 64 levels'];
    END IF;
    IF kind OPERATOR(pg_catalog.=) 'object'::text THEN
        FOR member IN SELECT e.key, e.value FROM pg_catalog.jsonb_each(value) AS e LOOP
            inner_problem := @schema@.outbox_relay_json_problem(
                member.value, path OPERATOR(pg_catalog.||) '.'::text OPERATOR(pg_catalog.||) member.key,
                depth OPERATOR(pg_catalog.+) 1);
            IF inner_problem IS NOT NULL THEN
                RETURN inner_problem;
            END IF;
        END LOOP;
    ELSE
        FOR member IN
            SELECT e.value, e.i FROM pg_catalog.jsonb_array_elements(value) WITH ORDINALITY AS e (value, i)
        LOOP
            inner_problem := @schema@.outbox_relay_json_problem(
                member.value,
                path OPERATOR(pg_catalog.||) '['::text
                    OPERATOR(pg_catalog.||) (member.i OPERATOR(pg_catalog.-) 1)::text
                    OPERATOR(pg_catalog.||) ']'::text,
                depth OPERATOR(pg_catalog.+) 1);
            IF inner_problem IS NOT NULL THEN
                RETURN inner_problem;
            END IF;
        END LOOP;
    END IF;
    RETURN NULL;
END
$fn$
$ddl$,
-- The id of a job's terminal event, derived only from the job and its outcome: the first 16
-- bytes of SHA-256 over field(domain) || field(job_ref) || field(kind) || field(outcome_ref),
-- field(x) = 8-byte big-endian length of UTF-8(x) || UTF-8(x); version 8, RFC 9562 variant.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_terminal_event_id(job_ref text, kind text, outcome_ref text)
RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT pg_catalog.encode(
                   pg_catalog.set_byte(
                       pg_catalog.set_byte(h.bytes, 6,
                           (pg_catalog.get_byte(h.bytes, 6) OPERATOR(pg_catalog.&) 15) OPERATOR(pg_catalog.|) 128),
                       8, (pg_catalog.get_byte(h.bytes, 8) OPERATOR(pg_catalog.&) 63) OPERATOR(pg_catalog.|) 128),
                   'hex'::text)::uuid
        FROM (
            SELECT pg_catalog.substring(pg_catalog.sha256(pg_catalog.string_agg(
                       pg_catalog.int8send(pg_catalog.octet_length(pg_catalog.convert_to(f.field, 'UTF8'::name))::bigint)
                           OPERATOR(pg_catalog.||) pg_catalog.convert_to(f.field, 'UTF8'::name),
                       ''::bytea ORDER BY f.i)), 1, 16) AS bytes
            FROM pg_catalog.unnest(ARRAY['outbox-relay/scoring-terminal-event/v1'::text, job_ref, kind, outcome_ref])
                 WITH ORDINALITY AS f (field, i)
        ) AS h
    );
END
$fn$
$ddl$,
-- Everything about a job's terminal event that can be checked before any write, and the
-- event itself but for its time: a row with refusal set, or the event ready to write.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_prepare_event(
    kind text, job_ref text, outcome_ref text, body jsonb, source text, tenant_ref text,
    correlation_ref text, schema_version text, causation_ref text, event_type text,
    traceparent text, tracestate text, event_id uuid, max_event_bytes bigint)
RETURNS @schema@.outbox_relay_event
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $fn$
DECLARE
    e @schema@.outbox_relay_event;
    -- a terminal time has 13 digits until the year 2286: the size is taken with the widest
    placeholder CONSTANT bigint := 9999999999999;
    data jsonb;
    problem text[];
    checked_field text;
    checked_value text;
    size bigint;
    header_bytes bigint;
BEGIN
    e.job_ref := job_ref;
    e.event_id := @schema@.outbox_relay_terminal_event_id(job_ref, kind, outcome_ref);
    IF event_id IS NOT NULL AND event_id OPERATOR(pg_catalog.<>) e.event_id THEN
        e.refusal := 'event_id_mismatch';
        e.refusal_field := 'event_id';
        e.refusal_message := pg_catalog.format(
            'event_id %s differs from the id derived from the job and its outcome (%s); a '
            'different id would publish a second event', event_id, e.event_id);
        RETURN e;
    END IF;
    e.refusal := 'invalid_envelope';
    IF traceparent IS NOT NULL AND (
           traceparent OPERATOR(pg_catalog.!~) '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text
           OR pg_catalog.left(traceparent, 2) OPERATOR(pg_catalog.=) 'ff'::text
           OR pg_catalog.substr(traceparent, 4, 32) OPERATOR(pg_catalog.=) pg_catalog.repeat('0'::text, 32)
           OR pg_catalog.substr(traceparent, 37, 16) OPERATOR(pg_catalog.=) pg_catalog.repeat('0'::text, 16)) THEN
        e.refusal_field := 'traceparent';
        e.refusal_message := 'traceparent: must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)';
        RETURN e;
    END IF;
    IF tracestate IS NOT NULL AND traceparent IS NULL THEN
        e.refusal_field := 'tracestate';
        e.refusal_message := 'tracestate: needs a traceparent';
        RETURN e;
    END IF;
    IF tracestate IS NOT NULL AND (
           pg_catalog.octet_length(tracestate) OPERATOR(pg_catalog.>) 512
           OR tracestate OPERATOR(pg_catalog.!~) '^[ -~]*$'::text) THEN
        e.refusal_field := 'tracestate';
        e.refusal_message := 'tracestate: must be at most 512 characters of printable ASCII';
        RETURN e;
    END IF;

    IF kind OPERATOR(pg_catalog.=) 'completed'::text THEN
        data := pg_catalog.jsonb_build_object(
            'outcome'::text, kind, 'scoring_job_ref'::text, job_ref, 'result_ref'::text, outcome_ref,
            'result'::text, coalesce(body, 'null'::jsonb));
    ELSE
        data := pg_catalog.jsonb_build_object(
            'outcome'::text, kind, 'scoring_job_ref'::text, job_ref, 'cause_code'::text, outcome_ref,
            'detail'::text, coalesce(body, 'null'::jsonb));
    END IF;
    e.data := @schema@.outbox_relay_json_canonical(data);
    IF e.data IS NULL THEN
        problem := @schema@.outbox_relay_json_problem(data, 'payload'::text);
        e.refusal_field := problem[1];
        e.refusal_message := problem[1] OPERATOR(pg_catalog.||) ': '::text OPERATOR(pg_catalog.||) problem[2];
        RETURN e;
    END IF;
    e.payload_digest := 'sha256:'::text OPERATOR(pg_catalog.||) pg_catalog.encode(
        pg_catalog.sha256(pg_catalog.convert_to(e.data, 'UTF8'::name)), 'hex'::text);

    e.event_type := coalesce(event_type, CASE WHEN kind OPERATOR(pg_catalog.=) 'completed'::text
                                              THEN 'scoring.result.completed'::text
                                              ELSE 'scoring.job.failed'::text END);
    FOREACH checked_field IN ARRAY ARRAY['event_type', 'schema_version', 'source', 'tenant_ref',
                                         'correlation_ref', 'causation_ref']::text[] LOOP
        checked_value := CASE
            WHEN checked_field OPERATOR(pg_catalog.=) 'event_type'::text THEN e.event_type
            WHEN checked_field OPERATOR(pg_catalog.=) 'schema_version'::text THEN schema_version
            WHEN checked_field OPERATOR(pg_catalog.=) 'source'::text THEN source
            WHEN checked_field OPERATOR(pg_catalog.=) 'tenant_ref'::text THEN tenant_ref
            WHEN checked_field OPERATOR(pg_catalog.=) 'correlation_ref'::text THEN correlation_ref
            ELSE causation_ref END;
        CONTINUE WHEN checked_value IS NULL AND checked_field OPERATOR(pg_catalog.=) 'causation_ref'::text;
        IF checked_value IS NULL THEN
            e.refusal_field := checked_field;
            e.refusal_message := checked_field OPERATOR(pg_catalog.||) ': is required'::text;
            RETURN e;
        END IF;
        problem := ARRAY[@schema@.outbox_relay_text_problem(
            checked_value,
            CASE WHEN checked_field OPERATOR(pg_catalog.~) '_ref$'::text THEN 'ref'::text ELSE 'token'::text END,
            CASE WHEN checked_field OPERATOR(pg_catalog.=) 'event_type'::text THEN 128
                 WHEN checked_field OPERATOR(pg_catalog.=) 'schema_version'::text THEN 64
                 ELSE 1024 END)];
        IF problem[1] IS NOT NULL THEN
            e.refusal_field := checked_field;
            e.refusal_message := checked_field OPERATOR(pg_catalog.||) ': '::text OPERATOR(pg_catalog.||) problem[1];
            RETURN e;
        END IF;
    END LOOP;

    -- Each of the four becomes a record header; the outbox's door takes a header set of
    -- at most 65,536 bytes (contracts/limits.py, MAX_HEADER_SET_BYTES).
    SELECT pg_catalog.sum(pg_catalog.octet_length(h.value)), (pg_catalog.array_agg(h.field ORDER BY pg_catalog.octet_length(h.value) DESC, h.i))[1]
    INTO header_bytes, checked_field
    FROM (VALUES (1, 'tenant_ref'::text, tenant_ref), (2, 'schema_version', schema_version),
                 (3, 'correlation_ref', correlation_ref), (4, 'causation_ref', causation_ref)) AS h (i, field, value)
    WHERE h.value IS NOT NULL;
    IF header_bytes OPERATOR(pg_catalog.>) 65536::bigint THEN
        e.refusal := 'invalid_argument';
        e.refusal_field := checked_field;
        e.refusal_message := pg_catalog.format(
            '%s: tenant_ref, schema_version, correlation_ref and causation_ref are %s bytes '
            'together, at most 65536 allowed (each becomes a record header)', checked_field, header_bytes);
        RETURN e;
    END IF;

    e.source := source;
    e.tenant_ref := tenant_ref;
    e.correlation_ref := correlation_ref;
    e.causation_ref := causation_ref;
    e.schema_version := schema_version;
    e.traceparent := traceparent;
    e.tracestate := tracestate;
    -- The envelope's members in RFC 8785 order (all ASCII names, so plain byte order), its
    -- strings escaped as JCS escapes them (json's own escaping is the same).
    e.envelope_head := '{"causation_ref":'::text
        OPERATOR(pg_catalog.||) coalesce(pg_catalog.to_json(causation_ref)::text, 'null'::text)
        OPERATOR(pg_catalog.||) ',"correlation_ref":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(correlation_ref)::text
        OPERATOR(pg_catalog.||) ',"event_ref":"'::text OPERATOR(pg_catalog.||) e.event_id::text
        OPERATOR(pg_catalog.||) '","event_type":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(e.event_type)::text
        OPERATOR(pg_catalog.||) ',"occurred_at_unix_ms":'::text;
    e.envelope_tail := ',"payload_digest":"'::text OPERATOR(pg_catalog.||) e.payload_digest
        OPERATOR(pg_catalog.||) '","schema_version":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(schema_version)::text
        OPERATOR(pg_catalog.||) ',"source":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(source)::text
        OPERATOR(pg_catalog.||) ',"subject_ref":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(job_ref)::text
        OPERATOR(pg_catalog.||) ',"tenant_ref":'::text OPERATOR(pg_catalog.||) pg_catalog.to_json(tenant_ref)::text
        OPERATOR(pg_catalog.||) '}'::text;
    -- The record's value is the stored payload as compact JSON: the canonical text, but
    -- with each number as jsonb prints it (1e+30 comes out as 31 digits).
    SELECT pg_catalog.octet_length(@schema@.outbox_relay_event_body(e, placeholder))::bigint
           OPERATOR(pg_catalog.+) coalesce(pg_catalog.sum(
               pg_catalog.octet_length(c.printed::numeric::text)
               OPERATOR(pg_catalog.-) pg_catalog.octet_length(c.printed)), 0::bigint)
    INTO size
    FROM pg_catalog.jsonb_path_query(
             data, 'strict $.** ? (@.type() == "number" && (@ >= 1e21 || @ <= -1e21 || (@ < 0.000001 && @ > -0.000001 && @ != 0)))'::jsonpath) AS x (number),
         LATERAL (SELECT @schema@.outbox_relay_json_canonical(x.number) AS printed) AS c;
    IF size OPERATOR(pg_catalog.>) max_event_bytes THEN
        e.refusal := 'event_too_large';
        e.refusal_field := CASE WHEN kind OPERATOR(pg_catalog.=) 'completed'::text THEN 'payload' ELSE 'detail' END;
        e.refusal_message := pg_catalog.format(
            'the event would be %s bytes, over the %s-byte limit (max_event_bytes): the broker '
            'could never publish it', size, max_event_bytes);
        e.refusal_detail := pg_catalog.jsonb_build_object('size_bytes'::text, size, 'limit_bytes'::text, max_event_bytes);
        RETURN e;
    END IF;
    e.refusal := NULL;
    RETURN e;
END
$fn$
$ddl$,
-- The outbox payload: {"data": …, "envelope": …} as canonical text, stamped with its time.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_event_body(e @schema@.outbox_relay_event, occurred_at_unix_ms bigint)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT '{"data":'::text OPERATOR(pg_catalog.||) e.data OPERATOR(pg_catalog.||) ',"envelope":'::text
               OPERATOR(pg_catalog.||) e.envelope_head OPERATOR(pg_catalog.||) occurred_at_unix_ms::text
               OPERATOR(pg_catalog.||) e.envelope_tail OPERATOR(pg_catalog.||) '}'::text
    );
END
$fn$
$ddl$,
-- Is the event already there, pending in the outbox or published (its receipt)? NULL: no;
-- 'same': the same event; 'different': another event under its id. A receipt keeps no
-- payload, so only its identity is compared; time, correlation, causation, source and trace
-- context describe the attempt, not the outcome, and may differ on a retried call.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_find_event(e @schema@.outbox_relay_event)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT CASE WHEN pg_catalog.count(*) OPERATOR(pg_catalog.=) 0 THEN NULL
                    WHEN pg_catalog.bool_and(f.same) THEN 'same'
                    ELSE 'different' END
        FROM (
            SELECT o.aggregatetype OPERATOR(pg_catalog.=) 'scoring_job'::text
                   AND o.aggregateid OPERATOR(pg_catalog.=) e.job_ref
                   AND o.type OPERATOR(pg_catalog.=) e.event_type
                   AND coalesce(o.tenant_ref OPERATOR(pg_catalog.=) e.tenant_ref, false)
                   AND coalesce(o.schema_version OPERATOR(pg_catalog.=) e.schema_version, false)
                   AND coalesce((o.payload OPERATOR(pg_catalog.#>>) '{envelope,payload_digest}'::text[])
                                OPERATOR(pg_catalog.=) e.payload_digest, false) AS same
            FROM @schema@.outbox o
            WHERE o.id OPERATOR(pg_catalog.=) e.event_id
            UNION ALL
            SELECT r.aggregatetype OPERATOR(pg_catalog.=) 'scoring_job'::text
                   AND r.aggregateid OPERATOR(pg_catalog.=) e.job_ref
                   AND r.type OPERATOR(pg_catalog.=) e.event_type
            FROM @schema@.outbox_receipt r
            WHERE r.id OPERATOR(pg_catalog.=) e.event_id
        ) AS f
    );
END
$fn$
$ddl$,
-- Enqueue the event unless it is already there: 'inserted' or 'duplicate'. Another event
-- under its id raises OR001: the transition already written in this transaction must never
-- commit without its event.
--
-- The look-up runs first, as a statement of its own: if the relay is moving this very row to
-- outbox_receipt meanwhile, the look-up still sees the row (or, once the move committed, the
-- receipt), where ON CONFLICT alone would wait for the move and then insert a second row.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_write_event(e @schema@.outbox_relay_event, occurred_at_unix_ms bigint)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $fn$
DECLARE
    existing text := @schema@.outbox_relay_find_event(e);
BEGIN
    IF existing IS NULL THEN
        INSERT INTO @schema@.outbox (id, aggregatetype, aggregateid, type, payload, tenant_ref,
                                     schema_version, correlation_ref, causation_ref, traceparent,
                                     tracestate)
        VALUES (e.event_id, 'scoring_job', e.job_ref, e.event_type,
                @schema@.outbox_relay_event_body(e, occurred_at_unix_ms)::jsonb, e.tenant_ref,
                e.schema_version, e.correlation_ref, e.causation_ref, e.traceparent, e.tracestate)
        ON CONFLICT (id) DO NOTHING;
        IF FOUND THEN
            RETURN 'inserted';
        END IF;
        existing := @schema@.outbox_relay_find_event(e);  -- a concurrent writer won
    END IF;
    IF existing OPERATOR(pg_catalog.=) 'same'::text THEN
        RETURN 'duplicate';
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'OR001',
        MESSAGE = pg_catalog.format(
            'job %L: outbox event %s exists with different content; the transaction was rolled back',
            pg_catalog.left(e.job_ref, 200), e.event_id),
        DETAIL = e.event_id::text,
        HINT = 'a conflicting replay: roll the transaction back; nothing of it may commit';
END
$fn$
$ddl$,
-- The one permanent failure path (a worker's, a spent retry budget's, the sweeper's): the
-- locked leased job to 'quarantined' with its cause. The fence and the clock are tested again
-- in the statement: NULL when the lease is no longer live (or, for the sweeper, no longer
-- expired), else the transition's time in unix ms.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_quarantine_job(
    job_ref text, fencing_token bigint, cause_code text, lease_must_be_expired boolean)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    occurred bigint;
BEGIN
    UPDATE @schema@.scoring_job_state
    SET scoring_state = 'quarantined',
        last_failure_code = cause_code,
        next_attempt_at_unix_ms = NULL,
        active_worker_ref = NULL,
        active_lease_ref = NULL,
        active_fencing_token = NULL,
        active_lease_expires_at_unix_ms = NULL,
        updated_at = pg_catalog.clock_timestamp()
    WHERE scoring_job_ref OPERATOR(pg_catalog.=) job_ref
      AND scoring_state OPERATOR(pg_catalog.=) 'leased'::text
      AND active_fencing_token OPERATOR(pg_catalog.=) fencing_token
      AND (active_lease_expires_at_unix_ms OPERATOR(pg_catalog.<)
           pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                            OPERATOR(pg_catalog.*) 1000::numeric)::bigint)
          OPERATOR(pg_catalog.=) lease_must_be_expired
    RETURNING pg_catalog.floor(pg_catalog.extract('epoch'::text, updated_at)
                               OPERATOR(pg_catalog.*) 1000::numeric)::bigint
    INTO occurred;
    RETURN occurred;
END
$fn$
$ddl$,
-- A refusal as a result row.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_refusal(
    job_ref text, refusal text, refusal_field text, refusal_message text, refusal_detail jsonb)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT ROW(job_ref, 'refused', NULL, NULL, NULL, NULL, refusal, refusal_field, refusal_message,
                   refusal_detail)::@schema@.outbox_relay_outcome
    );
END
$fn$
$ddl$,
-- Lock the job and decide a completion or permanent failure ('completed' / 'failed') or a
-- retryable failure ('retry'), in the scoring service's order: an already terminal job first
-- (an exact replay is a duplicate even after the lease window), then the state, the fence
-- and the lease's expiry by the database clock. Returns the job's outcome without writing:
-- a refusal, 'duplicate' / 'retry_duplicate' (with the recorded times), 'apply' for a live
-- lease, or, for a retry, 'retry' while budget is left.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_decide(
    action text, job_ref text, fencing_token bigint, outcome_ref text)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    job record;
    now_unix_ms bigint;
    said text := pg_catalog.format('job %L', pg_catalog.left(job_ref, 200));
BEGIN
    SELECT j.scoring_state AS state, j.attempt_count, j.max_attempts, j.active_fencing_token,
           j.active_lease_expires_at_unix_ms AS expires, j.next_attempt_at_unix_ms,
           j.result_ref, j.completed_fencing_token, j.last_failure_code,
           pg_catalog.floor(pg_catalog.extract('epoch'::text, j.updated_at)
                            OPERATOR(pg_catalog.*) 1000::numeric)::bigint AS updated_at_unix_ms
    INTO job
    FROM @schema@.scoring_job_state j
    WHERE j.scoring_job_ref OPERATOR(pg_catalog.=) job_ref
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'unknown_job', NULL,
                                             pg_catalog.format('no scoring job %L', pg_catalog.left(job_ref, 200)), NULL);
    END IF;
    -- clock_timestamp, not now(): the caller's transaction may have begun long ago
    now_unix_ms := pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                                    OPERATOR(pg_catalog.*) 1000::numeric)::bigint;

    IF action OPERATOR(pg_catalog.=) 'completed'::text THEN
        IF job.state OPERATOR(pg_catalog.=) 'completed'::text THEN
            IF job.result_ref OPERATOR(pg_catalog.=) outcome_ref
               AND job.completed_fencing_token OPERATOR(pg_catalog.=) fencing_token THEN
                RETURN ROW(job_ref, 'duplicate', NULL, NULL, job.updated_at_unix_ms, NULL, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
            END IF;
            RETURN @schema@.outbox_relay_refusal(job_ref, 'conflicting_completion', NULL,
                said OPERATOR(pg_catalog.||) ' already completed with another result or fence'::text, NULL);
        END IF;
        IF job.state OPERATOR(pg_catalog.=) 'quarantined'::text THEN
            RETURN @schema@.outbox_relay_refusal(job_ref, 'conflicting_completion', NULL,
                pg_catalog.format('%s already failed permanently (%s)', said, job.last_failure_code), NULL);
        END IF;
    ELSE
        IF job.state OPERATOR(pg_catalog.=) 'quarantined'::text THEN
            -- a quarantined job keeps attempt_count, which was the fence of the lease it ended
            IF job.last_failure_code OPERATOR(pg_catalog.=) outcome_ref
               AND job.attempt_count::bigint OPERATOR(pg_catalog.=) fencing_token THEN
                RETURN ROW(job_ref, 'duplicate', NULL, NULL, job.updated_at_unix_ms, NULL, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
            END IF;
            RETURN @schema@.outbox_relay_refusal(job_ref, 'conflicting_failure', NULL,
                said OPERATOR(pg_catalog.||) ' already failed permanently with another cause or fence'::text, NULL);
        END IF;
        IF job.state OPERATOR(pg_catalog.=) 'completed'::text THEN
            RETURN @schema@.outbox_relay_refusal(job_ref, 'conflicting_failure', NULL,
                said OPERATOR(pg_catalog.||) ' already completed'::text, NULL);
        END IF;
        IF action OPERATOR(pg_catalog.=) 'retry'::text
           AND job.state OPERATOR(pg_catalog.=) 'retry_scheduled'::text
           AND job.attempt_count::bigint OPERATOR(pg_catalog.=) fencing_token
           AND job.last_failure_code OPERATOR(pg_catalog.=) outcome_ref THEN
            RETURN ROW(job_ref, 'retry_duplicate', NULL, NULL, NULL, job.next_attempt_at_unix_ms,
                       NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
        END IF;
    END IF;

    IF job.state OPERATOR(pg_catalog.<>) 'leased'::text THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'not_leased', NULL,
            pg_catalog.format('%s is %s, not leased', said, job.state),
            pg_catalog.jsonb_build_object('state'::text, job.state));
    END IF;
    IF job.active_fencing_token OPERATOR(pg_catalog.<>) fencing_token THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'stale_lease', NULL,
            pg_catalog.format('%s: fencing token %s is stale (current %s)', said, fencing_token,
                              job.active_fencing_token),
            pg_catalog.jsonb_build_object('given'::text, fencing_token, 'current'::text, job.active_fencing_token));
    END IF;
    -- expired: the expiry is earlier than the database clock, as the health probe counts it
    IF job.expires OPERATOR(pg_catalog.<) now_unix_ms THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'lease_expired', NULL,
            pg_catalog.format('%s: lease expired at %s (database clock %s)', said, job.expires, now_unix_ms),
            pg_catalog.jsonb_build_object('expired_at_unix_ms'::text, job.expires, 'now_unix_ms'::text, now_unix_ms));
    END IF;
    IF action OPERATOR(pg_catalog.=) 'retry'::text
       AND job.attempt_count OPERATOR(pg_catalog.<) job.max_attempts THEN
        RETURN ROW(job_ref, 'retry', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
    END IF;
    RETURN ROW(job_ref, 'apply', NULL, NULL, NULL, NULL, NULL, NULL, NULL,
               pg_catalog.jsonb_build_object('expired_at_unix_ms'::text, job.expires))::@schema@.outbox_relay_outcome;
END
$fn$
$ddl$,
-- The refusal when a fenced UPDATE matched nothing although the locked row was decided live:
-- only the clock can have moved past the expiry in between.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_expired_meanwhile(job_ref text, decided @schema@.outbox_relay_outcome)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RETURN (
        SELECT @schema@.outbox_relay_refusal(job_ref, 'lease_expired', NULL,
            pg_catalog.format('job %L: lease expired at %s (database clock %s)', pg_catalog.left(job_ref, 200),
                              decided.refusal_detail OPERATOR(pg_catalog.->>) 'expired_at_unix_ms'::text, c.now_unix_ms),
            pg_catalog.jsonb_build_object('expired_at_unix_ms'::text, decided.refusal_detail OPERATOR(pg_catalog.->) 'expired_at_unix_ms'::text,
                                          'now_unix_ms'::text, c.now_unix_ms))
        FROM (SELECT pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                                      OPERATOR(pg_catalog.*) 1000::numeric)::bigint AS now_unix_ms) AS c
    );
END
$fn$
$ddl$,
-- Argument checks the four share: NULL, or the refusal.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_check_arguments(
    job_ref text, fencing_token bigint, outcome_field text, outcome_ref text, max_event_bytes bigint)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    problem text;
BEGIN
    IF job_ref IS NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'job_ref', 'job_ref: is required', NULL);
    END IF;
    problem := @schema@.outbox_relay_text_problem(job_ref, 'ref', NULL);
    IF problem IS NOT NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'job_ref',
                                             'job_ref: '::text OPERATOR(pg_catalog.||) problem, NULL);
    END IF;
    -- The job ref is the event's aggregateid, the record's key: the outbox's door takes at
    -- most 1,024 bytes (contracts/limits.py, MAX_AGGREGATEID_BYTES).
    IF pg_catalog.octet_length(job_ref) OPERATOR(pg_catalog.>) 1024 THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'job_ref',
            pg_catalog.format('job_ref: is %s bytes, at most 1024 allowed (it becomes the '
                              'event''s Kafka key)', pg_catalog.octet_length(job_ref)), NULL);
    END IF;
    IF fencing_token IS NULL OR fencing_token OPERATOR(pg_catalog.<=) 0::bigint THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'fencing_token',
            pg_catalog.format('fencing_token: must be a positive integer, not %s',
                              coalesce(fencing_token::text, 'NULL')), NULL);
    END IF;
    IF outcome_ref IS NULL THEN
        problem := 'is required';
    ELSIF outcome_field OPERATOR(pg_catalog.=) 'cause_code'::text THEN
        problem := @schema@.outbox_relay_text_problem(outcome_ref, 'token', 128);
    ELSE
        problem := @schema@.outbox_relay_text_problem(outcome_ref, 'ref', NULL);
    END IF;
    IF problem IS NOT NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', outcome_field,
            outcome_field OPERATOR(pg_catalog.||) ': '::text OPERATOR(pg_catalog.||) problem, NULL);
    END IF;
    -- No producer sends a record over max.request.size (contracts/limits.py, MAX_RECORD_BYTES).
    IF max_event_bytes IS NULL OR max_event_bytes OPERATOR(pg_catalog.<) 1::bigint
       OR max_event_bytes OPERATOR(pg_catalog.>) 1048576::bigint THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'max_event_bytes',
            pg_catalog.format('max_event_bytes: must be an integer in 1..1048576 (the largest '
                              'record a producer sends), not %s', coalesce(max_event_bytes::text, 'NULL')), NULL);
    END IF;
    RETURN NULL;
END
$fn$
$ddl$,
-- Write an outcome that ends the job: 'completed' or 'failed' (quarantined), for a decision
-- that said 'apply' or 'duplicate'. The fenced transition first, then the idempotent event.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_settle(
    kind text, decided @schema@.outbox_relay_outcome, e @schema@.outbox_relay_event,
    fencing_token bigint, outcome_ref text, lease_must_be_expired boolean)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    occurred bigint;
    outcome text;
BEGIN
    IF decided.outcome OPERATOR(pg_catalog.=) 'duplicate'::text THEN
        -- also a reconciling replay: the event says when the job ended, not when it came
        occurred := decided.occurred_at_unix_ms;
        outcome := 'duplicate';
    ELSIF kind OPERATOR(pg_catalog.=) 'completed'::text THEN
        UPDATE @schema@.scoring_job_state
        SET scoring_state = 'completed',
            result_ref = outcome_ref,
            completed_fencing_token = fencing_token,
            next_attempt_at_unix_ms = NULL,
            active_worker_ref = NULL,
            active_lease_ref = NULL,
            active_fencing_token = NULL,
            active_lease_expires_at_unix_ms = NULL,
            updated_at = pg_catalog.clock_timestamp()
        WHERE scoring_job_ref OPERATOR(pg_catalog.=) e.job_ref
          AND scoring_state OPERATOR(pg_catalog.=) 'leased'::text
          AND active_fencing_token OPERATOR(pg_catalog.=) fencing_token
          AND active_lease_expires_at_unix_ms OPERATOR(pg_catalog.>=)
              pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                               OPERATOR(pg_catalog.*) 1000::numeric)::bigint
        RETURNING pg_catalog.floor(pg_catalog.extract('epoch'::text, updated_at)
                                   OPERATOR(pg_catalog.*) 1000::numeric)::bigint
        INTO occurred;
        outcome := 'completed';
    ELSE
        occurred := @schema@.outbox_relay_quarantine_job(e.job_ref, fencing_token, outcome_ref,
                                                         lease_must_be_expired);
        outcome := 'quarantined';
    END IF;
    IF occurred IS NULL THEN
        RETURN @schema@.outbox_relay_expired_meanwhile(e.job_ref, decided);
    END IF;
    RETURN ROW(e.job_ref, outcome, @schema@.outbox_relay_write_event(e, occurred), e.event_id,
               occurred, NULL, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
END
$fn$
$ddl$,
-- -- the four ---------------------------------------------------------------------------------
$ddl$
CREATE FUNCTION @schema@.outbox_relay_complete_job(
    job_ref text,
    fencing_token bigint,
    result_ref text,
    source text,
    tenant_ref text,
    correlation_ref text,
    schema_version text,
    payload jsonb DEFAULT NULL,
    causation_ref text DEFAULT NULL,
    event_type text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    event_id uuid DEFAULT NULL,
    max_event_bytes bigint DEFAULT 1000000)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    refused @schema@.outbox_relay_outcome;
    e @schema@.outbox_relay_event;
    decided @schema@.outbox_relay_outcome;
BEGIN
    refused := @schema@.outbox_relay_check_arguments(job_ref, fencing_token, 'result_ref',
                                                     result_ref, max_event_bytes);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    e := @schema@.outbox_relay_prepare_event(
        'completed', job_ref, result_ref, payload, source, tenant_ref, correlation_ref,
        schema_version, causation_ref, event_type, traceparent, tracestate, event_id, max_event_bytes);
    IF e.refusal IS NOT NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, e.refusal, e.refusal_field, e.refusal_message, e.refusal_detail);
    END IF;
    decided := @schema@.outbox_relay_decide('completed', job_ref, fencing_token, result_ref);
    IF decided.outcome OPERATOR(pg_catalog.=) 'refused'::text THEN
        RETURN decided;
    END IF;
    RETURN @schema@.outbox_relay_settle('completed', decided, e, fencing_token, result_ref, false);
END
$fn$
$ddl$,
$ddl$
CREATE FUNCTION @schema@.outbox_relay_fail_job_permanently(
    job_ref text,
    fencing_token bigint,
    cause_code text,
    source text,
    tenant_ref text,
    correlation_ref text,
    schema_version text,
    detail jsonb DEFAULT NULL,
    causation_ref text DEFAULT NULL,
    event_type text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    event_id uuid DEFAULT NULL,
    max_event_bytes bigint DEFAULT 1000000)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    refused @schema@.outbox_relay_outcome;
    e @schema@.outbox_relay_event;
    decided @schema@.outbox_relay_outcome;
BEGIN
    refused := @schema@.outbox_relay_check_arguments(job_ref, fencing_token, 'cause_code',
                                                     cause_code, max_event_bytes);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    e := @schema@.outbox_relay_prepare_event(
        'failed', job_ref, cause_code, detail, source, tenant_ref, correlation_ref,
        schema_version, causation_ref, event_type, traceparent, tracestate, event_id, max_event_bytes);
    IF e.refusal IS NOT NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, e.refusal, e.refusal_field, e.refusal_message, e.refusal_detail);
    END IF;
    decided := @schema@.outbox_relay_decide('failed', job_ref, fencing_token, cause_code);
    IF decided.outcome OPERATOR(pg_catalog.=) 'refused'::text THEN
        RETURN decided;
    END IF;
    RETURN @schema@.outbox_relay_settle('failed', decided, e, fencing_token, cause_code, false);
END
$fn$
$ddl$,
$ddl$
CREATE FUNCTION @schema@.outbox_relay_fail_retryable(
    job_ref text,
    fencing_token bigint,
    cause_code text,
    retry_delay_ms bigint,
    source text,
    tenant_ref text,
    correlation_ref text,
    schema_version text,
    detail jsonb DEFAULT NULL,
    causation_ref text DEFAULT NULL,
    event_type text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    event_id uuid DEFAULT NULL,
    max_event_bytes bigint DEFAULT 1000000)
RETURNS @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    refused @schema@.outbox_relay_outcome;
    e @schema@.outbox_relay_event;
    decided @schema@.outbox_relay_outcome;
    next_at bigint;
BEGIN
    refused := @schema@.outbox_relay_check_arguments(job_ref, fencing_token, 'cause_code',
                                                     cause_code, max_event_bytes);
    IF refused.outcome IS NOT NULL THEN
        RETURN refused;
    END IF;
    IF retry_delay_ms IS NULL OR retry_delay_ms OPERATOR(pg_catalog.<) 0::bigint
       OR retry_delay_ms OPERATOR(pg_catalog.>) 2147483647::bigint THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, 'invalid_argument', 'retry_delay_ms',
            pg_catalog.format('retry_delay_ms: must be an integer in 0..2147483647, not %s',
                              coalesce(retry_delay_ms::text, 'NULL')), NULL);
    END IF;
    -- Checked now, before any write, although it is written only when the budget is spent.
    e := @schema@.outbox_relay_prepare_event(
        'failed', job_ref, cause_code, detail, source, tenant_ref, correlation_ref,
        schema_version, causation_ref, event_type, traceparent, tracestate, event_id, max_event_bytes);
    IF e.refusal IS NOT NULL THEN
        RETURN @schema@.outbox_relay_refusal(job_ref, e.refusal, e.refusal_field, e.refusal_message, e.refusal_detail);
    END IF;
    decided := @schema@.outbox_relay_decide('retry', job_ref, fencing_token, cause_code);
    IF decided.outcome OPERATOR(pg_catalog.=) ANY ('{refused,retry_duplicate}'::text[]) THEN
        RETURN decided;
    END IF;
    IF decided.outcome OPERATOR(pg_catalog.<>) 'retry'::text THEN
        -- the budget is spent: this failure is the permanent one
        RETURN @schema@.outbox_relay_settle('failed', decided, e, fencing_token, cause_code, false);
    END IF;
    UPDATE @schema@.scoring_job_state
    SET scoring_state = 'retry_scheduled',
        last_failure_code = cause_code,
        next_attempt_at_unix_ms = pg_catalog.floor(
            pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
            OPERATOR(pg_catalog.*) 1000::numeric)::bigint OPERATOR(pg_catalog.+) retry_delay_ms,
        active_worker_ref = NULL,
        active_lease_ref = NULL,
        active_fencing_token = NULL,
        active_lease_expires_at_unix_ms = NULL,
        updated_at = pg_catalog.clock_timestamp()
    WHERE scoring_job_ref OPERATOR(pg_catalog.=) job_ref
      AND scoring_state OPERATOR(pg_catalog.=) 'leased'::text
      AND active_fencing_token OPERATOR(pg_catalog.=) fencing_token
      AND attempt_count OPERATOR(pg_catalog.<) max_attempts
      AND active_lease_expires_at_unix_ms OPERATOR(pg_catalog.>=)
          pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                           OPERATOR(pg_catalog.*) 1000::numeric)::bigint
    RETURNING next_attempt_at_unix_ms INTO next_at;
    IF next_at IS NULL THEN
        RETURN @schema@.outbox_relay_expired_meanwhile(job_ref, decided);
    END IF;
    RETURN ROW(job_ref, 'retry_scheduled', NULL, NULL, NULL, next_at, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
END
$fn$
$ddl$,
-- Up to "limit" leases whose expiry is earlier than the database clock, oldest expiry first,
-- SKIP LOCKED, each locked for the rest of the transaction: with budget left, rescheduled
-- (due now, cause lease_expired, no event); spent, quarantined with cause lease_expired and
-- its scoring.job.failed event. The job table has no tenant column: given no event details
-- (source, tenant_ref, correlation_ref and schema_version all NULL), a spent job is left
-- leased as 'needs_event_details', for a second call with its own details and job_refs
-- naming it. An event already under a spent job's id with other content is found before
-- its transition: that job is refused (conflicting_replay) and left leased.
$ddl$
CREATE FUNCTION @schema@.outbox_relay_expire_leases(
    "limit" bigint,
    source text DEFAULT NULL,
    tenant_ref text DEFAULT NULL,
    correlation_ref text DEFAULT NULL,
    schema_version text DEFAULT NULL,
    causation_ref text DEFAULT NULL,
    event_type text DEFAULT NULL,
    traceparent text DEFAULT NULL,
    tracestate text DEFAULT NULL,
    max_event_bytes bigint DEFAULT 1000000,
    job_refs text[] DEFAULT NULL)
RETURNS SETOF @schema@.outbox_relay_outcome
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    details boolean := source IS NOT NULL OR tenant_ref IS NOT NULL
                       OR correlation_ref IS NOT NULL OR schema_version IS NOT NULL;
    now_unix_ms bigint;
    job record;
    e @schema@.outbox_relay_event;
    refused @schema@.outbox_relay_outcome;
    occurred bigint;
BEGIN
    IF "limit" IS NULL OR "limit" OPERATOR(pg_catalog.<) 1::bigint
       OR "limit" OPERATOR(pg_catalog.>) 2147483647::bigint THEN
        RETURN NEXT @schema@.outbox_relay_refusal(NULL, 'invalid_argument', 'limit',
            pg_catalog.format('limit: must be an integer in 1..2147483647, not %s',
                              coalesce("limit"::text, 'NULL')), NULL);
        RETURN;
    END IF;
    IF details THEN
        -- The details are checked once, before any write, with a stand-in job.
        refused := @schema@.outbox_relay_check_arguments('job', 1, 'cause_code', 'lease_expired', max_event_bytes);
        IF refused.outcome IS NULL THEN
            e := @schema@.outbox_relay_prepare_event(
                'failed', 'job', 'lease_expired', NULL, source, tenant_ref, correlation_ref,
                schema_version, causation_ref, event_type, traceparent, tracestate, NULL, max_event_bytes);
            IF e.refusal IS NOT NULL THEN
                refused := @schema@.outbox_relay_refusal(NULL, e.refusal, e.refusal_field, e.refusal_message, e.refusal_detail);
            END IF;
        END IF;
        IF refused.outcome IS NOT NULL THEN
            refused.job_ref := NULL;
            RETURN NEXT refused;
            RETURN;
        END IF;
    END IF;
    now_unix_ms := pg_catalog.floor(pg_catalog.extract('epoch'::text, pg_catalog.clock_timestamp())
                                    OPERATOR(pg_catalog.*) 1000::numeric)::bigint;
    FOR job IN
        SELECT j.scoring_job_ref, j.attempt_count, j.max_attempts, j.active_fencing_token
        FROM @schema@.scoring_job_state j
        WHERE j.scoring_state OPERATOR(pg_catalog.=) 'leased'::text
          AND j.active_lease_expires_at_unix_ms OPERATOR(pg_catalog.<) now_unix_ms
          AND (job_refs IS NULL OR j.scoring_job_ref OPERATOR(pg_catalog.=) ANY (job_refs))
        ORDER BY j.active_lease_expires_at_unix_ms, j.scoring_job_ref
        LIMIT "limit"
        FOR UPDATE SKIP LOCKED
    LOOP
        IF job.attempt_count OPERATOR(pg_catalog.<) job.max_attempts THEN
            UPDATE @schema@.scoring_job_state
            SET scoring_state = 'retry_scheduled',
                last_failure_code = 'lease_expired',
                next_attempt_at_unix_ms = now_unix_ms,
                active_worker_ref = NULL,
                active_lease_ref = NULL,
                active_fencing_token = NULL,
                active_lease_expires_at_unix_ms = NULL,
                updated_at = pg_catalog.clock_timestamp()
            WHERE scoring_job_ref OPERATOR(pg_catalog.=) job.scoring_job_ref;
            RETURN NEXT ROW(job.scoring_job_ref, 'rescheduled', NULL, NULL, NULL, now_unix_ms,
                            NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
            CONTINUE;
        END IF;
        IF NOT details THEN
            RETURN NEXT ROW(job.scoring_job_ref, 'needs_event_details', NULL, NULL, NULL, NULL,
                            NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
            CONTINUE;
        END IF;
        refused := @schema@.outbox_relay_check_arguments(job.scoring_job_ref, job.active_fencing_token,
                                                         'cause_code', 'lease_expired', max_event_bytes);
        IF refused.outcome IS NOT NULL THEN
            RETURN NEXT refused;
            CONTINUE;
        END IF;
        e := @schema@.outbox_relay_prepare_event(
            'failed', job.scoring_job_ref, 'lease_expired', NULL, source, tenant_ref, correlation_ref,
            schema_version, causation_ref, event_type, traceparent, tracestate, NULL, max_event_bytes);
        IF e.refusal IS NOT NULL THEN
            RETURN NEXT @schema@.outbox_relay_refusal(job.scoring_job_ref, e.refusal, e.refusal_field,
                                                      e.refusal_message, e.refusal_detail);
            CONTINUE;
        END IF;
        IF @schema@.outbox_relay_find_event(e) OPERATOR(pg_catalog.=) 'different'::text THEN
            RETURN NEXT @schema@.outbox_relay_refusal(job.scoring_job_ref, 'conflicting_replay', NULL,
                pg_catalog.format('job %L: outbox event %s exists with different content; the job '
                                  'was left leased', pg_catalog.left(job.scoring_job_ref, 200), e.event_id),
                pg_catalog.jsonb_build_object('event_id'::text, e.event_id));
            CONTINUE;
        END IF;
        occurred := @schema@.outbox_relay_quarantine_job(job.scoring_job_ref, job.active_fencing_token,
                                                         'lease_expired', true);
        IF occurred IS NULL THEN
            CONTINUE;  -- locked since the sweep began: only a clock set back gets here
        END IF;
        RETURN NEXT ROW(job.scoring_job_ref, 'quarantined', @schema@.outbox_relay_write_event(e, occurred),
                        e.event_id, occurred, NULL, NULL, NULL, NULL, NULL)::@schema@.outbox_relay_outcome;
    END LOOP;
    RETURN;
END
$fn$
$ddl$
    ] LOOP
        EXECUTE pg_catalog.replace(ddl, '@schema@', pg_catalog.quote_ident(schema_name));
    END LOOP;

    -- The functions' owner owns their types too. Nobody but it calls the functions; `grant`
    -- gives EXECUTE on the four to the parts that call them (writer, scoring-worker).
    EXECUTE pg_catalog.format('ALTER TYPE %I.outbox_relay_outcome OWNER TO %I', schema_name, definer);
    EXECUTE pg_catalog.format('ALTER TYPE %I.outbox_relay_event OWNER TO %I', schema_name, definer);
    FOR signature IN
        SELECT pg_catalog.format('%I.%I(%s)', schema_name, p.proname,
                                 pg_catalog.pg_get_function_identity_arguments(p.oid))
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = schema_oid
          -- Only what this migration created: the door's functions (0009, 0011) keep
          -- their owner and their grants.
          AND p.proname = ANY (ARRAY[
              'outbox_relay_text_problem', 'outbox_relay_json_canonical',
              'outbox_relay_json_problem', 'outbox_relay_terminal_event_id',
              'outbox_relay_prepare_event', 'outbox_relay_event_body',
              'outbox_relay_find_event', 'outbox_relay_write_event',
              'outbox_relay_quarantine_job', 'outbox_relay_refusal', 'outbox_relay_decide',
              'outbox_relay_expired_meanwhile', 'outbox_relay_check_arguments',
              'outbox_relay_settle', 'outbox_relay_complete_job',
              'outbox_relay_fail_job_permanently', 'outbox_relay_fail_retryable',
              'outbox_relay_expire_leases']::name[])
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', signature);
        EXECUTE pg_catalog.format('ALTER FUNCTION %s OWNER TO %I', signature, definer);
    END LOOP;

    IF lent_create THEN
        EXECUTE pg_catalog.format('REVOKE CREATE ON SCHEMA %I FROM %I', schema_name, definer);
    END IF;
END
$migration$;
