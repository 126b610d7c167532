"""While a full batch is mapped and handed to the producer, the next fetch already runs.

Under a backlog the fetch is the pipeline's longest step, and the relay's own mapping of a
batch (rows to records, records into partition batches) is the second: the next fetch's
statement must be on its way to the server before the mapping starts, or the two take
turns and the server waits for the relay, then the relay for the server. Starting the
prefetch's task is not enough; it has to get as far as sending its statement.

Observed where the driver sends statements and where rows are mapped, on a real server
and broker.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from relay import sql
from relay.outcome import Outcome
from relay.records import RecordMapper
from tests.support.relay import fast_config, running_relay
from tests.support.waiting import wait_for_signal, wait_until

_BATCH = 50
_BATCHES = 4
_PROMPTLY_S = 30

INSERT_ROWS = """
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', 'k' || (n % 10), 'changed', jsonb_build_object('n', n)
FROM generate_series(1, $1) AS n
"""


async def test_the_next_fetch_is_sent_before_a_full_batch_is_mapped(
    db: asyncpg.Connection,
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps: list[str] = []
    _execute, to_record = asyncpg.Connection._execute, RecordMapper.to_record

    async def observed_execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if query == sql.FETCH_READY:
            steps.append("fetch sent")
            result = await _execute(self, query, *args, **kwargs)
            steps.append(f"fetched {len(result)}")
            return result
        return await _execute(self, query, *args, **kwargs)

    def observed_to_record(self: RecordMapper, row: Any) -> Any:
        if not steps or steps[-1] != "mapping":
            steps.append("mapping")
        return to_record(self, row)

    monkeypatch.setattr(asyncpg.Connection, "_execute", observed_execute)
    monkeypatch.setattr(RecordMapper, "to_record", observed_to_record)
    config = fast_config(
        database_url, kafka_bootstrap, topic_namespace, batch_size=_BATCH, poll_interval_ms=60_000
    )
    async with running_relay(config) as running:
        await running.holds_every_lane(timeout=_PROMPTLY_S)
        # The pass that gaining the lanes starts reads an empty outbox: the backlog must meet
        # an idle relay, not a pass already under way.
        await wait_until(
            lambda: steps[-1:] == ["fetched 0"],
            what="the first pass over the empty outbox",
            timeout=_PROMPTLY_S,
        )
        steps.clear()
        running.signals.recorded.enable()
        published = 0

        def all_published(outcome: Outcome) -> bool:
            nonlocal published
            published += outcome.published_count
            return published == _BATCH * _BATCHES

        await db.execute(INSERT_ROWS, _BATCH * _BATCHES)  # one commit: a backlog at once
        await wait_for_signal(
            running.signals.recorded,
            where=all_published,
            what="the whole backlog published",
            timeout=_PROMPTLY_S,
        )
    full = f"fetched {_BATCH}"
    # Every full fetch but the last is followed by the next fetch's statement before its
    # rows are mapped (the last full one may meet a pass's end, or nothing left to read).
    after_full = [steps[i + 1] for i, step in enumerate(steps[:-1]) if step == full]
    assert len(after_full) >= _BATCHES, steps
    assert after_full[: _BATCHES - 1] == ["fetch sent"] * (_BATCHES - 1), steps
