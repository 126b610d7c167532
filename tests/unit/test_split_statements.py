"""split_statements keeps quoted text, comments and dollar-quoted bodies whole."""

from __future__ import annotations

import pytest

from migrations.runner import split_statements
from relay.config import RelayConfig


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ('SELECT "x;y" FROM t; SELECT 2', ['SELECT "x;y" FROM t', "SELECT 2"]),
        ('SELECT "a""b;c"; SELECT 2', ['SELECT "a""b;c"', "SELECT 2"]),
        ("/* one; two */ SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
        ("DO $$ BEGIN PERFORM 1; END $$; SELECT 2", ["DO $$ BEGIN PERFORM 1; END $$", "SELECT 2"]),
        ("DO $fn$ a; $$ b; $fn$; SELECT 2", ["DO $fn$ a; $$ b; $fn$", "SELECT 2"]),
        ("SELECT 'it''s; fine'; SELECT 2", ["SELECT 'it''s; fine'", "SELECT 2"]),
        ("SELECT $1::int; SELECT 2", ["SELECT $1::int", "SELECT 2"]),
    ],
)
def test_semicolons_inside_quotes_comments_and_bodies_do_not_split(
    sql: str, expected: list[str]
) -> None:
    assert split_statements(sql) == expected


def test_config_repr_does_not_show_the_database_password() -> None:
    config = RelayConfig(database_url="postgresql://u:s3cretpw@h/db", kafka_bootstrap="k:9092")
    assert "s3cretpw" not in repr(config)
