"""What a process says while the schema is below what it needs: the line itself, and when it
is said again (pure: the clock is given)."""

from __future__ import annotations

from pgconnect.schema import SAY_AGAIN_AFTER_S, Privilege, Shortfall, ShortfallLog, on_table


def test_each_shortfall_is_one_line_naming_what_is_missing_and_the_fix() -> None:
    assert str(Shortfall("relay", 8)) == (
        "the database was never migrated: run `outbox-relay migrate`"
    )
    assert str(Shortfall("relay", 10, 8, (9, 10))) == (
        "the database lacks migrations 0009, 0010 (the relay needs 0010, the newest applied "
        "is 0008): run `outbox-relay migrate`"
    )
    assert str(Shortfall("sidecar", 8, record_unreadable=True)) == (
        "the sidecar's role may not read the migration level (outbox_relay_migration): "
        "run `outbox-relay grant --to ROLE --as sidecar`"
    )
    lacking = (
        Privilege("table", "outbox", "DELETE"),
        Privilege("column", "relay_instance", "UPDATE", "topic_template"),
        Privilege("sequence", "outbox_seq_seq", "SELECT"),
    )
    assert str(Shortfall("relay", 8, 8, missing_privileges=lacking)) == (
        "the relay's role lacks DELETE on outbox, UPDATE(topic_template) on relay_instance, "
        "SELECT on sequence outbox_seq_seq: run `outbox-relay grant --to ROLE --as relay`"
    )


def test_table_needs_list_whole_table_privileges_then_columns_in_order() -> None:
    assert on_table("t", "SELECT", update=("b", "a"), insert=("c",)) == (
        Privilege("table", "t", "SELECT"),
        Privilege("column", "t", "UPDATE", "a"),
        Privilege("column", "t", "UPDATE", "b"),
        Privilege("column", "t", "INSERT", "c"),
    )


def test_a_shortfall_is_said_when_it_appears_once_a_minute_while_it_lasts_and_when_over() -> None:
    now = [0.0]
    said = ShortfallLog(clock=lambda: now[0])
    assert not said.due(None)  # nothing was missing: nothing to say
    assert said.due(Shortfall("relay", 9, 2, (3, 4, 5, 6, 7, 8, 9)))
    for step in range(1, 60):
        now[0] = float(step)
        # A migration under way changes what is missing: not a new line each time.
        assert not said.due(Shortfall("relay", 9, 2 + step % 7, (9,))), step
    now[0] = SAY_AGAIN_AFTER_S
    assert said.due(Shortfall("relay", 9, 8, (9,)))
    now[0] += 1
    assert said.due(None)  # it is over: said once
    now[0] += 120
    assert not said.due(None)
    assert said.due(Shortfall("relay", 9, record_unreadable=True))  # it came back
