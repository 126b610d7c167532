"""A transaction that wrote to the outbox and stays open is named: pid and age, no query text."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from tests.relay.harness import INSERT, fast_config, running_relay, wait_until


async def test_an_open_outbox_writer_is_reported_with_pid_and_age_only(
    database_url: str,
    kafka_bootstrap: str,
    topic_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="relay.housekeeping")
    writer = await asyncpg.connect(database_url)
    try:
        pid = await writer.fetchval("SELECT pg_backend_pid()")
        transaction = writer.transaction()
        await transaction.start()
        await writer.execute(INSERT, "agg", "secret-aggregate-ref", "t", '{"secret": "payload"}')
        config = fast_config(
            database_url, kafka_bootstrap, topic_namespace, blocking_transaction_warn_ms=500
        )
        async with running_relay(config) as running:
            await wait_until(
                lambda: running.metric("outbox_relay_oldest_open_outbox_writer_age_seconds") > 0,
                timeout=20,
            )
            await wait_until(
                lambda: any(getattr(r, "pid", None) == pid for r in caplog.records), timeout=20
            )
        await transaction.rollback()
    finally:
        await writer.close()
    warnings = [r for r in caplog.records if getattr(r, "pid", None) == pid]
    assert warnings[0].transaction_age_s > 0  # type: ignore[attr-defined]
    text = " ".join(f"{r.getMessage()} {vars(r)}" for r in caplog.records)
    assert "secret-aggregate-ref" not in text
    assert "payload" not in text
    assert "INSERT" not in text
