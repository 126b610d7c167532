"""Opening PostgreSQL connections with errors that are safe to show an operator."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg

from contracts.errors import ConfigError, DatabaseUnavailable
from pgconnect.preflight import (
    VERIFYING_SSLMODES,
    Transport,
    check_driver_settings,
    transport,
    validate_database_url,
)

__all__ = [  # and the names below
    "VERIFYING_SSLMODES",
    "Transport",
    "check_driver_settings",
    "transport",
    "validate_database_url",
]

# Driver exception → a short cause. Driver text is never shown: it can echo parts of
# the connection string.
_CAUSES: Mapping[type[BaseException], str] = {
    ConnectionRefusedError: "connection refused",
    socket.gaierror: "host name could not be resolved",
    TimeoutError: "timed out",
    ssl.SSLError: "TLS handshake failed",
}


def describe_target(url: str | None) -> str:
    """host:port/database of a URL, without user or password, for messages."""
    if not url:
        return "the database named by the PG* environment"
    try:
        validate_database_url(url)
    except ConfigError:
        # Its parts cannot be told apart, so any of them may hold part of the password.
        return "the database named by --database-url"
    parts = urlsplit(url)
    # libpq also takes host and port as query parameters; a host that is a path names the
    # directory of a Unix socket.
    query = parse_qs(parts.query)
    host = parts.hostname or query.get("host", ["localhost"])[-1]
    query_port = query.get("port", [""])[-1]
    port = parts.port or (int(query_port) if query_port.isdigit() else 5432)
    database = parts.path.lstrip("/") or "(default)"
    return f"{host}:{port}/{database}"


# OpenSSL's verification result → what the operator must fix. A host-name mismatch and an
# unknown issuer need different fixes (the URL's host, or sslrootcert).
_HOST_NAME_MISMATCH = frozenset({62, 64})  # X509_V_ERR_HOSTNAME_MISMATCH, _IP_ADDRESS_MISMATCH
_CERTIFICATE_EXPIRED = 10  # X509_V_ERR_CERT_HAS_EXPIRED


def _certificate_cause(exc: ssl.SSLCertVerificationError) -> str:
    if exc.verify_code in _HOST_NAME_MISMATCH:
        return "server certificate does not match the host name"
    if exc.verify_code == _CERTIFICATE_EXPIRED:
        return "server certificate has expired"
    return "server certificate not trusted (check sslrootcert)"


def unavailable_cause(exc: BaseException) -> str:
    """A short, secret-free description of why a connection failed."""
    # Before the table: a failed verification is also an ssl.SSLError (and a ValueError).
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _certificate_cause(exc)
    for kind, cause in _CAUSES.items():
        if isinstance(exc, kind):
            return cause
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return "authentication failed"
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return "database does not exist"
    if isinstance(exc, asyncpg.TooManyConnectionsError | asyncpg.CannotConnectNowError):
        return "server is not accepting connections"
    if isinstance(exc, asyncpg.ProtocolViolationError) and _REFUSED_STARTUP in str(exc):
        return POOLER_REFUSED_SETTING
    if isinstance(exc, asyncpg.PostgresError):
        return f"server refused ({exc.sqlstate})"
    if isinstance(exc, OSError):
        return f"network error ({type(exc).__name__})"
    return type(exc).__name__


# -- behind a transaction pooler ------------------------------------------------------------
TRANSACTION_POOLER = "transaction"
POOLERS = ("none", TRANSACTION_POOLER)
"""What sits between the product and PostgreSQL (``--database-pooler``)."""

# A pooler such as PgBouncer hands each transaction to whichever server connection is
# free, so nothing a session remembers survives to the next transaction: named prepared
# statements, SET, advisory locks, LISTEN. PgBouncer passes only the start-up parameters
# it tracks itself on to the server and refuses a login that carries any other
# ("unsupported startup parameter"), unless its ignore_startup_parameters drops them
# unapplied; application_name is one it tracks.
POOLER_STARTUP_PARAMETERS = frozenset({"application_name"})
_REFUSED_STARTUP = "unsupported startup parameter"
POOLER_REFUSED_SETTING = (
    "a connection pooler refused a start-up setting (behind PgBouncer in transaction "
    "mode, set --database-pooler transaction)"
)


def connection_options(
    server_settings: Mapping[str, str], *, transaction_pooler: bool
) -> dict[str, Any]:
    """asyncpg keywords for one part's connections, direct or behind a transaction pooler.

    Behind the pooler: no named prepared statements (asyncpg then sends each statement as
    one unnamed Parse/Bind/Execute, which the pooler keeps on one server connection), and
    only the start-up settings the pooler passes on; the rest are the role's to set
    (``ALTER ROLE … SET``), where every server connection the pooler opens picks them up.
    """
    if not transaction_pooler:
        return {"server_settings": dict(server_settings)}
    return {
        "server_settings": {
            name: value
            for name, value in server_settings.items()
            if name in POOLER_STARTUP_PARAMETERS
        },
        "statement_cache_size": 0,
    }


# The driver learns a type it has no codec for (an array above all) with a query of its own,
# on the connection that needs it and through that session's search_path; that query's calls
# are not exact pg_catalog signatures (typbasetype != 0 compares oid with integer), so a
# function or operator another role puts on the path would run in it, as our role. Every
# connection of ours therefore learns the array types its statements use first, in a
# transaction that sees pg_catalog alone, and keeps their codecs for its life
# (tests/security/test_exact_calls.py holds the list to the statements).
ARRAY_TYPES = ("bool", "int2", "int4", "int8", "name", "text", "uuid")
_LEARN_TYPES = "SELECT " + ", ".join(f"NULL::pg_catalog.{name}[]" for name in ARRAY_TYPES)
_CATALOG_ONLY = "SET LOCAL search_path = pg_catalog, pg_temp"


async def learn_types(conn: asyncpg.Connection) -> None:
    """Have the driver learn :data:`ARRAY_TYPES` on ``conn`` with only pg_catalog on the
    path; behind a transaction pooler too (the setting ends with the transaction)."""
    async with conn.transaction():
        await conn.execute(_CATALOG_ONLY)
        await conn.prepare(_LEARN_TYPES)


async def _connect_learning_types(*args: Any, **kwargs: Any) -> asyncpg.Connection:
    """A pool's new connection, having learnt the types first (the pool's ``init`` stays its
    caller's)."""
    conn: asyncpg.Connection = await asyncpg.connect(*args, **kwargs)
    try:
        await learn_types(conn)
    except BaseException:
        conn.terminate()
        raise
    return conn


def pool_options(
    server_settings: Mapping[str, str], *, transaction_pooler: bool, session_state: bool = True
) -> dict[str, Any]:
    """:func:`connection_options` for a pool, whose new connections :func:`learn_types`
    first, and are released without a session reset behind a transaction pooler
    (asyncpg's default runs UNLISTEN, pg_advisory_unlock_all and RESET ALL, which would land
    on a server connection another client's transaction may use next) or when its users
    keep no ``session_state``.

    The reset is one more round trip on every release. A pool whose users never SET,
    LISTEN or take a session lock has nothing to reset; an open transaction is still
    rolled back on release (asyncpg does that before the reset hook).
    """
    options = connection_options(server_settings, transaction_pooler=transaction_pooler)
    options["connect"] = _connect_learning_types
    if transaction_pooler or not session_state:
        options["reset"] = _no_session_to_reset
    return options


async def _no_session_to_reset(conn: asyncpg.Connection) -> None:
    """Release a pooled connection as it is: it holds no session state of ours."""


_DRIVER_REFUSED = (
    "the database driver refused a connection setting of --database-url or the PG* "
    "variables (a URL parameter's value, a certificate file)"
)


async def connect(url: str | None, *, timeout: float = 10.0, **kwargs: Any) -> asyncpg.Connection:
    """Open one connection (having it :func:`learn_types`); failures become
    :class:`DatabaseUnavailable` with a safe message."""
    try:
        conn: asyncpg.Connection = await asyncpg.connect(url, timeout=timeout, **kwargs)
        try:
            await learn_types(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn
    except asyncpg.ClientConfigurationError as exc:  # a setting the driver refuses
        raise ConfigError(_DRIVER_REFUSED) from exc
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {describe_target(url)}: {unavailable_cause(exc)}"
        ) from exc
    except ValueError as exc:  # asyncpg's DSN parser (certificate failures are OSErrors above)
        raise ConfigError("--database-url could not be parsed") from exc


async def create_pool(
    url: str | None, *, min_size: int = 1, max_size: int = 4, timeout: float = 10.0, **kwargs: Any
) -> asyncpg.Pool:
    """Open a pool; failures become :class:`DatabaseUnavailable` with a safe message."""
    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            url, min_size=min_size, max_size=max_size, timeout=timeout, **kwargs
        )
    except asyncpg.ClientConfigurationError as exc:
        raise ConfigError(_DRIVER_REFUSED) from exc
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseUnavailable(
            f"cannot connect to {describe_target(url)}: {unavailable_cause(exc)}"
        ) from exc
    except ValueError as exc:
        raise ConfigError("--database-url could not be parsed") from exc
    return pool


# Errors that mean "the database did not do it", to be retried by the loops.
DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def is_open(conn: asyncpg.Connection) -> bool:
    """False once the connection closed. The pool takes back a connection that closes
    while it is out, and asyncpg then refuses every call on it, ``is_closed()`` too: asking
    must not replace the error (or the cancellation) that is on its way out."""
    try:
        return not conn.is_closed()
    except asyncpg.InterfaceError:
        return False


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    """A pool connection that is thrown away, not reused, when anything went wrong on it.

    A connection killed or cancelled mid-protocol can come back from the pool in a state
    where the next query fails; terminating it makes the pool open a fresh one.
    """
    async with pool.acquire() as conn:
        try:
            yield conn
        except BaseException:
            if is_open(conn):
                conn.terminate()
            raise
