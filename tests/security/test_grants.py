"""``outbox-relay grant``: each part's role holds exactly its privileges on every object.

Real PostgreSQL (each server of the run). Too much fails as well as too little: the matrix
covers every table, sequence and function of the schema, effective privileges included
(PUBLIC, memberships).
"""

from __future__ import annotations

import asyncpg
import pytest

from migrations.grants import (
    FUNCTIONS,
    PUBLIC_FUNCTIONS,
    SEQUENCES,
    TABLES,
    apply_plan,
    plan_grants,
    read_facts,
    render_pending,
    render_script,
)
from migrations.runner import apply, load_migrations
from tests.security.conftest import MakeRole
from tests.security.process import run_cli
from tests.support import expected_privileges
from tests.support.roles import create_login_role, drop_role, grant, privilege_matrix


@pytest.mark.parametrize("part", ["writer", "scoring-worker", "event-writer", "relay", "sidecar"])
async def test_each_part_holds_exactly_its_matrix(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, part: str
) -> None:
    role = await make_role(part)
    await grant(database_url, role.name, part)
    assert await privilege_matrix(db, role.name) == expected_privileges.BY_PART[part]


async def test_relay_and_sidecar_in_one_process_hold_the_union(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("run")
    await grant(database_url, role.name, "relay", "sidecar")
    assert await privilege_matrix(db, role.name) == expected_privileges.RELAY_AND_SIDECAR


async def test_grant_again_changes_nothing_and_fewer_parts_take_the_rest_away(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("again")
    await grant(database_url, role.name, "relay")
    await grant(database_url, role.name, "relay")
    assert await privilege_matrix(db, role.name) == expected_privileges.RELAY
    await db.execute(f'GRANT ALL ON outbox, scoring_job_state TO "{role.name}"')
    await grant(database_url, role.name, "sidecar")
    assert await privilege_matrix(db, role.name) == expected_privileges.SIDECAR


async def test_after_a_fresh_migrate_each_part_holds_exactly_its_matrix(
    empty_database_url: str,
) -> None:
    conn = await asyncpg.connect(empty_database_url)
    roles = []
    try:
        await apply(conn, load_migrations())
        for part, expected in expected_privileges.BY_PART.items():
            role = await create_login_role(conn, empty_database_url, part)
            roles.append(role.name)
            await grant(empty_database_url, role.name, part)
            assert await privilege_matrix(conn, role.name) == expected, part
    finally:
        for name in roles:
            await drop_role(conn, name)
        await conn.close()


async def test_every_object_of_the_migrated_schema_has_a_place_in_the_model(
    db: asyncpg.Connection, make_role: MakeRole
) -> None:
    # A migration that adds a table, sequence or function must say who may use it.
    role = await make_role("probe")
    objects = set(await privilege_matrix(db, role.name)) - {"schema public"}
    modelled = {*TABLES, *(f"sequence {s}" for s in SEQUENCES)}
    modelled |= {f"function {f}" for f in (*FUNCTIONS, *PUBLIC_FUNCTIONS)}
    assert objects == modelled


async def test_a_table_another_role_owns_is_left_to_that_owner_with_its_statement(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # Production: the relay's objects belong to the role that ran migrate, the job table to
    # the scoring service. Neither is a superuser.
    schema_owner = await make_role("owner")
    scoring_owner = await make_role("scoring")
    writer = await make_role("writer")
    for table in TABLES:
        owner = scoring_owner if table == "scoring_job_state" else schema_owner
        await db.execute(f'ALTER TABLE {table} OWNER TO "{owner.name}"')
    for function in FUNCTIONS:
        await db.execute(f'ALTER FUNCTION {function} OWNER TO "{schema_owner.name}"')

    conn = await asyncpg.connect(schema_owner.url)
    try:
        plan = plan_grants(writer.name, ("writer",), await read_facts(conn, writer.name))
        await apply_plan(conn, plan)
    finally:
        await conn.close()
    pending = render_pending(plan)
    assert pending[0] == (
        f"scoring_job_state is owned by {scoring_owner.name}, which this session is not; "
        "that owner must run:"
    )
    partial = await privilege_matrix(db, writer.name)
    assert partial == {**expected_privileges.WRITER, "scoring_job_state": "—"}

    # The owner runs exactly the printed statements; then the writer holds its whole expected_privileges.
    (step,) = plan.owner_steps
    owner_conn = await asyncpg.connect(scoring_owner.url)
    try:
        for statement in step.statements:
            await owner_conn.execute(statement)
    finally:
        await owner_conn.close()
    assert await privilege_matrix(db, writer.name) == expected_privileges.WRITER


async def test_pg_read_all_stats_is_a_separate_step_with_its_reason(
    database_url: str, db: asyncpg.Connection, make_role: MakeRole
) -> None:
    role = await make_role("stats")
    plan = plan_grants(role.name, ("sidecar",), await read_facts(db, role.name))
    (step,) = plan.privileged_steps
    assert step.statements == (f'GRANT pg_read_all_stats TO "{role.name}"',)
    assert "other roles' open transactions" in step.reason
    assert not any("pg_read_all_stats" in s for s in plan.statements)
    # Once given by a superuser, it is not asked for again.
    await db.execute(step.statements[0])
    plan = plan_grants(role.name, ("sidecar",), await read_facts(db, role.name))
    assert plan.privileged_steps == ()
    # The writer never needs it.
    plan = plan_grants(role.name, ("writer",), await read_facts(db, role.name))
    assert plan.privileged_steps == ()


async def test_cli_print_shows_the_sql_and_changes_nothing(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("print")
    before = await privilege_matrix(db, role.name)
    done = run_cli(
        "grant", "--database-url", database_url, "--to", role.name, "--as", "relay", "--print"
    )
    assert done.returncode == 0, done.stderr
    assert await privilege_matrix(db, role.name) == before
    plan = plan_grants(role.name, ("relay",), await read_facts(db, role.name))
    assert done.stdout.strip() == render_script(plan)
    assert "REVOKE ALL ON TABLE public.outbox FROM" in done.stdout
    assert f'GRANT pg_read_all_stats TO "{role.name}";' in done.stdout


async def test_cli_grant_applies_and_says_what_is_left(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    role = await make_role("cli")
    argv = ["grant", "--database-url", database_url, "--to", role.name, "--as", "sidecar"]
    done = run_cli(*argv)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert (
        lines[0]
        == f"role {role.name} now holds exactly what sidecar needs on this database's objects"
    )
    assert lines[1].startswith("separate step, for a superuser")
    assert lines[2] == f'  GRANT pg_read_all_stats TO "{role.name}";'
    assert await privilege_matrix(db, role.name) == expected_privileges.SIDECAR


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--to", "no_such_role_x", "--as", "writer"], "role 'no_such_role_x' does not exist"),
        (
            ["--to", "postgres", "--as", "scorer"],
            "--as must be writer, scoring-worker, event-writer, relay or sidecar",
        ),
        (["--to", "postgres"], "--as is required"),
        (["--as", "relay"], "--to is required"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    database_url: str, argv: list[str], message: str
) -> None:
    done = run_cli("grant", "--database-url", database_url, *argv)
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("outbox-relay: error: ") and message in line
    assert "outbox:outbox" not in line


def test_cli_unmigrated_database_is_one_line_and_exit_2(empty_database_url: str) -> None:
    done = run_cli(
        "grant", "--database-url", empty_database_url, "--to", "postgres", "--as", "relay"
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line == (
        "outbox-relay: error: the database was never migrated; run `outbox-relay migrate`"
    )


async def test_a_missing_grant_is_one_line_naming_it(
    database_url: str, make_role: MakeRole
) -> None:
    # Only migrate, the relay and the sidecar read the migration record: any other role is
    # refused, and must be told so.
    role = await make_role("writer")
    await grant(database_url, role.name, "event-writer")
    done = run_cli("migrate", "--verify", "--database-url", role.url)
    assert done.returncode in (1, 2)
    (line,) = done.stderr.splitlines()
    assert line.startswith("outbox-relay: error: ") and "outbox_relay_migration" in line
    assert role.password not in line


async def test_redrive_under_a_role_that_may_not_read_the_migration_record_says_what_to_grant(
    database_url: str, make_role: MakeRole
) -> None:
    # redrive checks the schema first; the advice is the relay part's grant, not migrate.
    role = await make_role("writer")
    await grant(database_url, role.name, "event-writer")
    done = run_cli("redrive", "--all", "--dry-run", "--database-url", role.url)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "outbox_relay_migration" in line and "--as relay" in line, line
    assert "run migrate" not in line, line
    assert role.password not in line
