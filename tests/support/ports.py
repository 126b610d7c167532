"""Local TCP ports for tests."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now: for a server the test starts, or for a
    client that must find the connection refused. Bound, then released: another process
    could take it in between, which on a test machine it does not."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
