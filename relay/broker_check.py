"""Why the broker could not be reached, in words an operator can act on.

aiokafka's producer reports every failure to bootstrap as one connection error without a
cause. When the producer cannot start, the relay opens one connection to the first
bootstrap address itself, with the same TLS and SASL settings, and names what failed from
the error's type and code (never its text, which may carry server details).
"""

from __future__ import annotations

import socket
import ssl

import anyio
from aiokafka import errors as kafka_errors
from aiokafka.conn import create_conn

from relay.config import RelayConfig

# OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
_NAME_MISMATCH_CODES = frozenset({62, 64})


def describe_bootstrap_failure(exc: BaseException) -> str:
    """A stable, secret-free cause for a failed bootstrap connection. Pure."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        if exc.verify_code in _NAME_MISMATCH_CODES:
            return "broker certificate does not match the host name"
        return "broker certificate not trusted"
    if isinstance(exc, ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(
        exc,
        kafka_errors.SaslAuthenticationFailed
        | kafka_errors.AuthenticationFailedError
        | kafka_errors.IllegalSaslStateError,
    ):
        return "SASL authentication failed"
    if isinstance(exc, kafka_errors.UnsupportedSaslMechanismError):
        return "SASL mechanism not enabled on the broker"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return "host name could not be resolved"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError):
        return f"network error ({type(exc).__name__})"
    if isinstance(exc, kafka_errors.KafkaError):
        return f"broker refused ({type(exc).__name__})"
    return type(exc).__name__


async def bootstrap_failure(config: RelayConfig, *, timeout_s: float = 10.0) -> str:
    """Connect once to the first bootstrap address as the producer would; the cause, or
    ``"bootstrap connection works"`` when it is not the connection that fails."""
    first = config.kafka_bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    security = config.kafka_security
    try:
        # aiokafka's own timeouts end a stuck attempt and close what it opened; the outer
        # bound only guards against a hang, since a cancelled attempt may leak its socket.
        with anyio.fail_after(2 * timeout_s):
            conn = await create_conn(
                host or "localhost",
                int(port or 9092),
                client_id=config.instance_id,
                request_timeout_ms=int(timeout_s * 1000),
                ssl_context=security.ssl_context(),
                security_protocol=security.protocol,
                sasl_mechanism=security.sasl_mechanism or "PLAIN",
                sasl_plain_username=security.sasl_username,
                sasl_plain_password=security.sasl_password,
            )
    except Exception as exc:
        return describe_bootstrap_failure(exc)
    conn.close()
    return "bootstrap connection works"
