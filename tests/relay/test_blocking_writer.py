"""A transaction that wrote to the outbox and stays open is named: pid and age, no query text."""

from __future__ import annotations

import logging

import asyncpg
import pytest

from relay.store import oldest_writer
from tests.support.relay import INSERT, fast_config, running_relay
from tests.support.services import PostgresServer, drop_database, scratch_database, with_database
from tests.support.waiting import wait_until


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
                what="the open writer transaction's age in the metric",
            )
            await wait_until(
                lambda: any(getattr(r, "pid", None) == pid for r in caplog.records),
                timeout=20,
                what="a log line naming the blocking writer's pid",
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


async def test_a_writer_in_another_database_of_the_server_is_not_reported(
    database_url: str, pg_server: PostgresServer, template_database: str
) -> None:
    # pg_locks is server-wide, and a database made from the same template has an outbox
    # with the same oid: its writers are not this relay's business.
    other = await scratch_database(pg_server.url, template_database)
    try:
        writer = await asyncpg.connect(with_database(pg_server.url, other))
        mine = await asyncpg.connect(database_url)
        try:
            assert await writer.fetchval("SELECT 'outbox'::regclass::oid") == await mine.fetchval(
                "SELECT 'outbox'::regclass::oid"
            )
            async with writer.transaction():
                await writer.execute(INSERT, "agg", "k", "t", "{}")
                assert await oldest_writer(mine) is None
                async with mine.transaction():  # and one in this database still is
                    await mine.execute(INSERT, "agg", "k", "t", "{}")
                    watcher = await asyncpg.connect(database_url)
                    try:
                        found = await oldest_writer(watcher)
                    finally:
                        await watcher.close()
                    assert found is not None
                    assert found.pid == await mine.fetchval("SELECT pg_backend_pid()")
        finally:
            await writer.close()
            await mine.close()
    finally:
        await drop_database(pg_server.url, other)
