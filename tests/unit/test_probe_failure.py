"""A probe's driver error becomes one reason without driver text, whatever way it arrived."""

from __future__ import annotations

import asyncpg
import pytest

from health.probing import probe_failure


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        # A terminated backend: its FATAL message or the closed socket, whichever came first.
        (asyncpg.AdminShutdownError("terminating connection"), "database connection failed"),
        (asyncpg.CrashShutdownError("terminating connection"), "database connection failed"),
        (asyncpg.ConnectionDoesNotExistError("closed"), "database connection failed"),
        (asyncpg.QueryCanceledError("canceling statement"), "probe timed out"),
        (asyncpg.UndefinedColumnError("x"), "a column the probe reads is missing (42703)"),
        (asyncpg.DeadlockDetectedError("x"), "database refused the probe (40P01)"),
    ],
)
def test_probe_failure_reason(error: BaseException, reason: str) -> None:
    assert probe_failure(error).reason == reason
