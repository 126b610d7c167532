"""The privilege model and the plan built from it: pure, no database."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts.errors import ConfigError
from migrations.grants import (
    EXECUTE,
    FUNCTIONS,
    PARTS,
    SCORING_FUNCTIONS_OWNER,
    TABLES,
    Access,
    SchemaFacts,
    describe_access,
    merged_access,
    parse_parts,
    plan_grants,
    quote_role,
    quote_schema,
    render_pending,
    render_script,
    schema_creators_warning,
)
from tests.support import expected_privileges

DOCS = Path(__file__).resolve().parents[2] / "docs" / "security.md"
EVERY_OBJECT = frozenset({*TABLES, "outbox_seq_seq", *FUNCTIONS} | {"schema public"})


def facts(**overrides: object) -> SchemaFacts:
    values: dict[str, object] = {
        "schema": "public",
        "grantable": EVERY_OBJECT,
        "owners": {name: "owner" for name in EVERY_OBJECT},
        "role_has_schema_usage": True,
        "role_reads_all_stats": False,
        "database": "app",
        "role_settings": ("search_path=public",),
        "may_alter_role": True,
        "schema_creators": (),
    }
    values.update(overrides)
    return SchemaFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["relay"], ("relay",)),
        (["sidecar", "relay", "sidecar"], ("relay", "sidecar")),
        (["sidecar", "writer"], ("writer", "sidecar")),
        (["sidecar", "event-writer", "writer"], ("writer", "event-writer", "sidecar")),
    ],
)
def test_parts_come_back_in_model_order_without_repeats(
    given: list[str], expected: tuple[str, ...]
) -> None:
    assert parse_parts(given) == expected


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ([], "--as is required"),
        (
            ["scorer"],
            "--as must be writer, scoring-worker, event-writer, relay or sidecar, got 'scorer'",
        ),
        (["relay", "Relay"], "got 'Relay'"),
    ],
)
def test_unknown_or_missing_parts_are_config_errors(given: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_parts(given)


@pytest.mark.parametrize(
    ("name", "quoted"),
    [("relay", '"relay"'), ("user", '"user"'), ('we"ird', '"we""ird"'), ("Mixed", '"Mixed"')],
)
def test_roles_are_always_quoted(name: str, quoted: str) -> None:
    assert quote_role(name) == quoted


@pytest.mark.parametrize(
    ("name", "quoted"), [("public", "public"), ("app_1", "app_1"), ("App", '"App"')]
)
def test_schemas_are_quoted_when_they_need_it(name: str, quoted: str) -> None:
    assert quote_schema(name) == quoted


@pytest.mark.parametrize("part", PARTS)
def test_the_model_is_the_hand_written_matrix(part: str) -> None:
    for table in TABLES:
        assert (
            describe_access(merged_access(table, [part]))
            == expected_privileges.BY_PART[part][table]
        ), table


def test_whole_table_update_wins_over_columns() -> None:
    merged = Access(frozenset({"SELECT", "UPDATE"}))
    assert describe_access(merged) == "SELECT, UPDATE"
    assert merged_access("outbox", ["relay", "writer"]).update_columns == frozenset(
        {
            "attempts",
            "held_template",
            "held_topic",
            "last_error_class",
            "next_attempt_at",
            "quarantined_at",
            "size_bytes",
        }
    )


def test_docs_show_the_model() -> None:
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 1 + len(PARTS) and (name := cells[0].strip("`")) in TABLES:
            rows[name] = dict(zip(PARTS, cells[1:], strict=True))
    assert set(rows) == set(TABLES)
    for table, by_part in rows.items():
        for part, shown in by_part.items():
            assert shown == describe_access(merged_access(table, [part])), (table, part)


def test_a_session_that_owns_everything_runs_everything() -> None:
    plan = plan_grants("app", ("sidecar",), facts())
    assert plan.owner_steps == ()
    assert plan.statements[:2] == (
        'REVOKE ALL ON TABLE public.outbox FROM "app"',
        'GRANT SELECT ON TABLE public.outbox TO "app"',
    )
    assert "REVOKE EXECUTE ON FUNCTION public.outbox_relay_notify() FROM PUBLIC" in plan.statements
    assert not any("GRANT USAGE ON SCHEMA" in s for s in plan.statements)


def test_objects_of_another_owner_become_that_owners_step() -> None:
    owners = {name: "owner" for name in EVERY_OBJECT} | {"scoring_job_state": "scoring"}
    plan = plan_grants(
        "app", ("writer",), facts(grantable=EVERY_OBJECT - {"scoring_job_state"}, owners=owners)
    )
    (step,) = plan.owner_steps
    assert step.reason.startswith("scoring_job_state is owned by scoring, ")
    assert all("scoring_job_state" in s for s in step.statements)
    assert not any("scoring_job_state" in s for s in plan.statements)
    assert render_pending(plan)[0] == f"{step.reason}:"


@pytest.mark.parametrize("part", ["scoring-worker", "writer"])
def test_the_scoring_functions_are_executed_by_the_scoring_worker_and_the_writer_only(
    part: str,
) -> None:
    calls = sorted(EXECUTE)
    assert [c.split("(")[0] for c in calls] == [
        "outbox_relay_complete_job",
        "outbox_relay_expire_leases",
        "outbox_relay_fail_job_permanently",
        "outbox_relay_fail_retryable",
    ]
    granted = [
        s.removeprefix("GRANT EXECUTE ON FUNCTION public.").removesuffix(' TO "app"')
        for s in plan_grants("app", (part,), facts()).statements
        if s.startswith("GRANT EXECUTE")
    ]
    assert sorted(granted) == calls
    for other in ("event-writer", "relay", "sidecar"):
        statements = plan_grants("app", (other,), facts()).statements
        assert not any(s.startswith("GRANT EXECUTE") for s in statements), other
    # Every function, the helpers included, is taken from PUBLIC.
    revoked = [s for s in plan_grants("app", (part,), facts()).statements if "FROM PUBLIC" in s]
    assert len(revoked) == len(FUNCTIONS)


def test_the_scoring_functions_owner_is_no_grant_target() -> None:
    # Its privileges come from migration 0012; a plan for it would revoke its own EXECUTE.
    with pytest.raises(ConfigError, match=SCORING_FUNCTIONS_OWNER):
        plan_grants(SCORING_FUNCTIONS_OWNER, ("writer",), facts())


def test_the_scoring_worker_gets_nothing_on_any_table() -> None:
    plan = plan_grants("app", ("scoring-worker",), facts())
    table_grants = [s for s in plan.statements if s.startswith("GRANT") and " TABLE " in s]
    assert table_grants == []
    assert {s for s in plan.statements if s.startswith("REVOKE ALL ON TABLE")} == {
        f'REVOKE ALL ON TABLE public.{table} FROM "app"' for table in TABLES
    }


def test_schema_usage_is_granted_only_when_missing() -> None:
    plan = plan_grants("app", ("relay",), facts(role_has_schema_usage=False))
    assert plan.statements[0] == 'GRANT USAGE ON SCHEMA public TO "app"'


@pytest.mark.parametrize(
    ("parts", "reads_all_stats", "asked"),
    [
        (("sidecar",), False, True),
        (("relay",), False, True),
        (("writer",), False, False),
        (("relay", "sidecar"), True, False),
    ],
)
def test_pg_read_all_stats_is_asked_for_only_by_parts_that_want_it_and_lack_it(
    parts: tuple[str, ...], reads_all_stats: bool, asked: bool
) -> None:
    plan = plan_grants("app", parts, facts(role_reads_all_stats=reads_all_stats))
    assert bool(plan.privileged_steps) is asked
    assert not any("pg_read_all_stats" in s for s in plan.statements)


def test_the_script_is_one_transaction_then_the_steps_left_to_others() -> None:
    plan = plan_grants("app", ("sidecar",), facts())
    lines = render_script(plan).splitlines()
    assert lines[0] == "-- outbox-relay grant: sidecar for role app"
    assert lines[1] == "BEGIN;"
    commit = lines.index("COMMIT;")
    assert lines[commit + 1].startswith("-- separate step, for a superuser")
    assert lines[commit + 2] == 'GRANT pg_read_all_stats TO "app";'


def test_the_event_writer_inserts_the_contract_columns_and_nothing_else() -> None:
    access = merged_access("outbox", ["event-writer"])
    assert access.privileges == frozenset()
    assert access.insert_columns == frozenset(expected_privileges.EVENT_WRITER_COLUMNS)
    # With the scoring service's part on the same role, whole-table INSERT wins.
    both = merged_access("outbox", ["writer", "event-writer"])
    assert both == merged_access("outbox", ["writer"])
    plan = plan_grants("app", ("event-writer",), facts())
    assert plan.statements[:2] == (
        'REVOKE ALL ON TABLE public.outbox FROM "app"',
        "GRANT INSERT (aggregateid, aggregatetype, causation_ref, correlation_ref, headers, id, "
        "payload, schema_version, tenant_ref, topic, traceparent, tracestate, type) "
        'ON TABLE public.outbox TO "app"',
    )


def test_the_roles_search_path_is_pinned_once_and_by_whoever_may() -> None:
    statement = 'ALTER ROLE "app" IN DATABASE "app" SET search_path = public'
    plan = plan_grants("app", ("relay",), facts(role_settings=()))
    assert statement in plan.statements
    plan = plan_grants("app", ("relay",), facts(role_settings=('search_path="$user", public',)))
    assert statement in plan.statements
    plan = plan_grants("app", ("relay",), facts())
    assert not any("search_path" in s for s in plan.statements)
    plan = plan_grants("app", ("relay",), facts(role_settings=(), may_alter_role=False))
    assert statement not in plan.statements
    (step,) = [s for s in plan.privileged_steps if statement in s.statements]
    assert step.reason.startswith("separate step, for a superuser (or a role with CREATEROLE")
    # A schema whose name needs quoting is quoted on the path as everywhere else.
    plan = plan_grants("app", ("relay",), facts(schema="Outbox App", role_settings=()))
    assert 'ALTER ROLE "app" IN DATABASE "app" SET search_path = "Outbox App"' in plan.statements
    plan = plan_grants(
        "app", ("relay",), facts(schema="Outbox App", role_settings=('search_path="Outbox App"',))
    )
    assert not any("search_path" in s for s in plan.statements)


@pytest.mark.parametrize(
    "name",
    [
        "x\nALTER ROLE x SUPERUSER;--",
        "x\r\nDROP TABLE outbox;--",
        "x\n\\! touch /tmp/owned",
        "x\u2028y",
        "x\x1b]0;title\x07",
        "x\x9b2J",
    ],
)
def test_names_in_comment_lines_cannot_end_them_or_drive_a_terminal(name: str) -> None:
    owners = {n: "owner" for n in EVERY_OBJECT} | {"scoring_job_state": name}
    plan = plan_grants(
        name,
        ("writer", "sidecar"),
        facts(grantable=EVERY_OBJECT - {"scoring_job_state"}, owners=owners),
    )
    script = render_script(plan)
    comments = [line for line in script.split("\n") if line.startswith("--")]
    assert comments[0] == f"-- outbox-relay grant: writer, sidecar for role {name!r}"
    assert comments[1].startswith(f"-- scoring_job_state is owned by {name!r}, ")
    for line in [*comments, *(s.reason for s in (*plan.owner_steps, *plan.privileged_steps))]:
        assert line.isprintable(), line
    # Every line of the script is a comment, a transaction bracket, or part of a statement
    # that began on a line of its own.
    statement_starts = ("REVOKE ", "GRANT ", "ALTER ROLE ")
    in_statement = False
    for line in script.split("\n"):
        if not in_statement:
            assert line.startswith(("--", "BEGIN;", "COMMIT;", *statement_starts)), line
            in_statement = line.startswith(statement_starts)
        if in_statement and line.endswith(";"):
            in_statement = False
    assert render_pending(plan)[0] == comments[1].removeprefix("-- ")


@pytest.mark.parametrize(
    ("creators", "expected"),
    [
        ((), None),
        (
            ("PUBLIC",),
            "PUBLIC may create objects in schema public besides its owner",
        ),
        (
            ("PUBLIC", "app", "x\ny"),
            "PUBLIC and roles app, 'x\\ny' may create objects in schema public besides its owner",
        ),
    ],
)
def test_others_that_may_create_in_the_schema_are_one_warning_line(
    creators: tuple[str, ...], expected: str | None
) -> None:
    warning = schema_creators_warning(facts(schema_creators=creators))
    if expected is None:
        assert warning is None
        return
    assert warning is not None and warning.startswith(expected), warning
    assert warning.isprintable(), warning
    assert "REVOKE CREATE ON SCHEMA public FROM" in warning
