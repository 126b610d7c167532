"""Print the URL of the demo database, creating it on the server of DATABASE_URL if needed."""

from __future__ import annotations

import asyncio
import os
import sys
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DEMO_DATABASE = "outbox_relay_demo"


async def main() -> int:
    url = os.environ.get("DATABASE_URL")
    if not url:
        print("demo_database: DATABASE_URL is not set", file=sys.stderr)
        return 2
    conn = await asyncpg.connect(url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DEMO_DATABASE)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}"')
    finally:
        await conn.close()
    print(urlunsplit(urlsplit(url)._replace(path=f"/{DEMO_DATABASE}")))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
