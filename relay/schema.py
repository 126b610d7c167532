"""What the relay needs of the database before it claims a lane (pgconnect/schema.py reads it).

``MIGRATION`` is the newest migration the relay's statements read, or whose index its plans
rely on; a release that needs a newer one raises it (tests/relay/test_schema_needs.py holds
``STATEMENTS_READ`` to the statements, tests/relay/test_round_trips.py the plans to the
index). The privileges are those ``outbox-relay grant --as relay`` gives
(migrations/grants.py; the same test holds the two equal).
"""

from __future__ import annotations

from typing import Final

from pgconnect.schema import SchemaNeeds, on_sequence, on_table

STATEMENTS_READ: Final = 9
"""The newest migration the relay's statements read (0009: the door's columns)."""
PLANS_PROBE: Final = 10
"""The newest migration whose index the relay's plans rely on (0010: the hold check's one
probe; without it each row's check reads every held row of its key)."""
MIGRATION: Final = max(STATEMENTS_READ, PLANS_PROBE)

NEEDS: Final = SchemaNeeds(
    part="relay",
    migration=MIGRATION,
    privileges=(
        *on_table(
            "outbox",
            "SELECT",
            "DELETE",
            update=(
                "attempts",
                "last_error_class",
                "next_attempt_at",
                "quarantined_at",
                "held_topic",
                "held_template",
                "size_bytes",
            ),
        ),
        *on_table(
            "outbox_receipt",
            "SELECT",
            "INSERT",
            "DELETE",
            update=("topic", "kafka_partition", "kafka_offset", "published_at"),
        ),
        *on_table("relay_lane", "SELECT", update=("owner_id", "fence", "lease_expires_at")),
        *on_table(
            "relay_instance",
            "SELECT",
            "INSERT",
            "DELETE",
            update=("heartbeat_at", "last_publish_at", "published_total", "topic_template"),
        ),
        *on_table("outbox_relay_migration", "SELECT"),
        *on_sequence("outbox_seq_seq", "SELECT"),
    ),
)
