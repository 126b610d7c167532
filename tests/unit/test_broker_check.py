"""Naming why the broker could not be reached, from the error's type and code. No broker."""

from __future__ import annotations

import socket
import ssl

import pytest
from aiokafka import errors as kafka_errors

from relay.broker_check import describe_bootstrap_failure


def _certificate_error(code: int) -> ssl.SSLCertVerificationError:
    error = ssl.SSLCertVerificationError(1, "certificate verify failed")
    error.verify_code = code
    return error


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (_certificate_error(20), "broker certificate not trusted"),  # unable to get issuer
        (_certificate_error(62), "broker certificate does not match the host name"),
        (_certificate_error(64), "broker certificate does not match the host name"),
        (ssl.SSLError(1, "handshake"), "TLS handshake failed"),
        (kafka_errors.SaslAuthenticationFailed("bad"), "SASL authentication failed"),
        (
            kafka_errors.UnsupportedSaslMechanismError("x"),
            "SASL mechanism not enabled on the broker",
        ),
        (ConnectionRefusedError(), "connection refused"),
        (socket.gaierror(), "host name could not be resolved"),
        (TimeoutError(), "timed out"),
        (ConnectionResetError(), "network error (ConnectionResetError)"),
        (kafka_errors.KafkaConnectionError("x"), "broker refused (KafkaConnectionError)"),
    ],
)
def test_the_cause_comes_from_type_and_code(error: BaseException, cause: str) -> None:
    assert describe_bootstrap_failure(error) == cause


def test_the_error_text_never_reaches_the_cause() -> None:
    error = kafka_errors.SaslAuthenticationFailed("user relay password hunter2")
    assert "hunter2" not in describe_bootstrap_failure(error)
