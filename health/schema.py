"""What the health sidecar needs of the database before it probes (pgconnect/schema.py reads it).

``MIGRATION`` is the newest migration the probes read, or whose index their plans rely on;
a release that needs a newer one raises it (tests/health/test_sidecar_schema_needs.py holds
``STATEMENTS_READ`` to the statements). The
privileges are those ``outbox-relay grant --as sidecar`` gives (migrations/grants.py; the
same test holds the two equal): read-only, on what the families probe and the migration
level.
"""

from __future__ import annotations

from typing import Final

from pgconnect.schema import SchemaNeeds, on_table

STATEMENTS_READ: Final = 9
"""The newest migration the probes read (0009: where a held row holds its key)."""
PLANS_PROBE: Final = 10
"""The newest migration whose index the probes' plans rely on (0010: the relay family's
hold check, one probe per ready row)."""
MIGRATION: Final = max(STATEMENTS_READ, PLANS_PROBE)

NEEDS: Final = SchemaNeeds(
    part="sidecar",
    migration=MIGRATION,
    privileges=tuple(
        privilege
        for table in (
            "outbox",
            "outbox_receipt",
            "relay_lane",
            "relay_instance",
            "scoring_job_state",
            "outbox_relay_migration",
        )
        for privilege in on_table(table, "SELECT")
    ),
)
