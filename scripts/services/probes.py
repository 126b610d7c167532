"""Ready probes: does a server answer at an address, as the tests will reach it?

Each returns None when it answers and one line saying why not otherwise. The drivers are
imported on first use, so ``down`` needs nothing beyond the standard library.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class PostgresAnswer:
    """What a PostgreSQL server (or a pooler in front of one) says about itself."""

    version_num: int
    max_connections: int
    superuser: bool

    @property
    def major(self) -> int:
        return self.version_num // 10000


async def _postgres(url: str, pooled: bool) -> PostgresAnswer:
    import asyncpg

    # through a transaction pooler, no named prepared statements
    options: dict[str, Any] = {"statement_cache_size": 0} if pooled else {}
    conn = await asyncpg.connect(url, timeout=5, **options)
    try:
        row = await conn.fetchrow(
            "SELECT current_setting('server_version_num')::int AS v,"
            " current_setting('max_connections')::int AS m,"
            " (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS s"
        )
    finally:
        await conn.close()
    assert row is not None
    return PostgresAnswer(int(row["v"]), int(row["m"]), bool(row["s"]))


def postgres_answer(url: str, *, pooled: bool = False) -> PostgresAnswer | str:
    """The server's answer, or why there is none (one line, the URL's password left out)."""
    try:
        return asyncio.run(asyncio.wait_for(_postgres(url, pooled), PROBE_TIMEOUT_S))
    except Exception as exc:  # any failure means "does not answer"; the reason is shown
        return _why(exc)


async def _kafka(bootstrap: str) -> None:
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    try:
        await client.bootstrap()
        metadata = await client.fetch_all_metadata()
        if not metadata.brokers():
            raise RuntimeError("metadata names no broker")
    finally:
        await client.close()


def kafka_answer(bootstrap: str) -> str | None:
    """None when a broker at ``bootstrap`` answers a metadata request, else why not."""
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # a refused connection is an answer here, not an error
    try:
        asyncio.run(asyncio.wait_for(_kafka(bootstrap), PROBE_TIMEOUT_S))
    except Exception as exc:  # any failure means "does not answer"; the reason is shown
        return _why(exc)
    finally:
        quiet.setLevel(level)
    return None


def _why(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
