"""How full the PostgreSQL cluster's notification queue is.

Every outbox INSERT sends a notification (the statement trigger of migration 0006). The
queue behind ``NOTIFY`` is one per cluster, shared by every database on the server (8 GB
by default), and PostgreSQL can only drop what every listening session has read. A session
that ``LISTEN``s and then stays in an open transaction reads nothing until it ends: any
role that can connect can hold the whole cluster's queue that way. Once the queue is
full, every transaction that notified fails at commit, each outbox INSERT among them, and
the error comes at commit, where no exception block in a trigger can catch it.

The sidecar reads ``pg_notification_queue_usage()`` (a fraction, 0 to 1) at each
evaluation and exports it as a gauge; the alert rules fire from half. A relay-only process
evaluates nothing database-wide and does not read it.
"""

from __future__ import annotations

import asyncpg

QUEUE_USAGE = "SELECT pg_catalog.pg_notification_queue_usage()"


async def read_queue_usage(conn: asyncpg.Connection) -> float:
    """The fraction of the cluster's notification queue in use now."""
    return float(await conn.fetchval(QUEUE_USAGE))
