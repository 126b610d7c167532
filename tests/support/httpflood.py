"""A connection flood against an HTTP port, run as its own process so that the server under
test does not share an event loop (or a core) with its attacker.

    python -m tests.support.httpflood HOST:PORT --mode linger --rate 350 --hold 3

``linger`` sends an oversized request (a 9 kB header) on each connection, then nothing;
``idle`` sends nothing at all. Each connection is kept open for ``--hold`` seconds (longer
than the server's I/O deadline) and then closed. The process floods until SIGTERM, then
prints one JSON line: connections opened, refused or timed out, and the seconds flooded.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import socket
import time
from types import FrameType

OVERSIZED = b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 9000 + b"\r\n\r\n"
CONNECT_TIMEOUT_S = 0.5


class _Stop(Exception):
    pass


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise _Stop


def flood(address: tuple[str, int], mode: str, rate: float, hold: float) -> dict[str, float]:
    """Open ``rate`` connections a second until SIGTERM; what was done, as counts."""
    payload = OVERSIZED if mode == "linger" else b""
    held: collections.deque[tuple[float, socket.socket]] = collections.deque()
    opened = failed = 0
    started = time.monotonic()
    interval = 1.0 / rate
    due = started
    try:
        while True:
            now = time.monotonic()
            while held and now - held[0][0] > hold:
                held.popleft()[1].close()
            if now < due:
                time.sleep(due - now)
            due = max(due, now - 1.0) + interval  # a stall is not made up for in a burst
            sock = socket.socket()
            sock.settimeout(CONNECT_TIMEOUT_S)
            try:
                sock.connect(address)
                if payload:
                    sock.sendall(payload)
            except OSError:
                sock.close()
                failed += 1
                continue
            opened += 1
            held.append((time.monotonic(), sock))
    except _Stop:
        pass
    finally:
        for _at, sock in held:
            sock.close()
    return {"opened": opened, "failed": failed, "seconds": time.monotonic() - started}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--mode", choices=("linger", "idle"), required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--hold", type=float, required=True)
    args = parser.parse_args()
    host, _, port = args.address.rpartition(":")
    signal.signal(signal.SIGTERM, _stop)
    print("flooding", flush=True)
    result = flood((host, int(port)), args.mode, args.rate, args.hold)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
