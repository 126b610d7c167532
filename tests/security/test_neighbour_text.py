"""Text a neighbour wrote into the database, shown to an operator: never as raw control
characters on the terminal.

Any writer can set ``last_error_class`` on a row it inserts, and ``redrive --dry-run``
prints it per cause.
"""

from __future__ import annotations

import json

import asyncpg

from tests.support.cli import cli_env, run_cli

# OSC 52 (writes the terminal's clipboard), a window title, a colour and a line break that
# would forge a line of the preview.
HOSTILE_CAUSES = (
    "\x1b]52;c;ZWNobyBvd25lZA==\x07",
    "\x1b]0;title\x07",
    "\x1b[31mred",
    "cause\n  forged: 1000 event(s) on 1 key(s)",
    "\u202eright-to-left",
)


async def test_redrive_dry_run_shows_a_hostile_cause_escaped(
    database_url: str, db: asyncpg.Connection
) -> None:
    for number, cause in enumerate(HOSTILE_CAUSES):
        await db.execute(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, quarantined_at, "
            "attempts, last_error_class) VALUES ('order', $1, 'placed', $2, now(), 5, $3)",
            f"key-{number}",
            json.dumps({"n": number}),
            cause,
        )
    await db.execute(
        "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, quarantined_at, "
        "attempts, last_error_class) VALUES ('order', 'plain', 'placed', '{}', now(), 5, "
        "'MessageSizeTooLarge')"
    )

    result = await run_cli(
        "redrive", "--all", "--dry-run", "--database-url", database_url, env=cli_env()
    )

    assert result.code == 0, result
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "\u202e" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run: would return 6 quarantined event(s) to the relay"
    assert len(lines) == 1 + len(HOSTILE_CAUSES) + 1  # no line forged by a cause
    # An ordinary cause reads as before; a hostile one is shown escaped, not dropped.
    assert "  MessageSizeTooLarge: 1 event(s) on 1 key(s)" in lines
    assert "  '\\x1b[31mred': 1 event(s) on 1 key(s)" in lines
