"""Releases as the upgrade tests run them: the previous release (release/previous.toml)
checked out beside this checkout with ``git worktree`` and run with this venv's
interpreter, and the next release, which is this checkout.

An upgrade test needs a migration between the two that the new code reads. When this
checkout ships one (its relay needs a migration the previous release does not have), the
next release is this checkout as it is. Otherwise one is planted: this checkout's
migrations plus one more, in a directory of the test's, and the relay and the sidecar made
to need it (tests/support/planted_release.py); nothing else of the code changes.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import health.schema
import relay.schema
from migrations.runner import Migration, load_migrations
from tests.support.running import REPO, THIS_CHECKOUT, Code

PREVIOUS_FILE = REPO / "release" / "previous.toml"

# Planted only while this checkout reads no migration the previous release lacks. It adds
# (expand): the previous release's processes keep working on it. It takes the locks a real
# one would (a column on outbox, an index built beside the writers) under the rules every
# new migration keeps (tests/support/migration_rules.py).
PLANTED_SQL = """-- migrate: no-transaction
-- Planted by the upgrade test (tests/support/release.py): a migration the next release
-- needs, so that new code meets a schema older than it reads.
SET lock_timeout = '1s';

ALTER TABLE outbox ADD COLUMN IF NOT EXISTS upgrade_test_note text;

CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_upgrade_test_note_idx
    ON outbox (upgrade_test_note) WHERE upgrade_test_note IS NOT NULL;

RESET lock_timeout;
"""


@dataclass(frozen=True)
class PreviousRelease:
    """The release an upgrade starts from: its commit, and its version ("" before the first)."""

    commit: str
    version: str


def previous_release(path: Path = PREVIOUS_FILE) -> PreviousRelease:
    recorded = tomllib.loads(path.read_text())
    return PreviousRelease(commit=recorded["commit"], version=recorded["version"])


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=120, check=False
    )


@contextlib.contextmanager
def worktree(commit: str, directory: Path) -> Iterator[Path]:
    """``commit`` checked out at ``directory`` (a linked worktree, detached), removed after."""
    added = _git("worktree", "add", "--detach", "--quiet", str(directory), commit)
    if added.returncode != 0:
        raise AssertionError(
            f"cannot check out the previous release {commit} (a shallow clone? "
            f"git fetch --unshallow): {added.stderr.strip()}"
        )
    try:
        yield directory
    finally:
        _git("worktree", "remove", "--force", str(directory))
        _git("worktree", "prune")


def code_at(tree: Path, name: str) -> Code:
    """``outbox-relay`` of the code in ``tree``, run with this venv's interpreter (its
    packages come first on the path; the dependencies are this venv's)."""
    return Code(
        name,
        command=(sys.executable, "-m", "outbox_relay"),
        env={"PYTHONPATH": str(tree)},
        cwd=tree,
    )


def migrations_of(tree: Path) -> list[Migration]:
    return load_migrations(tree / "migrations")


@dataclass(frozen=True)
class NextRelease:
    """The release an upgrade goes to, and what it needs that the previous one lacks."""

    code: Code
    migrations: list[Migration]
    """What its ``migrate`` applies."""
    relay_level: int
    sidecar_level: int
    planted: Migration | None
    """The migration planted for the test, if this checkout reads none that is new."""


def next_release(previous: list[Migration], directory: Path) -> NextRelease:
    """This checkout as the next release after one that shipped ``previous``."""
    previous_newest = max(m.version for m in previous)
    shipped = load_migrations()
    if previous_newest < relay.schema.MIGRATION:
        return NextRelease(
            THIS_CHECKOUT, shipped, relay.schema.MIGRATION, health.schema.MIGRATION, None
        )
    level = max(m.version for m in shipped) + 1
    planted_dir = directory / "migrations"
    planted_dir.mkdir()
    for migration in shipped:
        (planted_dir / migration.file_name).write_text(migration.sql, encoding="utf-8")
    (planted_dir / f"{level:04d}_upgrade_test_planted.sql").write_text(PLANTED_SQL)
    migrations = load_migrations(planted_dir)
    code = Code(
        "this checkout, with a planted migration",
        command=(
            sys.executable,
            "-m",
            "tests.support.planted_release",
            "--migrations",
            str(planted_dir),
            "--level",
            str(level),
            "--",
        ),
        cwd=REPO,
    )
    return NextRelease(code, migrations, level, level, migrations[-1])
