"""Whether the database holds what a part needs: its migration level and its role's privileges.

Each part declares what it needs as data in its own package (``relay/schema.py``,
``health/schema.py``): the newest migration its statements read, and the privileges its
role must hold on the migrated objects. A process below them does not start its work: it
says once what is missing, and looks again until the schema is there (DESIGN §10b). The
reading is here because every part does it the same way; what each part needs is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

import asyncpg

SCHEMA_BEHIND: Final = "schema_behind"
"""The reason a health family gives while the schema is below what the process needs."""

MIGRATION_RECORD: Final = "outbox_relay_migration"

PrivilegeKind = Literal["table", "column", "sequence"]


@dataclass(frozen=True, order=True)
class Privilege:
    """One privilege a part's role needs: on a table, a column of it, or a sequence."""

    kind: PrivilegeKind
    target: str
    privilege: str
    column: str = ""

    def __str__(self) -> str:
        if self.kind == "column":
            return f"{self.privilege}({self.column}) on {self.target}"
        if self.kind == "sequence":
            return f"{self.privilege} on sequence {self.target}"
        return f"{self.privilege} on {self.target}"


def on_table(
    table: str, *privileges: str, update: Iterable[str] = (), insert: Iterable[str] = ()
) -> tuple[Privilege, ...]:
    """Whole-table privileges on ``table``, then column-level UPDATE and INSERT."""
    return (
        *(Privilege("table", table, p) for p in privileges),
        *(Privilege("column", table, "UPDATE", c) for c in sorted(update)),
        *(Privilege("column", table, "INSERT", c) for c in sorted(insert)),
    )


def on_sequence(sequence: str, *privileges: str) -> tuple[Privilege, ...]:
    return tuple(Privilege("sequence", sequence, p) for p in privileges)


@dataclass(frozen=True)
class SchemaNeeds:
    """What one part needs of the database before it may start its work."""

    part: str
    """The part's name as ``outbox-relay grant --as`` takes it."""
    migration: int
    """The newest migration its statements read: every migration up to it must be applied."""
    privileges: tuple[Privilege, ...] = field(default=())


@dataclass(frozen=True)
class Shortfall:
    """What the database lacks for one part; ``str()`` is the one line a process says."""

    part: str
    needed: int
    level: int | None = None
    """The newest migration applied; None when the record is missing or unreadable."""
    missing_migrations: tuple[int, ...] = ()
    record_unreadable: bool = False
    missing_privileges: tuple[Privilege, ...] = ()

    def __str__(self) -> str:
        grant = f"run `outbox-relay grant --to ROLE --as {self.part}`"
        if self.record_unreadable:
            return (
                f"the {self.part}'s role may not read the migration level "
                f"({MIGRATION_RECORD}): {grant}"
            )
        if self.level is None:
            return "the database was never migrated: run `outbox-relay migrate`"
        if self.missing_migrations:
            missing = ", ".join(f"{v:04d}" for v in self.missing_migrations)
            plural = "s" if len(self.missing_migrations) > 1 else ""
            return (
                f"the database lacks migration{plural} {missing} (the {self.part} needs "
                f"{self.needed:04d}, the newest applied is {self.level:04d}): "
                "run `outbox-relay migrate`"
            )
        lacks = ", ".join(str(p) for p in self.missing_privileges)
        return f"the {self.part}'s role lacks {lacks}: {grant}"


# Every call resolves in pg_catalog; the names resolve on the session's search_path, where
# `migrate` created them. A relation the role cannot see is NULL, never an error.
_RECORD_STATE = f"""
SELECT r IS NOT NULL, coalesce(pg_catalog.has_table_privilege(r, 'SELECT'), false)
FROM (SELECT pg_catalog.to_regclass('{MIGRATION_RECORD}') AS r) AS record
"""
# The newest migration applied, and those up to $1 that are not.
_LEVEL = f"""
SELECT (SELECT pg_catalog.max(version) FROM {MIGRATION_RECORD}),
       ARRAY(
           SELECT wanted FROM pg_catalog.generate_series(1, $1::integer) AS wanted
           EXCEPT SELECT version FROM {MIGRATION_RECORD}
           ORDER BY 1
       )
"""
# The privileges of $1..$4 (kind, relation, privilege, column) this session's role lacks, in
# the order given. A missing relation or column is a privilege lacked.
_LACKING = """
SELECT n.i
FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),
               pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]))
     WITH ORDINALITY AS n (kind, target, privilege, column_name, i)
CROSS JOIN LATERAL (SELECT pg_catalog.to_regclass(n.target) AS r) AS found
WHERE NOT coalesce(CASE n.kind
    WHEN 'table' THEN pg_catalog.has_table_privilege(found.r, n.privilege)
    WHEN 'sequence' THEN pg_catalog.has_sequence_privilege(found.r, n.privilege)
    WHEN 'column' THEN pg_catalog.has_column_privilege(
        found.r,
        (SELECT a.attnum FROM pg_catalog.pg_attribute a
         WHERE a.attrelid = found.r::oid AND a.attname = n.column_name AND NOT a.attisdropped),
        n.privilege)
END, false)
ORDER BY n.i
"""


async def read_shortfall(conn: asyncpg.Connection, needs: SchemaNeeds) -> Shortfall | None:
    """What the database lacks for ``needs`` (None: nothing); reads only. Driver errors
    propagate: the caller treats them as an unreachable database."""
    exists, readable = await conn.fetchrow(_RECORD_STATE)
    if not exists:
        return Shortfall(needs.part, needs.migration)
    if not readable:
        return Shortfall(needs.part, needs.migration, record_unreadable=True)
    level, missing = await conn.fetchrow(_LEVEL, needs.migration)
    if level is None or missing:
        return Shortfall(needs.part, needs.migration, level, tuple(missing))
    wanted = needs.privileges
    lacking = await conn.fetch(
        _LACKING,
        [p.kind for p in wanted],
        [p.target for p in wanted],
        [p.privilege for p in wanted],
        [p.column for p in wanted],
    )
    if not lacking:
        return None
    return Shortfall(
        needs.part,
        needs.migration,
        level,
        missing_privileges=tuple(wanted[row["i"] - 1] for row in lacking),
    )


SAY_AGAIN_AFTER_S: Final = 60.0
"""How often the same shortfall is said again while it lasts."""


class ShortfallLog:
    """Decides when a shortfall is said: when it appears, again at most once every
    :data:`SAY_AGAIN_AFTER_S` while it lasts (as it is then: a migration under way changes
    it from one file to the next), and once when it is over."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._saying = False
        self._at = 0.0

    def due(self, shortfall: Shortfall | str | None) -> bool:
        """Whether to say ``shortfall`` now (None: nothing is missing)."""
        now = self._clock()
        if shortfall is None:
            was, self._saying = self._saying, False
            return was
        if self._saying and now - self._at < SAY_AGAIN_AFTER_S:
            return False
        self._saying, self._at = True, now
        return True
