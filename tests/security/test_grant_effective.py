"""``outbox-relay grant`` checks what the role can really do once it has applied its plan:
privileges from PUBLIC, from another grantor or through a role membership, which its
``REVOKE`` cannot take away, are named with their source, and it never says "exactly" while
one remains. Roles it must not be given to are refused. Real PostgreSQL, each server."""

from __future__ import annotations

import asyncpg
import pytest

from migrations.excess import Excess, find_excess, render_excess
from migrations.grants import Privilege, needed_privileges
from tests.security.conftest import MakeRole
from tests.security.process import run_cli
from tests.support import expected_privileges
from tests.support.roles import grant, privilege_matrix

EXIT_EXCESS = 1
EXIT_REFUSED = 2


def grant_cli(database_url: str, role: str, *parts: str) -> tuple[int, list[str], str]:
    argv = ["grant", "--database-url", database_url, "--to", role]
    for part in parts:
        argv += ["--as", part]
    if "event-writer" in parts:
        argv.append("--any-route")
    done = run_cli(*argv)
    return done.returncode, done.stdout.splitlines(), done.stderr


async def test_excess_from_public_a_grantor_and_a_membership_is_named_never_exactly(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # The review's run (N10): the owner gave PUBLIC a read of the outbox, a role holding
    # GRANT OPTION passed a read of the receipts to writer A, and writer B was made a
    # member of the scoring writer's role.
    grantor, writer = await make_role("grantor"), await make_role("writer")
    a, b = await make_role("ew_a"), await make_role("ew_b")
    await grant(database_url, writer.name, "writer")
    await db.execute("GRANT SELECT ON outbox TO PUBLIC")
    await db.execute(f'GRANT SELECT ON outbox_receipt TO "{grantor.name}" WITH GRANT OPTION')
    as_grantor = await asyncpg.connect(grantor.url)
    try:
        await as_grantor.execute(f'GRANT SELECT ON outbox_receipt TO "{a.name}"')
    finally:
        await as_grantor.close()
    await db.execute(f'GRANT "{writer.name}" TO "{b.name}"')

    code, lines, stderr = grant_cli(database_url, a.name, "event-writer")
    assert code == EXIT_EXCESS, stderr
    assert not any("exactly" in line for line in lines), lines
    assert lines == [
        f"role {a.name} can do more than event-writer needs on this database's objects, "
        "from sources grant does not take away:",
        "  outbox: SELECT (from PUBLIC)",
        f"  outbox_receipt: SELECT (granted by {grantor.name})",
    ]
    # What it names is what the server says the role can do.
    held = await privilege_matrix(db, a.name)
    assert held["outbox"].startswith("SELECT, INSERT(") and held["outbox_receipt"] == "SELECT"

    code, lines, stderr = grant_cli(database_url, b.name, "event-writer")
    assert code == EXIT_EXCESS, stderr
    assert not any("exactly" in line for line in lines), lines
    assert lines == [
        f"role {b.name} can do more than event-writer needs on this database's objects, "
        "from sources grant does not take away:",
        "  outbox: SELECT (from PUBLIC)",
        f"  outbox: SELECT, INSERT (through role {writer.name})",
        f"  outbox_receipt: SELECT (through role {writer.name})",
        f"  scoring_job_state: {expected_privileges.WRITER['scoring_job_state']} (through role {writer.name})",
    ]
    held = await privilege_matrix(db, b.name)
    assert held["scoring_job_state"] == expected_privileges.WRITER["scoring_job_state"]

    # Once the sources are gone, grant says "exactly" again and exits 0.
    await db.execute("REVOKE SELECT ON outbox FROM PUBLIC")
    await db.execute(f'REVOKE SELECT ON outbox_receipt FROM "{grantor.name}" CASCADE')
    await db.execute(f'REVOKE "{writer.name}" FROM "{b.name}"')
    for role in (a, b):
        code, lines, stderr = grant_cli(database_url, role.name, "event-writer")
        assert (code, lines) == (
            0,
            [
                f"role {role.name} now holds exactly what event-writer needs on this "
                "database's objects"
            ],
        ), stderr
        assert await privilege_matrix(db, role.name) == expected_privileges.EVENT_WRITER


async def test_a_membership_the_role_can_only_set_is_an_excess_too(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # NOINHERIT: the role's own privileges stay those of its part, but SET ROLE gives it
    # the relay's.
    relay, sidecar = await make_role("relay"), await make_role("sidecar")
    await grant(database_url, relay.name, "relay")
    await db.execute(f'ALTER ROLE "{sidecar.name}" NOINHERIT')
    await db.execute(f'GRANT "{relay.name}" TO "{sidecar.name}"')
    code, lines, stderr = grant_cli(database_url, sidecar.name, "sidecar")
    assert code == EXIT_EXCESS, stderr
    assert await privilege_matrix(db, sidecar.name) == expected_privileges.SIDECAR
    assert (
        "  outbox: DELETE, UPDATE(attempts, held_template, held_topic, last_error_class, "
        f"next_attempt_at, quarantined_at, size_bytes) (through role {relay.name})" in lines
    ), lines
    assert f"  sequence outbox_seq_seq: SELECT (through role {relay.name})" in lines, lines


async def test_what_the_parts_need_is_no_excess_whatever_its_source(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole
) -> None:
    # The sidecar reads the outbox anyway: PUBLIC's read of it takes nothing more.
    role = await make_role("sidecar")
    await db.execute("GRANT SELECT ON outbox TO PUBLIC")
    code, lines, stderr = grant_cli(database_url, role.name, "sidecar")
    assert code == 0, stderr
    assert (
        lines[0]
        == f"role {role.name} now holds exactly what sidecar needs on this database's objects"
    )


@pytest.mark.parametrize("kind", ["table owner", "schema owner", "superuser", "predefined"])
async def test_roles_grant_cannot_narrow_are_refused_in_one_line(
    db: asyncpg.Connection, database_url: str, make_role: MakeRole, kind: str
) -> None:
    # An owner or a superuser can do everything whatever it is granted, and a predefined
    # role is the server's: granting a part to one would only claim a narrowing.
    if kind == "superuser":
        target = str(await db.fetchval("SELECT current_user"))
        expected, restore = "is a superuser", ""
    elif kind == "predefined":
        target = "pg_monitor"
        expected, restore = "is a predefined role", ""
    else:
        owner = await make_role("owner")
        target = owner.name
        if kind == "table owner":
            was = await db.fetchval(
                "SELECT relowner::regrole::text FROM pg_class WHERE relname = 'outbox_receipt'"
            )
            await db.execute(f'ALTER TABLE outbox_receipt OWNER TO "{owner.name}"')
            expected, restore = "owns outbox_receipt", f"ALTER TABLE outbox_receipt OWNER TO {was}"
        else:
            was = await db.fetchval(
                "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'public'"
            )
            await db.execute(f'ALTER SCHEMA public OWNER TO "{owner.name}"')
            expected, restore = "owns schema public", f"ALTER SCHEMA public OWNER TO {was}"
    try:
        before = await privilege_matrix(db, target)
        for extra in ((), ("--print",)):
            done = run_cli(
                "grant", "--database-url", database_url, "--to", target, "--as", "relay", *extra
            )
            assert done.returncode == EXIT_REFUSED, done.stdout
            assert done.stdout == ""
            (line,) = done.stderr.splitlines()
            assert line.startswith(f"outbox-relay: error: --to {target} "), line
            assert expected in line, line
        assert await privilege_matrix(db, target) == before  # nothing was changed
    finally:
        if restore:
            await db.execute(restore)  # before the role is dropped with what it owns


# -- the comparison itself (pure) ------------------------------------------------------------
def test_a_column_privilege_is_covered_by_the_whole_tables_and_not_the_reverse() -> None:
    needed = needed_privileges(["sidecar", "event-writer"])
    held = {
        "r": frozenset(
            {
                Privilege("outbox", "SELECT", "payload"),  # within the sidecar's SELECT
                Privilege("outbox", "INSERT", "payload"),  # one of the event columns
                Privilege("outbox", "INSERT"),  # every column: more than the event's
            }
        ),
        "public": frozenset({Privilege("outbox", "INSERT")}),
    }
    assert find_excess("r", needed, held, {}) == (Excess("outbox", "INSERT", "from PUBLIC"),)


def test_each_source_gets_its_line_in_model_order() -> None:
    seq = Privilege("sequence outbox_seq_seq", "UPDATE")
    held = {
        "r": frozenset(
            {
                seq,
                Privilege("outbox_receipt", "UPDATE", "topic"),
                Privilege("outbox_receipt", "UPDATE", "kafka_offset"),  # from nowhere known
            }
        ),
        "public": frozenset(),
        "m": frozenset(
            {
                Privilege("outbox_receipt", "UPDATE", "topic"),
                Privilege("outbox_receipt", "DELETE"),
                Privilege("outbox", "TRUNCATE"),
            }
        ),
    }
    given = {seq: frozenset({"g2", "g1"})}
    assert find_excess("r", needed_privileges(["sidecar"]), held, given) == (
        Excess("outbox", "TRUNCATE", "through role m"),
        Excess("outbox_receipt", "UPDATE(kafka_offset)", "from a source grant cannot name"),
        Excess("outbox_receipt", "DELETE, UPDATE(topic)", "through role m"),
        Excess("sequence outbox_seq_seq", "UPDATE", "granted by g1"),
        Excess("sequence outbox_seq_seq", "UPDATE", "granted by g2"),
    )
    assert render_excess("r", ["sidecar"], ()) == []
