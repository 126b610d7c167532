"""Which part needs which privilege on which schema object, and the SQL that grants exactly that.

The schema's migrations create the objects; this module says, next to them, what the writer,
the scoring worker, the event writer, the relay and the health sidecar may do with each. ``outbox-relay grant``
turns the model into ``REVOKE``/``GRANT`` statements for one existing role: everything the
role held on these objects is replaced by the union of its parts' needs, so running it again
changes nothing and running it with fewer parts takes the rest away. It also pins the role's
``search_path`` in the database to the relay's schema.

Every table, sequence and function the migrations create has an entry here (the tests hold
the migrated schema to it), so a migration that adds an object must say who may use it, and
``grant`` must be run again after ``migrate`` for the new object's privileges.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import asyncpg

from contracts.errors import ConfigError, OutboxRelayError

WRITER: Final = "writer"
SCORING_WORKER: Final = "scoring-worker"
EVENT_WRITER: Final = "event-writer"
RELAY: Final = "relay"
SIDECAR: Final = "sidecar"
PARTS: Final = (WRITER, SCORING_WORKER, EVENT_WRITER, RELAY, SIDECAR)

# The NOLOGIN role that owns the scoring functions (migration 0012), which run with its
# privileges: exactly the writer part's on the tables, which that migration grants it.
SCORING_FUNCTIONS_OWNER: Final = "outbox_relay_scoring_functions"

ROUTES_TABLE: Final = "outbox_relay_writer_route"

# The columns a writer inserts (the Debezium core and the documented extras); every other
# column of the outbox is the relay's bookkeeping or the database's.
EVENT_COLUMNS: Final = (
    "id",
    "aggregatetype",
    "aggregateid",
    "type",
    "payload",
    "tenant_ref",
    "schema_version",
    "correlation_ref",
    "causation_ref",
    "traceparent",
    "tracestate",
    "headers",
    "topic",
)


@dataclass(frozen=True)
class WriterRoutes:
    """Where an event writer's rows may go (migration 0011, outbox_relay_writer_route): rows
    routed by the relay's template, by their aggregatetype; rows with a topic of their own,
    by its prefix. ``grant --as event-writer`` writes them."""

    aggregatetypes: tuple[str, ...] = ()
    topic_prefixes: tuple[str, ...] = ()


class GrantError(OutboxRelayError):
    """The schema is not migrated, or the server refused a grant (exit 1)."""


@dataclass(frozen=True)
class Access:
    """What one part may do on one table: whole-table privileges, the columns it may update
    and the columns it may insert."""

    privileges: frozenset[str] = frozenset()
    update_columns: frozenset[str] = frozenset()
    insert_columns: frozenset[str] = frozenset()


def _access(*privileges: str, update: Iterable[str] = (), insert: Iterable[str] = ()) -> Access:
    return Access(frozenset(privileges), frozenset(update), frozenset(insert))


# Column-level UPDATE where a part changes only its own bookkeeping: the relay can mark a
# row failed or quarantined (and record where it holds its key), and have the door measure
# a row stored before it (setting size_bytes fires the trigger that measures; nobody can
# set it), but never rewrite an event; it can move a lane's lease but never renumber lanes.
_OUTBOX_FAILURE_COLUMNS = (
    "attempts",
    "last_error_class",
    "next_attempt_at",
    "quarantined_at",
    "held_topic",
    "held_template",
    "size_bytes",
)
_RECEIPT_REPUBLISH_COLUMNS = ("topic", "kafka_partition", "kafka_offset", "published_at")
_LANE_LEASE_COLUMNS = ("owner_id", "fence", "lease_expires_at")
# The heartbeat also writes the instance's topic template (the sidecar applies its rule).
_INSTANCE_PROGRESS_COLUMNS = (
    "heartbeat_at",
    "last_publish_at",
    "published_total",
    "topic_template",
)
# Every column a scoring transition sets (complete, fail permanently or retryably, claim,
# expire, cancel); never the job's identity, its request or its attempt budget.
_JOB_TRANSITION_COLUMNS = (
    "scoring_state",
    "attempt_count",
    "next_attempt_at_unix_ms",
    "last_failure_code",
    "active_worker_ref",
    "active_lease_ref",
    "active_fencing_token",
    "active_lease_expires_at_unix_ms",
    "result_ref",
    "completed_fencing_token",
    "updated_at",
)

# table → part → access. A part missing from a table's entry gets nothing on it.
TABLES: Final[Mapping[str, Mapping[str, Access]]] = {
    "outbox": {
        # INSERT the event; SELECT finds a replayed event's earlier copy (idempotency).
        WRITER: _access("SELECT", "INSERT"),
        # Any other application: the event's own columns, and it reads nothing back.
        EVENT_WRITER: _access(insert=EVENT_COLUMNS),
        # SELECT the ready rows, DELETE them once acknowledged, UPDATE failures and redrive.
        RELAY: _access("SELECT", "DELETE", update=_OUTBOX_FAILURE_COLUMNS),
        SIDECAR: _access("SELECT"),
    },
    "outbox_receipt": {
        # An event already published is found by its receipt (idempotency).
        WRITER: _access("SELECT"),
        # INSERT … ON CONFLICT DO UPDATE records a republished event; DELETE prunes.
        RELAY: _access("SELECT", "INSERT", "DELETE", update=_RECEIPT_REPUBLISH_COLUMNS),
        SIDECAR: _access("SELECT"),
    },
    "relay_lane": {
        # The 64 rows are created by the migration; instances only lease them.
        RELAY: _access("SELECT", update=_LANE_LEASE_COLUMNS),
        SIDECAR: _access("SELECT"),
    },
    "relay_instance": {
        RELAY: _access("SELECT", "INSERT", "DELETE", update=_INSTANCE_PROGRESS_COLUMNS),
        SIDECAR: _access("SELECT"),
    },
    "scoring_job_state": {
        # SELECT … FOR UPDATE locks the job; the transitions update its state columns.
        # Enqueueing (INSERT) stays with the scoring service, which owns the table.
        WRITER: _access("SELECT", update=_JOB_TRANSITION_COLUMNS),
        SIDECAR: _access("SELECT"),
    },
    # Written by `migrate` only, which runs as the schema owner. The relay and the sidecar
    # read the migration level before they start (relay/schema.py, health/schema.py), and
    # `redrive` to refuse a schema that is not migrated before it changes anything.
    "outbox_relay_migration": {RELAY: _access("SELECT"), SIDECAR: _access("SELECT")},
    # Where each event writer may route (migration 0011): written by `grant` as the schema
    # owner, read by the door's statement trigger through outbox_relay_writer_routes(name),
    # a SECURITY DEFINER function every role may execute. No part reads it directly.
    ROUTES_TABLE: {},
}

# sequence → part → privileges. The outbox's identity sequence: an insert draws from it
# without any privilege on it. The relay reads its last value (SELECT, which cannot draw)
# before each full pass: what the pass may send is bounded by it (relay/sql.py,
# SEQ_ALLOCATED).
SEQUENCES: Final[Mapping[str, Mapping[str, frozenset[str]]]] = {
    "outbox_seq_seq": {RELAY: frozenset({"SELECT"})},
}

# The scoring functions a worker calls (migration 0012): SECURITY DEFINER, so EXECUTE is all
# a caller needs. The writer part keeps its table privileges (the previous release's writer
# uses them) and calls them too.
_SCORING_CALLS: Final = (
    "outbox_relay_complete_job(text, bigint, text, text, text, text, text, jsonb, text, text, "
    "text, text, uuid, bigint)",
    "outbox_relay_fail_job_permanently(text, bigint, text, text, text, text, text, jsonb, text, "
    "text, text, text, uuid, bigint)",
    "outbox_relay_fail_retryable(text, bigint, text, bigint, text, text, text, text, jsonb, "
    "text, text, text, text, uuid, bigint)",
    "outbox_relay_expire_leases(bigint, text, text, text, text, text, text, text, text, bigint, "
    "text[])",
)
# function → the parts that may EXECUTE it. Every other function of the schema is called by
# nobody: trigger functions fire without EXECUTE, and the scoring functions' helpers are
# called by the four above as their owner.
EXECUTE: Final[Mapping[str, frozenset[str]]] = {
    call: frozenset({WRITER, SCORING_WORKER}) for call in _SCORING_CALLS
}
# Every function the migrations create, as ``name(argument types)``; EXECUTE is taken from
# PUBLIC on each.
FUNCTIONS: Final[tuple[str, ...]] = (
    "outbox_relay_notify()",
    "outbox_relay_guard_insert()",
    "outbox_relay_measure()",
    *_SCORING_CALLS,
    "outbox_relay_check_arguments(text, bigint, text, text, bigint)",
    "outbox_relay_decide(text, text, bigint, text)",
    "outbox_relay_event_body(outbox_relay_event, bigint)",
    "outbox_relay_expired_meanwhile(text, outbox_relay_outcome)",
    "outbox_relay_find_event(outbox_relay_event)",
    "outbox_relay_json_canonical(jsonb, integer)",
    "outbox_relay_json_problem(jsonb, text, integer)",
    "outbox_relay_prepare_event(text, text, text, jsonb, text, text, text, text, text, text, "
    "text, text, uuid, bigint)",
    "outbox_relay_quarantine_job(text, bigint, text, boolean)",
    "outbox_relay_refusal(text, text, text, text, jsonb)",
    "outbox_relay_settle(text, outbox_relay_outcome, outbox_relay_event, bigint, text, boolean)",
    "outbox_relay_terminal_event_id(text, text, text)",
    "outbox_relay_text_problem(text, text, integer)",
    "outbox_relay_write_event(outbox_relay_event, bigint)",
)

# Functions every role may run: EXECUTE stays with PUBLIC. The door reads an inserting
# role's routes through this one (migration 0011, SECURITY DEFINER), so that a writer of
# the previous release keeps inserting before `grant` runs again; it answers no more than
# an INSERT would.
PUBLIC_FUNCTIONS: Final[tuple[str, ...]] = ("outbox_relay_writer_routes(name)",)

STATS_ROLE: Final = "pg_read_all_stats"
# Why a part wants pg_read_all_stats; without it, other roles' sessions show no transaction
# start and are left out.
STATS_REASON: Final[Mapping[str, str]] = {
    SIDECAR: (
        "the sidecar must see other roles' open transactions to know which completions may "
        "still commit and which sessions block the outbox"
    ),
    RELAY: "the relay's warning about a long open outbox writer sees only its own role without it",
}

_SIMPLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def quote_role(name: str) -> str:
    """A role name as a quoted SQL identifier (always quoted: a role may be called ``user``)."""
    return '"' + name.replace('"', '""') + '"'


def quote_schema(name: str) -> str:
    """A schema name, quoted only when it needs it."""
    return name if _SIMPLE_NAME.fullmatch(name) else quote_role(name)


def shown(name: str) -> str:
    """A name for a message or a comment line: as it is, or quoted with escapes when it holds
    a line break or a control character (which would end a ``--`` comment or drive a terminal)."""
    return name if name.isprintable() else repr(name)


_PART_NAMES: Final = f"{', '.join(PARTS[:-1])} or {PARTS[-1]}"


def parse_parts(given: Iterable[str]) -> tuple[str, ...]:
    """The parts named by ``--as``, in model order without repeats; a :class:`ConfigError` for others."""
    chosen = set()
    for part in given:
        if part not in PARTS:
            raise ConfigError(f"--as must be {_PART_NAMES}, got {part!r}")
        chosen.add(part)
    if not chosen:
        raise ConfigError(f"--as is required: {_PART_NAMES} (repeatable)")
    return tuple(part for part in PARTS if part in chosen)


def merged_access(table: str, parts: Iterable[str]) -> Access:
    """What the union of ``parts`` may do on ``table``; whole-table privileges win over columns."""
    needs = [TABLES[table][part] for part in parts if part in TABLES[table]]
    privileges = frozenset().union(*(a.privileges for a in needs))
    update = frozenset[str]().union(*(a.update_columns for a in needs))
    insert = frozenset[str]().union(*(a.insert_columns for a in needs))
    return Access(
        privileges,
        frozenset() if "UPDATE" in privileges else update,
        frozenset() if "INSERT" in privileges else insert,
    )


_PRIVILEGE_ORDER: Final = (
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
)


def _in_order(privileges: frozenset[str]) -> list[str]:
    return [p for p in _PRIVILEGE_ORDER if p in privileges]


def describe_access(access: Access) -> str:
    """``SELECT, DELETE, UPDATE(a, b)`` — the matrix notation of docs and tests; ``—`` for none."""
    words = _in_order(access.privileges)
    if access.insert_columns:
        words.append(f"INSERT({', '.join(sorted(access.insert_columns))})")
    if access.update_columns:
        words.append(f"UPDATE({', '.join(sorted(access.update_columns))})")
    return ", ".join(words) or "—"


@dataclass(frozen=True, order=True)
class Privilege:
    """One privilege on one object of the model, whole-object when ``column`` is empty:
    ``Privilege("outbox", "INSERT", "payload")``, ``Privilege("sequence outbox_seq_seq",
    "SELECT")``, ``Privilege("function outbox_relay_notify()", "EXECUTE")``."""

    target: str
    privilege: str
    column: str = ""


def needed_privileges(parts: Iterable[str]) -> frozenset[Privilege]:
    """Everything the union of ``parts`` may do on the model's objects, one privilege at a
    time: what ``grant`` compares the role's effective privileges with once it has applied."""
    chosen = tuple(parts)
    needed: set[Privilege] = set()
    for table in TABLES:
        access = merged_access(table, chosen)
        needed |= {Privilege(table, privilege) for privilege in access.privileges}
        needed |= {Privilege(table, "INSERT", column) for column in access.insert_columns}
        needed |= {Privilege(table, "UPDATE", column) for column in access.update_columns}
    for sequence, needs in SEQUENCES.items():
        for part in chosen:
            needed |= {Privilege(f"sequence {sequence}", p) for p in needs.get(part, ())}
    for function in FUNCTIONS:
        if EXECUTE.get(function, frozenset()).intersection(chosen):
            needed.add(Privilege(f"function {function}", "EXECUTE"))
    return frozenset(needed)


# -- the plan (pure) -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SchemaFacts:
    """What ``grant`` read from the database before deciding anything."""

    schema: str
    # Objects (table names, sequence names, function signatures) this session may grant on
    # (it owns them, is a member of their owner, or is a superuser), and the others' owners.
    grantable: frozenset[str]
    owners: Mapping[str, str]
    role_has_schema_usage: bool
    role_reads_all_stats: bool
    # The database's name, and the role's own settings in it (``name=value``).
    database: str
    role_settings: tuple[str, ...]
    # Whether this session may change the role's settings: a superuser, the role itself, or
    # CREATEROLE (with ADMIN on the role from PostgreSQL 16) for a role that is no superuser.
    may_alter_role: bool
    # Who besides its owner may create objects in the schema: PUBLIC first, then roles.
    schema_creators: tuple[str, ...]


@dataclass(frozen=True)
class OwnerStep:
    """Statements only another role (an object's owner, a superuser) can run, and why."""

    reason: str
    statements: tuple[str, ...]


@dataclass(frozen=True)
class GrantPlan:
    """Statements this session runs, and the steps it must leave to others."""

    role: str
    parts: tuple[str, ...]
    statements: tuple[str, ...]
    owner_steps: tuple[OwnerStep, ...] = field(default=())
    privileged_steps: tuple[OwnerStep, ...] = field(default=())


def _table_statements(schema: str, table: str, role: str, access: Access) -> list[str]:
    target = f"{quote_schema(schema)}.{table}"
    # REVOKE ALL on a table also revokes its column privileges: the role ends with exactly
    # what follows.
    statements = [f"REVOKE ALL ON TABLE {target} FROM {quote_role(role)}"]
    if access.privileges:
        privileges = ", ".join(_in_order(access.privileges))
        statements.append(f"GRANT {privileges} ON TABLE {target} TO {quote_role(role)}")
    for privilege, granted in (
        ("INSERT", access.insert_columns),
        ("UPDATE", access.update_columns),
    ):
        if granted:
            columns = ", ".join(sorted(granted))
            statements.append(
                f"GRANT {privilege} ({columns}) ON TABLE {target} TO {quote_role(role)}"
            )
    return statements


def search_path_of(schema: str) -> str:
    """The value a part's role runs with: the relay's schema alone (pg_catalog comes first
    implicitly), so no schema another role may create in, ``"$user"`` included, is on it."""
    return quote_schema(schema)


def plan_grants(
    role: str, parts: tuple[str, ...], facts: SchemaFacts, routes: WriterRoutes | None = None
) -> GrantPlan:
    """The statements that give ``role`` exactly what ``parts`` need, split by who can run
    them; for an event writer also its ``routes`` (None: every route)."""
    if role == SCORING_FUNCTIONS_OWNER:
        # Its privileges come with migration 0012; taking them away (REVOKE ALL on the
        # functions it owns) would stop every scoring function.
        raise ConfigError(
            f"--to {SCORING_FUNCTIONS_OWNER}: that role owns the scoring functions and gets "
            'its privileges from migrate (docs/operations.md, "The scoring functions\' owner")'
        )
    schema = quote_schema(facts.schema)
    ours: list[str] = []
    others: dict[str, list[str]] = {}

    def place(obj: str, statements: list[str]) -> None:
        if obj in facts.grantable:
            ours.extend(statements)
        else:
            others.setdefault(obj, []).extend(statements)

    if not facts.role_has_schema_usage:
        place(f"schema {facts.schema}", [f"GRANT USAGE ON SCHEMA {schema} TO {quote_role(role)}"])
    for table in TABLES:
        place(table, _table_statements(facts.schema, table, role, merged_access(table, parts)))
    for sequence, needs in SEQUENCES.items():
        target = f"{schema}.{sequence}"
        statements = [f"REVOKE ALL ON SEQUENCE {target} FROM {quote_role(role)}"]
        granted = frozenset[str]().union(*(needs[p] for p in parts if p in needs))
        if granted:
            privileges = ", ".join(sorted(granted))
            statements.append(f"GRANT {privileges} ON SEQUENCE {target} TO {quote_role(role)}")
        place(sequence, statements)
    if EVENT_WRITER in parts:
        place(ROUTES_TABLE, _route_statements(facts.schema, role, routes))
    for function in FUNCTIONS:
        target = f"{schema}.{function}"
        statements = [
            f"REVOKE ALL ON FUNCTION {target} FROM {quote_role(role)}",
            f"REVOKE EXECUTE ON FUNCTION {target} FROM PUBLIC",
        ]
        if EXECUTE.get(function, frozenset()).intersection(parts):
            statements.append(f"GRANT EXECUTE ON FUNCTION {target} TO {quote_role(role)}")
        place(function, statements)
    owner_steps = tuple(
        OwnerStep(
            reason=f"{shown(obj)} is owned by {shown(facts.owners.get(obj, 'another role'))}, "
            "which this session is not; that owner must run",
            statements=tuple(statements),
        )
        for obj, statements in others.items()
    )
    privileged: list[OwnerStep] = []
    # Set on the role in this database, not per session: it holds behind a transaction
    # pooler too, and for every connection the role opens.
    path = search_path_of(facts.schema)
    if f"search_path={path}" not in facts.role_settings:
        statement = (
            f"ALTER ROLE {quote_role(role)} IN DATABASE {quote_role(facts.database)} "
            f"SET search_path = {path}"
        )
        if facts.may_alter_role:
            ours.append(statement)
        else:
            privileged.append(
                OwnerStep(
                    reason="separate step, for a superuser (or a role with CREATEROLE and "
                    f"ADMIN on {shown(role)}): the role's search_path, so that the names it "
                    f"uses resolve in schema {shown(facts.schema)} and nowhere else",
                    statements=(statement,),
                )
            )
    wanting = [STATS_REASON[p] for p in parts if p in STATS_REASON]
    if wanting and not facts.role_reads_all_stats:
        privileged.append(
            OwnerStep(
                reason=f"separate step, for a superuser (or a role with ADMIN on {STATS_ROLE}): "
                + "; ".join(wanting),
                statements=(f"GRANT {STATS_ROLE} TO {quote_role(role)}",),
            )
        )
    return GrantPlan(role, parts, tuple(ours), owner_steps, tuple(privileged))


def _route_statements(schema: str, role: str, routes: WriterRoutes | None) -> list[str]:
    """The event writer's routes, replacing any it had; none kept for every route."""
    target = f"{quote_schema(schema)}.{ROUTES_TABLE}"
    writer = f"{quote_literal(quote_role(role))}::regrole"
    if routes is None:
        return [f"DELETE FROM {target} WHERE writer = {writer}"]
    return [
        f"INSERT INTO {target} (writer, aggregatetypes, topic_prefixes) "
        f"VALUES ({writer}, {_text_array(routes.aggregatetypes)}, "
        f"{_text_array(routes.topic_prefixes)}) "
        "ON CONFLICT (writer) DO UPDATE SET aggregatetypes = EXCLUDED.aggregatetypes, "
        "topic_prefixes = EXCLUDED.topic_prefixes"
    ]


def quote_literal(text: str) -> str:
    """A string literal (standard_conforming_strings, PostgreSQL's default since 9.1)."""
    return "'" + text.replace("'", "''") + "'"


def _text_array(values: tuple[str, ...]) -> str:
    return f"ARRAY[{', '.join(map(quote_literal, values))}]::text[]"


def schema_creators_warning(facts: SchemaFacts) -> str | None:
    """One line when PUBLIC or a role besides the schema's owner may create objects in it."""
    return creators_warning(facts.schema, facts.schema_creators)


def creators_warning(schema: str, creators: tuple[str, ...]) -> str | None:
    """One line when ``creators`` (PUBLIC first, then roles) may create objects in ``schema``
    besides its owner: what that allows and the REVOKE that ends it."""
    if not creators:
        return None
    public = [c for c in creators if c == "PUBLIC"]
    roles = [c for c in creators if c != "PUBLIC"]
    who = []
    if public:
        who.append("PUBLIC")
    if roles:
        who.append(("role " if len(roles) == 1 else "roles ") + ", ".join(map(shown, roles)))
    grantees = ", ".join(
        [*public, *(quote_role(r) if r.isprintable() else shown(r) for r in roles)]
    )
    return (
        f"{' and '.join(who)} may create objects in schema {shown(schema)} besides its "
        "owner: a function or operator put there can run inside the transactions of every "
        "role that uses the schema; take it away with "
        f"REVOKE CREATE ON SCHEMA {quote_schema(schema)} FROM {grantees}"
    )


def render_script(plan: GrantPlan) -> str:
    """The whole plan as a SQL script: this session's part in one transaction, then the others."""
    lines = [
        f"-- outbox-relay grant: {', '.join(plan.parts)} for role {shown(plan.role)}",
        "BEGIN;",
    ]
    lines += [f"{statement};" for statement in plan.statements]
    lines.append("COMMIT;")
    for step in (*plan.owner_steps, *plan.privileged_steps):
        lines.append(f"-- {step.reason}:")
        lines += [f"{statement};" for statement in step.statements]
    return "\n".join(lines)


def render_pending(plan: GrantPlan) -> list[str]:
    """After applying: one line per step left to others, each followed by its statements."""
    lines = []
    for step in (*plan.owner_steps, *plan.privileged_steps):
        lines.append(f"{step.reason}:")
        lines += [f"  {statement};" for statement in step.statements]
    return lines


# -- the database --------------------------------------------------------------------------------
# Every call below has pg_catalog's exact argument types (casts on constants): grant runs as
# the schema owner, with whatever search_path its session has (tests/security/
# test_exact_calls.py).
# The schema is wherever `outbox` resolves on this session's search_path (migrate created
# every object there).
_SCHEMA_OF_OUTBOX = """
SELECT n.oid, n.nspname, current_database() FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass('outbox')::oid
"""

# ALTER ROLE … SET: a superuser may for anyone; a role for itself; CREATEROLE for a role
# that is no superuser, from PostgreSQL 16 only with ADMIN on it.
_ROLE_FACTS = """
SELECT has_schema_privilege(r.oid, $2::oid, 'USAGE'),
       pg_has_role(r.oid, 'pg_read_all_stats'::name, 'MEMBER'),
       coalesce((SELECT s.setconfig FROM pg_catalog.pg_db_role_setting s
                 JOIN pg_catalog.pg_database d ON d.oid = s.setdatabase
                 WHERE s.setrole = r.oid AND d.datname = current_database()), '{}'),
       CASE
           WHEN me.rolsuper THEN true
           WHEN r.rolsuper THEN false
           WHEN r.oid = me.oid THEN true
           WHEN NOT me.rolcreaterole THEN false
           WHEN current_setting('server_version_num')::integer < 160000 THEN true
           ELSE pg_has_role(me.oid, r.oid, 'MEMBER WITH ADMIN OPTION')
       END,
       r.rolsuper
FROM pg_catalog.pg_roles r, pg_catalog.pg_roles me
WHERE r.rolname = $1 AND me.rolname = current_user
"""

# Relations and functions of the schema with their owner and whether this session acts as
# the owner (membership with inheritance; superusers are members of every role).
_OBJECTS = """
SELECT c.relname::text AS name, pg_get_userbyid(c.relowner) AS owner,
       pg_has_role(current_user, c.relowner, 'USAGE') AS ours
FROM pg_catalog.pg_class c
WHERE c.relnamespace = $1 AND c.relkind IN ('r', 'p', 'S')
UNION ALL
SELECT p.proname::text || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')',
       pg_get_userbyid(p.proowner), pg_has_role(current_user, p.proowner, 'USAGE')
FROM pg_catalog.pg_proc p
WHERE p.pronamespace = $1
UNION ALL
SELECT 'schema ' || n.nspname::text, pg_get_userbyid(n.nspowner),
       pg_has_role(current_user, n.nspowner, 'USAGE')
FROM pg_catalog.pg_namespace n WHERE n.oid = $1
"""

# Grantees of CREATE on the schema other than its owner (0 is PUBLIC). Superusers and
# members of the owner create there too; they are the owner's to choose.
_SCHEMA_CREATORS = """
SELECT CASE WHEN a.grantee = 0::oid THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END
FROM pg_catalog.pg_namespace n,
     aclexplode(coalesce(n.nspacl, acldefault('n'::"char", n.nspowner))) a
WHERE n.oid = $1 AND a.privilege_type = 'CREATE' AND a.grantee <> n.nspowner
ORDER BY a.grantee <> 0::oid, 1
"""


async def read_facts(conn: asyncpg.Connection, role: str) -> SchemaFacts:
    """Find the schema, check the role exists and read who owns what; refuse an unmigrated schema."""
    found = await conn.fetchrow(_SCHEMA_OF_OUTBOX)
    if found is None:
        raise GrantError("the outbox table is not there: run `outbox-relay migrate` first")
    namespace, schema, database = found
    role_row = await conn.fetchrow(_ROLE_FACTS, role, namespace)
    if role_row is None:
        raise ConfigError(f"role {role!r} does not exist: create the login role first")
    rows = await conn.fetch(_OBJECTS, namespace)
    owners = {row["name"]: row["owner"] for row in rows}
    refuse_target(role, superuser=bool(role_row[4]), owns=_owned_by(role, schema, owners))
    expected = [*TABLES, *SEQUENCES, *FUNCTIONS]
    missing = [name for name in expected if name not in owners]
    if missing:
        raise GrantError(
            f"schema {shown(schema)} lacks {', '.join(missing)}: run `outbox-relay migrate` first"
        )
    return SchemaFacts(
        schema=schema,
        grantable=frozenset(row["name"] for row in rows if row["ours"]),
        owners=owners,
        role_has_schema_usage=bool(role_row[0]),
        role_reads_all_stats=bool(role_row[1]),
        database=database,
        role_settings=tuple(role_row[2]),
        may_alter_role=bool(role_row[3]),
        schema_creators=tuple(r[0] for r in await conn.fetch(_SCHEMA_CREATORS, namespace)),
    )


async def read_schema_creators(conn: asyncpg.Connection) -> tuple[str, tuple[str, ...]] | None:
    """The relay's schema (where ``outbox`` resolves on this session's path) and who besides
    its owner may create objects in it, PUBLIC first; None while there is no outbox. Any
    role that can reach the outbox may read it: it reads the catalog only."""
    found = await conn.fetchrow(_SCHEMA_OF_OUTBOX)
    if found is None:
        return None
    namespace, schema, _ = found
    creators = tuple(row[0] for row in await conn.fetch(_SCHEMA_CREATORS, namespace))
    return schema, creators


def _owned_by(role: str, schema: str, owners: Mapping[str, str]) -> list[str]:
    modelled = [f"schema {schema}", *TABLES, *SEQUENCES, *FUNCTIONS]
    return [name for name in modelled if owners.get(name) == role]


def refuse_target(role: str, *, superuser: bool, owns: Iterable[str]) -> None:
    """A :class:`ConfigError` for a role ``grant`` cannot narrow: a predefined role, a
    superuser, or the owner of the schema or of one of its objects (each can do everything
    there whatever it is granted, so "exactly" would be a false claim)."""
    target = f"--to {shown(role)}"
    if role.startswith("pg_"):
        raise ConfigError(
            f"{target} is a predefined role of the server: give the parts to a role of your own"
        )
    if superuser:
        raise ConfigError(
            f"{target} is a superuser, which may do everything whatever it is granted: "
            "give the parts to a role that is not"
        )
    owned = list(owns)
    if owned:
        raise ConfigError(
            f"{target} owns {shown(owned[0])}, and an owner may do everything with what it "
            "owns: give the parts to a role that owns none of the relay's objects"
        )


async def apply_plan(conn: asyncpg.Connection, plan: GrantPlan) -> None:
    """Run this session's statements in one transaction: the role never holds half a change."""
    try:
        async with conn.transaction():
            for statement in plan.statements:
                await conn.execute(statement)
    except asyncpg.PostgresError as exc:
        # The server's message names a privilege and an object, never connection secrets.
        raise GrantError(f"grant failed: {exc.sqlstate} {exc.message}") from exc
