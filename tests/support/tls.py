"""TLS material for tests: the services' CA, and a CA nobody trusts."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

import pytest


def service_file(variable: str) -> str:
    """A file the test services name in the environment; skip (or fail when required) without it."""
    path = os.environ.get(variable)
    if not path:
        from tests.support.services import REQUIRED

        if REQUIRED:
            pytest.fail(f"OUTBOX_RELAY_REQUIRE_SERVICES=1 but {variable} is not set")
        pytest.skip(f"{variable} is not set")
    return path


def untrusted_ca(directory: Path) -> str:
    """A freshly made CA's certificate: real, valid, and not the one that signed the servers."""
    # Imported here: only the tests that need a wrong CA need the package.
    import trustme

    path = directory / "untrusted-ca.pem"
    path.write_bytes(trustme.CA().cert_pem.bytes())
    return str(path)


def with_tls(url: str, *, host: str, rootcert: str, mode: str = "verify-full") -> str:
    """``url`` pointed at ``host`` with TLS parameters in its query."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{userinfo}@{host}{port}" if userinfo else f"{host}{port}"
    query = urlencode({"sslmode": mode, "sslrootcert": rootcert})
    return urlunsplit(parts._replace(netloc=netloc, query=query))
