"""The container's own health check: ``GET /livez`` on the address ``run`` listens on.

It resolves the address from the same flags' variables and in the same order as ``run``
(``HEALTH_LISTEN_ADDR``, else ``PORT`` on all interfaces, else 127.0.0.1:8080), so a
``PORT`` given to the container moves the check with the server. An all-interfaces address
is checked on loopback. Exit 0 when the process answers 200, 1 otherwise.
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
from collections.abc import Mapping

from contracts.errors import ConfigError
from outbox_relay.options import LISTEN, listen_address, parse_listen

_TIMEOUT_S = 2.0
# An all-interfaces listen address is reached on loopback.
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104 (addresses read, not bound)


def probe_address(environ: Mapping[str, str]) -> tuple[str, int]:
    """Where ``run`` with this environment listens, as a client reaches it."""
    host, port = parse_listen(listen_address(argparse.Namespace(**{LISTEN.dest: None}), environ))
    return _ANY.get(host, host), port


def main(environ: Mapping[str, str] = os.environ) -> int:
    """Check once; the exit code is the verdict."""
    try:
        host, port = probe_address(environ)
    except ConfigError as exc:
        print(f"healthcheck: {exc}", file=sys.stderr)
        return 1
    connection = http.client.HTTPConnection(host, port, timeout=_TIMEOUT_S)
    try:
        connection.request("GET", "/livez")
        status = connection.getresponse().status
    except OSError as exc:
        print(f"healthcheck: {host}:{port} did not answer ({type(exc).__name__})", file=sys.stderr)
        return 1
    finally:
        connection.close()
    return 0 if status == 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
