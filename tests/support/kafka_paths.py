"""Kafka paths a test can break: broker listeners whose advertised address is a proxy's.

The environment names them in ``KAFKA_PROXY_ROUTES`` as ``listen>upstream`` pairs, comma
separated, e.g. ``127.0.0.1:19094>127.0.0.1:9094``. The broker listener on the upstream
address advertises the listen address, so a client bootstrapped at the listen address is
told to come back there for every request: with a :class:`FaultProxy` listening there,
all of that client's Kafka traffic passes through the proxy. One route serves one client
(one relay) at a time; another client on another route keeps a healthy path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from tests.support.faultproxy import FaultProxy, parse_address

ROUTES_VARIABLE = "KAFKA_PROXY_ROUTES"


@dataclass(frozen=True)
class ProxyRoute:
    """Where the proxy listens (the advertised address) and the broker listener behind it."""

    listen: str
    upstream: str


def parse_routes(text: str) -> list[ProxyRoute]:
    """``listen>upstream`` pairs, comma separated; blanks between them are ignored."""
    routes = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        listen, sep, upstream = part.partition(">")
        if not sep:
            raise ValueError(f"{ROUTES_VARIABLE}: expected listen>upstream, got {part!r}")
        parse_address(listen.strip())
        parse_address(upstream.strip())
        routes.append(ProxyRoute(listen.strip(), upstream.strip()))
    return routes


def routes_from_env() -> list[ProxyRoute]:
    """The routes the environment names; empty when it names none."""
    return parse_routes(os.environ.get(ROUTES_VARIABLE, ""))


@contextmanager
def started_proxies(routes: list[ProxyRoute]) -> Iterator[list[FaultProxy]]:
    """One started proxy per route, closed (every connection reset) on the way out."""
    with ExitStack() as stack:
        yield [stack.enter_context(FaultProxy(r.listen, r.upstream)) for r in routes]
