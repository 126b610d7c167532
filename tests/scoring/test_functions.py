"""The scoring functions of migration 0012 themselves: who owns them and what they may do,
names nobody else can take over, the canonical JSON and the event id they compute (held
to the independent Python implementations consumers use), what they refuse when called
from SQL directly, and the writer's one error below them."""

from __future__ import annotations

import dataclasses
import json
import struct
import uuid
from typing import Any

import asyncpg
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.envelope import canonical_json
from contracts.limits import MAX_HEADER_SET_BYTES
from migrations.grants import EXECUTE, FUNCTIONS, SCORING_FUNCTIONS_OWNER
from migrations.runner import apply, load_migrations
from scoring.errors import InvalidArgument, UnknownJob, WriterNotMigrated
from scoring.event_id import OutcomeKind, terminal_event_id
from scoring.events import DEFAULT_MAX_EVENT_BYTES
from scoring.store import REQUIRED_MIGRATION
from scoring.worker import expire_leases, fail_retryable
from scoring.writer import Enqueue, EventDetails, complete_job, fail_job_permanently
from tests.scoring.conftest import CompleteClaimed
from tests.scoring.test_decisions import EXPIRED_LAST_ATTEMPT, LEASED, put
from tests.support import expected_privileges
from tests.support.roles import create_login_role, drop_role, grant, privilege_matrix
from tests.support.scoring_jobs import events, job, leased_job
from tests.support.services import PostgresServer, drop_database, scratch_database, with_database

CALLS = {signature.split("(")[0] for signature in EXECUTE}
DETAILS = EventDetails(
    source="urn:scoring-worker", tenant_ref="tenant-a", correlation_ref="corr-1", schema_version="1"
)

# -- ownership and privileges --------------------------------------------------------------------


async def test_the_four_run_as_their_nologin_owner_with_a_pinned_path(
    db: asyncpg.Connection,
) -> None:
    rows = await db.fetch(
        "SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')' AS signature,"
        " pg_get_userbyid(p.proowner) AS owner, p.prosecdef, p.proconfig,"
        " has_function_privilege('public', p.oid, 'EXECUTE') AS public_may"
        " FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace"
        " AND p.proname LIKE 'outbox\\_relay\\_%' AND p.proname NOT IN"
        " ('outbox_relay_notify', 'outbox_relay_guard_insert', 'outbox_relay_measure',"
        " 'outbox_relay_writer_routes')"  # the door's and the trigger's: the schema owner's
    )
    assert {r["signature"] for r in rows} == set(FUNCTIONS) - {
        "outbox_relay_notify()",
        "outbox_relay_guard_insert()",
        "outbox_relay_measure()",
    }
    for row in rows:
        assert row["owner"] == SCORING_FUNCTIONS_OWNER, row["signature"]
        # SECURITY DEFINER exactly for the four a caller may execute
        assert row["prosecdef"] is (row["signature"] in EXECUTE), row["signature"]
        assert "search_path=pg_catalog, pg_temp" in row["proconfig"], row["signature"]
        assert row["public_may"] is False, row["signature"]
    owner = await db.fetchrow(
        "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication"
        " FROM pg_roles WHERE rolname = $1",
        SCORING_FUNCTIONS_OWNER,
    )
    assert owner is not None and not any(owner.values())


async def test_their_owner_holds_exactly_the_writer_part_on_the_tables(
    db: asyncpg.Connection,
) -> None:
    held = await privilege_matrix(db, SCORING_FUNCTIONS_OWNER)
    tables = [
        key for key in expected_privileges.WRITER if not key.startswith(("function ", "schema "))
    ]
    assert {t: held[t] for t in tables} == {t: expected_privileges.WRITER[t] for t in tables}


async def test_a_role_with_only_the_scoring_worker_part_completes_a_job(
    db: asyncpg.Connection, database_url: str, details: EventDetails
) -> None:
    role = await create_login_role(db, database_url, "worker")
    try:
        await grant(database_url, role.name, "scoring-worker")
        claimed = await leased_job(db)
        conn = await asyncpg.connect(role.url)
        try:
            # It can read nothing and write nothing by itself…
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch("SELECT * FROM scoring_job_state")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(
                    "INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', 'b', 'c')"
                )
            # …but through the functions it does a worker's whole job.
            written = await complete_job(
                conn,
                job_ref="job-1",
                fencing_token=claimed.fencing_token,
                result_ref="r-1",
                event=details,
            )
            assert written.enqueue is Enqueue.INSERTED
        finally:
            await conn.close()
        [event] = await events(db)
        assert event["aggregateid"] == "job-1"
    finally:
        await drop_role(db, role.name)


async def test_a_callers_temporary_tables_are_never_the_ones_written(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    # pg_temp is on the functions' path (last), and relations are looked up there: a caller
    # with a temporary scoring_job_state must not be able to fake a leased job.
    await db.execute(
        "CREATE TEMP TABLE scoring_job_state (LIKE public.scoring_job_state INCLUDING ALL)"
    )
    await db.execute("CREATE TEMP TABLE outbox (LIKE public.outbox INCLUDING DEFAULTS)")
    await put(db, LEASED, "job-ghost")  # into the temporary table: it comes first for us
    with pytest.raises(UnknownJob):
        await complete_job(
            db, job_ref="job-ghost", fencing_token=2, result_ref="r-1", event=details
        )
    assert await db.fetchval("SELECT count(*) FROM public.outbox") == 0
    assert await db.fetchval("SELECT count(*) FROM pg_temp.outbox") == 0


# Operators and functions that fit the calls of the functions better than pg_catalog's own
# (no exact match there), planted where a caller's path finds them; each records its call.
_SHADOWS = """
CREATE TABLE public.shadow_calls (who text, what text);
GRANT INSERT ON public.shadow_calls TO PUBLIC;
CREATE FUNCTION public.shadow(what text) RETURNS boolean LANGUAGE sql AS
    $$ INSERT INTO public.shadow_calls VALUES (current_user, what) RETURNING true $$;
CREATE FUNCTION public.shadow_mul(numeric, integer) RETURNS numeric LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('numeric * integer') THEN $1 * $2::numeric END $$;
CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer, FUNCTION = public.shadow_mul);
CREATE FUNCTION public.shadow_concat(text, bigint) RETURNS text LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('text || bigint') THEN $1 || $2::text END $$;
CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = bigint, FUNCTION = public.shadow_concat);
CREATE FUNCTION public.shadow_eq(text, name) RETURNS boolean LANGUAGE sql AS
    $$ SELECT public.shadow('text = name') AND $1 = $2::text $$;
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = name, FUNCTION = public.shadow_eq);
CREATE FUNCTION public.sha256(text) RETURNS bytea LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('sha256(text)') THEN pg_catalog.sha256($1::bytea) END $$;
CREATE FUNCTION public.convert_to(text, text) RETURNS bytea LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('convert_to(text, text)') THEN pg_catalog.convert_to($1, $2::name) END $$;
CREATE FUNCTION public.format(text, bigint) RETURNS text LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('format(text, bigint)') THEN pg_catalog.format($1, $2) END $$;
CREATE FUNCTION public.jsonb_build_object(text, text) RETURNS jsonb LANGUAGE sql AS
    $$ SELECT CASE WHEN public.shadow('jsonb_build_object(text, text)') THEN pg_catalog.jsonb_build_object($1, $2) END $$;
"""


async def test_names_planted_on_the_callers_path_never_run(
    db: asyncpg.Connection, details: EventDetails
) -> None:
    # The jobs first: claim is a plain statement of the worker SDK, not one of the functions.
    first = await leased_job(db, "job-1")
    second = await leased_job(db, "job-2", max_attempts=2)
    third = await leased_job(db, "job-3")
    await put(db, EXPIRED_LAST_ATTEMPT, "job-4")
    await db.execute(_SHADOWS)
    # the plants work: an unqualified call on this session's path runs them
    assert await db.fetchval("SELECT (2.5::numeric * 2)") == 5
    assert await db.fetchval("SELECT count(*) FROM public.shadow_calls") == 1
    await db.execute("DELETE FROM public.shadow_calls")

    await complete_job(
        db,
        job_ref="job-1",
        fencing_token=first.fencing_token,
        result_ref="r-1",
        payload={"n": [1e30, 0.5, "x", {"ü": None}]},
        event=details,
    )
    await fail_retryable(
        db,
        job_ref="job-2",
        fencing_token=second.fencing_token,
        cause_code="timeout",
        retry_delay_ms=60_000,
        event=details,
    )
    await fail_job_permanently(
        db, job_ref="job-3", fencing_token=third.fencing_token, cause_code="bad", event=details
    )
    swept = await expire_leases(db, limit=10, event=details)
    assert [q.job_ref for q in swept.quarantined] == ["job-4"]
    with pytest.raises(InvalidArgument):
        await complete_job(db, job_ref="42", fencing_token=1, result_ref="r", event=details)
    assert await db.fetch("SELECT * FROM public.shadow_calls") == []
    assert len(await events(db)) == 3


# -- canonical JSON and the event id: the same as the consumers' own ------------------------------

# RFC 8785 Appendix B: IEEE-754 bit patterns and their canonical text.
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]

CANONICAL_SQL = "SELECT outbox_relay_json_canonical($1::jsonb)"


async def test_numbers_are_printed_as_rfc8785_appendix_b(db: asyncpg.Connection) -> None:
    for bits, expected in RFC8785_NUMBERS:
        value = struct.unpack(">d", bytes.fromhex(bits))[0]
        # as a Python writer sends it (repr), and spelt otherwise with the same value
        mantissa, _, exponent = repr(value).partition("e")
        respelt = (
            mantissa + ("0" if "." in mantissa else ".0") + (f"E{exponent}" if exponent else "")
        )
        for spelling in (json.dumps(value), respelt):
            assert await db.fetchval(CANONICAL_SQL, spelling) == expected, (bits, spelling)


async def test_rfc8785_section_3_2_2_and_3_2_3_examples(db: asyncpg.Connection) -> None:
    text = r"""{
      "numbers": [333333333.3333333, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"""
    assert await db.fetchval(CANONICAL_SQL, text) == (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    keys = {
        "\u20ac": "Euro Sign",
        "\r": "Carriage Return",
        "\ufb33": "Hebrew Letter Dalet With Dagesh",
        "1": "One",
        "\U0001f600": "Emoji: Grinning Face",
        "\u0080": "Control",
        "\u00f6": "Latin Small Letter O With Diaeresis",
    }
    printed = await db.fetchval(CANONICAL_SQL, json.dumps(keys))
    # UTF-16 code units: U+1F600 (D83D DE00) sorts before U+FB33
    assert list(json.loads(printed)) == [
        "\r",
        "1",
        "\u0080",
        "\u00f6",
        "\u20ac",
        "\U0001f600",
        "\ufb33",
    ]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("[9007199254740993]", "payload[0]"),
        ('{"a": {"b": 1152921504606846976}}', "payload.a.b"),
        ('{"x": 3.14159265358979323846}', "payload.x"),
        ('{"x": 1e400}', "payload.x"),
        ('{"x": [1e-400]}', "payload.x[0]"),
        ("[" * 65 + "]" * 65, "payload" + "[0]" * 64),
    ],
)
async def test_what_a_double_does_not_carry_is_refused_with_where(
    db: asyncpg.Connection, value: str, path: str
) -> None:
    assert await db.fetchval(CANONICAL_SQL, value) is None
    problem = await db.fetchval("SELECT outbox_relay_json_problem($1::jsonb, 'payload')", value)
    assert problem[0] == path


_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(
                st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=6
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=24,
)


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=_JSON)
async def test_the_canonical_text_is_the_consumers_own(db: asyncpg.Connection, value: Any) -> None:
    # contracts.envelope.canonical_json is what data_digest (the consumers' check) uses.
    sent = json.dumps(value, ensure_ascii=False)
    assert await db.fetchval(CANONICAL_SQL, sent) == canonical_json(value).decode("utf-8")


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    job_ref=st.text(
        st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1
    ),
    kind=st.sampled_from(list(OutcomeKind)),
    outcome_ref=st.text(
        st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), min_size=1
    ),
)
async def test_the_event_id_is_the_one_scoring_event_id_derives(
    db: asyncpg.Connection, job_ref: str, kind: OutcomeKind, outcome_ref: str
) -> None:
    derived = await db.fetchval(
        "SELECT outbox_relay_terminal_event_id($1, $2, $3)", job_ref, kind.value, outcome_ref
    )
    assert derived == terminal_event_id(job_ref, kind, outcome_ref)


async def test_the_pinned_id_is_derived_in_sql_too(db: asyncpg.Connection) -> None:
    assert await db.fetchval(
        "SELECT outbox_relay_terminal_event_id('job-7f3a', 'completed', 'r-1')"
    ) == uuid.UUID("6f78001f-93f1-823d-896f-5877aa77314a")


@pytest.mark.parametrize("causation_ref", [None, "cause-ü"])
async def test_the_whole_body_is_canonical_text(
    db: asyncpg.Connection, causation_ref: str | None
) -> None:
    # The envelope is assembled member by member (its names are fixed): held to JCS here.
    body = await db.fetchval(
        "SELECT outbox_relay_event_body(outbox_relay_prepare_event('completed', 'job-é', 'r-1',"
        " $1::jsonb, 'urn:scoring/é', 'tenant-\u00fc', 'corr\"1', '1', $2, NULL, NULL, NULL,"
        " NULL, 1000000), 1767225600123)",
        json.dumps({"z": [1e30, "\u2028"], "a": {"\ud83d\ude00": None, "\ufb33": True}}),
        causation_ref,
    )
    assert body == canonical_json(json.loads(body)).decode("utf-8")
    envelope = json.loads(body)["envelope"]
    assert (envelope["causation_ref"], envelope["occurred_at_unix_ms"]) == (
        causation_ref,
        1767225600123,
    )


# -- the size the writer checks is the size the relay sends ----------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        {"score": 0.73, "labels": ["a", "b"]},
        {"big": 1e300, "small": 1e-300, "n": [1e21, -1e22, 1.5e-7, 123456789012345680000]},
        {"text": 'é\u20ac\U0001f600 "quoted" \\ \n\t\x01', "nested": {"ü": [None, True, {}]}},
    ],
)
async def test_max_event_bytes_bounds_the_record_value_exactly(
    db: asyncpg.Connection,
    details: EventDetails,
    complete_claimed: CompleteClaimed,
    payload: dict[str, object],
) -> None:
    # The relay sends the stored jsonb as compact JSON (relay/records.py): numbers as jsonb
    # prints them, which for 1e+300 is 301 digits.
    tr = db.transaction()
    await tr.start()
    await complete_claimed(payload=payload)
    [row] = await events(db)
    await tr.rollback()
    value = msgspec.json.format(row["payload"].encode(), indent=-1)
    one_short = dataclasses.replace(details, max_event_bytes=len(value) - 1)
    with pytest.raises(InvalidArgument) as refused:
        await complete_claimed(payload=payload, event=one_short)
    assert refused.value.field == "payload"
    exact = dataclasses.replace(details, max_event_bytes=len(value))
    written = await complete_claimed(payload=payload, event=exact)
    assert written.enqueue is Enqueue.INSERTED


async def test_a_header_set_of_exactly_its_limit_is_taken(
    db: asyncpg.Connection, details: EventDetails, complete_claimed: CompleteClaimed
) -> None:
    others = (details.schema_version, details.correlation_ref, details.causation_ref or "")
    tenant = "t" * (MAX_HEADER_SET_BYTES - sum(len(ref) for ref in others))
    written = await complete_claimed(event=dataclasses.replace(details, tenant_ref=tenant))
    assert written.enqueue is Enqueue.INSERTED


# -- called from SQL ----------------------------------------------------------------------------

COMPLETE_SQL = """
SELECT * FROM outbox_relay_complete_job(
    job_ref => $1, fencing_token => $2, result_ref => 'r-1', source => 'urn:sql',
    tenant_ref => 'tenant-a', correlation_ref => 'corr-1', schema_version => '1',
    payload => '{"score": 1.0}')
"""


async def test_a_refusal_is_a_row_and_the_callers_transaction_goes_on(
    db: asyncpg.Connection,
) -> None:
    claimed = await leased_job(db)
    async with db.transaction():
        await db.execute("CREATE TABLE caller_work (n integer)")
        await db.execute("INSERT INTO caller_work VALUES (1)")
        refused = await db.fetchrow(COMPLETE_SQL, "job-1", claimed.fencing_token + 1)
        assert (refused["outcome"], refused["refusal"]) == ("refused", "stale_lease")
        assert json.loads(refused["refusal_detail"]) == {
            "given": claimed.fencing_token + 1,
            "current": claimed.fencing_token,
        }
        assert await db.fetchval("SELECT count(*) FROM outbox") == 0
        # still usable: the right fence completes in the same transaction
        done = await db.fetchrow(COMPLETE_SQL, "job-1", claimed.fencing_token)
        assert (done["outcome"], done["enqueue"]) == ("completed", "inserted")
        await db.execute("INSERT INTO caller_work VALUES (2)")
    assert await db.fetchval("SELECT count(*) FROM caller_work") == 2
    [event] = await events(db)
    # the payload is stored canonical, whatever spelling the caller sent
    assert json.loads(event["payload"])["data"]["result"] == {"score": 1}
    assert '"score": 1}' in event["payload"]


async def test_a_conflicting_replay_raises_or001_with_the_event_id(
    db: asyncpg.Connection,
) -> None:
    claimed = await leased_job(db)
    event_id = terminal_event_id("job-1", OutcomeKind.COMPLETED, "r-1")
    await db.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type) VALUES ($1, 'other', 'x', 'y')",
        event_id,
    )
    tr = db.transaction()
    await tr.start()
    with pytest.raises(asyncpg.PostgresError) as raised:
        await db.fetchrow(COMPLETE_SQL, "job-1", claimed.fencing_token)
    assert raised.value.sqlstate == "OR001"
    assert raised.value.detail == str(event_id)
    with pytest.raises(asyncpg.InFailedSQLTransactionError):
        await db.fetchval("SELECT 1")
    await tr.rollback()
    assert (await job(db))["scoring_state"] == "leased"


async def test_expiry_without_details_leaves_spent_jobs_for_a_call_with_theirs(
    db: asyncpg.Connection,
) -> None:
    await put(db, EXPIRED_LAST_ATTEMPT, "job-1")
    [row] = await db.fetch("SELECT * FROM outbox_relay_expire_leases(10)")
    assert (row["job_ref"], row["outcome"]) == ("job-1", "needs_event_details")
    assert (await job(db))["scoring_state"] == "leased"
    [row] = await db.fetch(
        """SELECT * FROM outbox_relay_expire_leases(1, source => 'urn:sql', tenant_ref => 'tenant-b',
           correlation_ref => 'corr-b', schema_version => '1', job_refs => ARRAY['job-1'])"""
    )
    assert (row["outcome"], row["enqueue"]) == ("quarantined", "inserted")
    [event] = await events(db)
    assert event["tenant_ref"] == "tenant-b"


async def test_the_sql_defaults_are_the_python_ones(db: asyncpg.Connection) -> None:
    for name in CALLS - {"outbox_relay_expire_leases"}:
        arguments = await db.fetchval(
            "SELECT pg_get_function_arguments(oid) FROM pg_proc WHERE proname = $1", name
        )
        assert f"max_event_bytes bigint DEFAULT {DEFAULT_MAX_EVENT_BYTES}" in arguments, name


# -- below the functions' migration ---------------------------------------------------------------


def test_the_writer_names_the_migration_that_ships_its_functions() -> None:
    assert f"{REQUIRED_MIGRATION}.sql" in [m.file_name for m in load_migrations()]


async def test_below_the_functions_migration_the_writer_says_which_one_is_missing(
    pg_server: PostgresServer, template_database: str, details: EventDetails
) -> None:
    name = await scratch_database(pg_server.url, "template0")
    try:
        conn = await asyncpg.connect(with_database(pg_server.url, name))
        try:
            older = [m for m in load_migrations() if m.file_name < f"{REQUIRED_MIGRATION}.sql"]
            await apply(conn, older)
            claimed = await leased_job(conn)
            calls = [
                complete_job(conn, job_ref="job-1", fencing_token=1, result_ref="r", event=details),
                fail_job_permanently(
                    conn, job_ref="job-1", fencing_token=1, cause_code="c", event=details
                ),
                fail_retryable(
                    conn,
                    job_ref="job-1",
                    fencing_token=claimed.fencing_token,
                    cause_code="c",
                    retry_delay_ms=0,
                    event=details,
                ),
                expire_leases(conn, limit=1, event=details),
            ]
            for call in calls:
                with pytest.raises(WriterNotMigrated) as behind:
                    await call
                assert behind.value.migration == REQUIRED_MIGRATION
                assert REQUIRED_MIGRATION in str(behind.value)
                assert "outbox-relay migrate" in str(behind.value)
            assert (await job(conn))["scoring_state"] == "leased"
        finally:
            await conn.close()
    finally:
        await drop_database(pg_server.url, name)
