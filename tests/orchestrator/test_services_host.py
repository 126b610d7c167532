"""The orchestrator's machine helpers that need no service: the one line that says why,
and who listens on a port."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

from scripts.services.host import (
    alive,
    failure,
    listening_sockets,
    pid_listening_on,
    port_taken_by,
    reason_in,
)

# /proc/net/tcp and tcp6 as Linux prints them (header, then one socket per line)
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5E1C 00000000:0000 0A 00000000:00000000 00:00000000 00000000   116        0 41112 1 0 100 0 0 10 0
   1: 0100007F:5E1C 0100007F:C350 01 00000000:00000000 00:00000000 00000000   116        0 41999 1 0 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11000 1 0 100 0 0 10 0
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:5DDC 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 52001 1 0 100 0 0 10 0
   1: 00000000000000000000000001000000:5DDD 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 52002 1 0 100 0 0 10 0
"""


def test_the_line_that_says_why_is_the_last_error_not_the_last_line() -> None:
    log = (
        "LOG:  starting PostgreSQL 15\n"
        'FATAL:  could not create lock file "/x/.s.PGSQL.24032.lock": Permission denied\n'
        "LOG:  database system is shut down\n"
    )
    assert reason_in(log).startswith("FATAL:  could not create lock file")
    assert reason_in("one\ntwo\n\n") == "two"
    assert reason_in("") == ""


def test_a_failure_is_one_line_naming_the_service_and_its_log(tmp_path: Path) -> None:
    log = tmp_path / "pgbouncer.log"
    log.write_text("2026 LOG kernel file descriptor limit\n2026 FATAL cannot open logfile\n")
    message = str(failure("pgbouncer", "did not start", log_file=log))
    assert message == f"pgbouncer: did not start: 2026 FATAL cannot open logfile (log: {log})"
    assert "\n" not in message
    assert str(failure("pg18", "initdb failed")) == "pg18: initdb failed: no log output"


def test_listening_sockets_are_read_from_both_tables() -> None:
    assert listening_sockets(TCP) == [
        (ipaddress.ip_address("127.0.0.1"), 24092, 41112),
        (ipaddress.ip_address("0.0.0.0"), 22, 11000),  # noqa: S104 - parsed, not bound
    ]
    assert listening_sockets(TCP6) == [
        (ipaddress.ip_address("127.0.0.1"), 24028, 52001),  # v4-mapped, as a JVM binds
        (ipaddress.ip_address("::1"), 24029, 52002),
    ]


def test_the_process_behind_an_address_is_the_one_listening_there() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert pid_listening_on(f"127.0.0.1:{port}") == os.getpid()
        assert pid_listening_on(f"localhost:{port}") == os.getpid()
        taken = port_taken_by(port)
        assert taken is not None and taken.startswith(f"pid {os.getpid()} (")
    assert pid_listening_on(f"127.0.0.1:{port}") is None
    assert port_taken_by(port) is None


def test_a_process_that_ended_is_not_alive_even_before_it_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        pass
    assert not alive(child.pid)  # a zombie
    child.wait()
    assert alive(os.getpid())
    assert not alive(None)
