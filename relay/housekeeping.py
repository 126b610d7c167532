"""Background rounds: the ticker that repeats them, receipt pruning, backlog observation."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import anyio

from pgconnect import DB_ERRORS, unavailable_cause
from relay.config import RelayConfig
from relay.liveness import Liveness
from relay.metrics import RelayMetrics
from relay.retry import backoff_ms
from relay.store import OutboxStore

log = logging.getLogger(__name__)

OBSERVE_EVERY_MS = 5_000
_PRUNE_PAUSE_S = 0.05  # between bounded batches, so the writers get in


async def run_rounds(
    name: str,
    round_: Callable[[], Awaitable[None]],
    every_ms: int,
    *,
    liveness: Liveness,
    rng: random.Random,
) -> None:
    """Run ``round_`` every ``every_ms`` until cancelled; a database error only shortens
    the wait before the next try (backoff, never longer than the interval)."""
    failures = 0
    while True:
        try:
            await round_()
            failures = 0
        except DB_ERRORS as exc:
            failures += 1
            log.warning(
                "database round failed", extra={"loop": name, "cause": unavailable_cause(exc)}
            )
        liveness.tick(name, every_ms)
        delay = (
            every_ms
            if failures == 0
            else min(every_ms, backoff_ms(failures, base_ms=200, cap_ms=every_ms, rng=rng))
        )
        await anyio.sleep(delay / 1000)


class Housekeeping:
    """Rounds that keep the tables small and report what holds the relay back."""

    def __init__(
        self,
        store: OutboxStore,
        config: RelayConfig,
        metrics: RelayMetrics,
        liveness: Liveness,
    ) -> None:
        self._store = store
        self._config = config
        self._metrics = metrics
        self._liveness = liveness

    async def prune_round(self) -> None:
        """Delete receipts older than the retention window, in bounded batches."""
        config = self._config
        while True:
            pruned = await self._store.prune_receipts(
                config.receipt_retention_ms, config.prune_batch_size
            )
            self._metrics.receipts_pruned.inc(pruned)
            if pruned < config.prune_batch_size:
                return
            self._liveness.tick("prune", config.prune_interval_ms)
            await anyio.sleep(_PRUNE_PAUSE_S)

    async def observe_round(self) -> None:
        """Backlog gauges, and a warning about an outbox writer left open too long.

        A relay-only process has no backlog gauges and reads nothing here: the whole-table
        count and the scan of open transactions are done once per deployment, by the
        process that exports them (the sidecar's families, or a ``run`` process).
        """
        gauges = self._metrics.backlog
        if gauges is None:
            return
        summary, writer = await self._store.backlog()
        gauges.pending.set(summary.pending)
        gauges.quarantined_pending.set(summary.quarantined)
        gauges.oldest_pending_age.set(summary.oldest_age_s)
        writer_age = writer.age_s if writer else 0.0
        gauges.oldest_writer_age.set(writer_age)
        if writer and writer_age * 1000 > self._config.blocking_transaction_warn_ms:
            log.warning(
                "an open transaction has written to the outbox and not committed; "
                "its events and the vacuum of published rows wait for it",
                extra={"pid": writer.pid, "transaction_age_s": round(writer_age, 1)},
            )
