"""What the relay needs of the database before it claims a lane (pgconnect/schema.py reads it).

``MIGRATION`` is the newest migration the relay's statements read; a release whose
statements read a newer one raises it (tests/relay/test_schema_needs.py holds it to the
statements). The privileges are those ``outbox-relay grant --as relay`` gives
(migrations/grants.py; the same test holds the two equal).
"""

from __future__ import annotations

from typing import Final

from pgconnect.schema import SchemaNeeds, on_sequence, on_table

MIGRATION: Final = 10

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
