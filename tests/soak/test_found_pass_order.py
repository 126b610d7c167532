"""What the soak found after a broker restart: a key's later rows published before earlier
ones, read back from Kafka in the wrong order (no duplicates involved).

The relay fetches in passes: each fetch of a pass reads ready rows after a cursor (the last
seq the previous fetch read). A row of a key held behind a failed row is left out of a
fetch (``FETCH_READY``'s ``NOT EXISTS``), yet the cursor moves past it. When the failed row
is then published and its row deleted within the same pass, the key's hold is gone: a
later fetch of the pass reads the key's rows *after* the cursor, while the rows the pass
stepped over wait for the next pass. Kafka then has, for one key, 17, 18, 29, 30, 19, …, 28
(soak seed 5, two minutes; `tests/soak/test_soak.py`).

This test plays one pass's fetches against the relay's own statement, the publish of the
failed row in between, and asks what every fetch must honour: no row of a key while an
earlier row of that key is still pending and not in flight.
"""

from __future__ import annotations

import asyncpg
import pytest

from relay.sql import FETCH_READY

INSERT = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
VALUES ('order', $1, 'changed', '{}'::jsonb) RETURNING seq
"""
# The row's earlier publish failed retriably; its retry is due now.
FAILED_AND_DUE = """
UPDATE outbox SET attempts = 1, next_attempt_at = clock_timestamp() - interval '1 ms'
WHERE seq = $1
"""


@pytest.mark.xfail(
    strict=True,
    reason="relay: a pass's cursor steps over rows held behind a failed row; once that row "
    "is published, a later fetch of the pass reads the key's later rows first",
)
async def test_a_pass_never_reads_a_keys_row_past_its_unpublished_earlier_row(
    db: asyncpg.Connection,
) -> None:
    a1 = await db.fetchval(INSERT, "key-a")
    a2 = await db.fetchval(INSERT, "key-a")
    b1 = await db.fetchval(INSERT, "key-b")
    a3 = await db.fetchval(INSERT, "key-a")
    await db.execute(FAILED_AND_DUE, a1)

    # First fetch of the pass (cursor 0, a batch of two): a1 is due, a2 waits behind it.
    first = [r["seq"] for r in await db.fetch(FETCH_READY, None, 0, 2)]
    assert first == [a1, b1]
    cursor = first[-1]  # past a2, which the fetch stepped over

    # a1 is published: the relay moves it out of the outbox (its receipt is not needed here).
    await db.execute("DELETE FROM outbox WHERE seq = $1", a1)

    # The pass goes on from its cursor. a2 is pending, not in flight, and earlier than a3.
    later = [r["seq"] for r in await db.fetch(FETCH_READY, None, cursor, 2)]
    assert a3 not in later, f"a3 (seq {a3}) read while a2 (seq {a2}) is still unpublished"
