"""Who besides its owner may create objects in the relay's schema, read when ``run`` starts.

A function or operator put in a schema on a role's ``search_path`` can take a call of that
role's SQL (the product's own calls are exact ``pg_catalog`` signatures, held so by
tests/security/test_exact_calls.py; this is the backstop). ``grant`` and ``check`` warn
while others may create there; ``run`` does too, once, before its relay claims a lane: one
warning line, or with ``--refuse-open-schema`` the process exits 2 with that line instead.

The check waits for the database and the outbox as the relay does (a process may start
before either), retrying with the sidecar's back-off; it reads the catalog only, with the
process's own role. It is read once: a CREATE granted later is said by ``check`` and by the
next start.
"""

from __future__ import annotations

import logging

import anyio

from contracts.errors import ConfigError, DatabaseUnavailable
from migrations.grants import creators_warning, read_schema_creators
from pgconnect import DB_ERRORS, connect, connection_options

log = logging.getLogger("outbox_relay")

_FIRST_RETRY_S = 0.5
_CONNECT_TIMEOUT_S = 10.0
REFUSAL_FLAG = "--refuse-open-schema"


async def check_schema_creators(
    database_url: str | None,
    *,
    refuse: bool,
    transaction_pooler: bool,
    retry_max_s: float,
    checked: anyio.Event,
) -> None:
    """Read who may create in the schema once the database holds the outbox; warn (one line)
    or, with ``refuse``, raise :class:`ConfigError` (exit 2) when anyone besides its owner
    may. ``checked`` is set once the process may go on."""
    delay = _FIRST_RETRY_S
    while (found := await _read(database_url, transaction_pooler)) is None:
        await anyio.sleep(delay)
        delay = min(delay * 2, retry_max_s)
    schema, creators = found
    line = creators_warning(schema, creators)
    if line is not None:
        if refuse:
            raise ConfigError(f"{REFUSAL_FLAG}: {line}")
        log.warning(
            line,
            extra={
                "public_may_create": "PUBLIC" in creators,
                "roles_may_create": sum(creator != "PUBLIC" for creator in creators),
            },
        )
    checked.set()


async def _read(url: str | None, transaction_pooler: bool) -> tuple[str, tuple[str, ...]] | None:
    """The schema and its creators; None while the database cannot tell (unreachable, or no
    outbox yet): the relay and the sidecar say why meanwhile."""
    try:
        conn = await connect(
            url,
            timeout=_CONNECT_TIMEOUT_S,
            **connection_options(
                {"application_name": "outbox-relay"}, transaction_pooler=transaction_pooler
            ),
        )
    except DatabaseUnavailable:
        return None
    try:
        return await read_schema_creators(conn)
    except DB_ERRORS:
        return None
    finally:
        conn.terminate()  # nothing to flush; never wait on a slow server here
