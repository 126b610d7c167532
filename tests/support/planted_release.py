"""``outbox-relay`` of this checkout as the next release would be if it shipped one more
migration and read it: ``python -m tests.support.planted_release --migrations DIR --level N
-- VERB ...``. The migrations come from DIR (this checkout's and the planted one), and the
relay and the sidecar need migration N (relay/schema.py, health/schema.py). Everything else
is this checkout's code, unchanged.

Used by the upgrade test while no migration lies between the previous release and this
checkout that this checkout's code reads (tests/support/release.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import health.schema
import migrations.runner
import relay.schema


def plant(directory: Path, level: int) -> None:
    """Point the migration runner at ``directory`` and the parts' needs at ``level``; before
    the CLI is imported, so that every module that takes these names takes these."""
    shipped = migrations.runner.load_migrations

    def load(directory_given: Path | None = None) -> list[migrations.runner.Migration]:
        return shipped(directory_given or directory)

    migrations.runner.load_migrations = load
    for part in (relay.schema, health.schema):
        part.NEEDS = dataclasses.replace(part.NEEDS, migration=level)  # type: ignore[misc]
        part.MIGRATION = level  # type: ignore[misc]


def main() -> int:
    parser = argparse.ArgumentParser(prog="planted_release")
    parser.add_argument("--migrations", type=Path, required=True)
    parser.add_argument("--level", type=int, required=True)
    parser.add_argument("verb", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    plant(args.migrations, args.level)
    from outbox_relay.cli import main as cli

    verb = args.verb[1:] if args.verb[:1] == ["--"] else args.verb
    return cli(verb)


if __name__ == "__main__":
    sys.exit(main())
