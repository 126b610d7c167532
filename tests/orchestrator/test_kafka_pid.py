"""The broker of this checkout is found to stop it even when its pid file names no live
broker: by the process listening on its address, whose command line is this checkout's."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.services.host import pid_listening_on
from scripts.services.kafka import KafkaBroker, KafkaProfile
from scripts.services.plan import PortPlan
from tests.support.ports import free_port

LISTEN = (
    "import socket, sys, time\n"
    "server = socket.create_server(('127.0.0.1', int(sys.argv[1])))\n"
    "time.sleep(120)\n"
)


def _broker(tmp_path: Path, port: int) -> KafkaBroker:
    # The plan puts the broker's plain listener at base + 92.
    return KafkaBroker(
        ports=PortPlan(port - 92),
        home=tmp_path / "kafka",
        lib=tmp_path / "lib",
        profile=KafkaProfile(secured=False),
    )


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[KafkaBroker, subprocess.Popen[bytes]]]:
    port = free_port()
    broker = _broker(tmp_path, port)
    if broker.bootstrap != f"127.0.0.1:{port}":
        pytest.skip("the port plan does not put the plain listener at base + 92")
    process = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(port), "kafka.Kafka", str(broker.properties)]
    )
    try:
        deadline = time.monotonic() + 10
        while pid_listening_on(broker.bootstrap) != process.pid:
            assert time.monotonic() < deadline, "the stand-in never listened"
            time.sleep(0.05)
        yield broker, process
    finally:
        process.kill()
        process.wait()


def test_a_broker_whose_pid_file_is_stale_is_found_by_its_address(
    listener: tuple[KafkaBroker, subprocess.Popen[bytes]],
) -> None:
    broker, process = listener
    broker.home.mkdir(parents=True, exist_ok=True)
    (broker.home / "kafka.pid").write_text("999999\n")  # names no live broker
    assert broker.pid() == process.pid
    assert broker.running()


def test_another_checkout_s_broker_on_the_address_is_not_ours(tmp_path: Path) -> None:
    port = free_port()
    broker = _broker(tmp_path, port)
    other = subprocess.Popen(
        [sys.executable, "-c", LISTEN, str(port), "kafka.Kafka", "/elsewhere/server.properties"]
    )
    try:
        deadline = time.monotonic() + 10
        while pid_listening_on(broker.bootstrap) != other.pid:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert broker.pid() is None
    finally:
        other.kill()
        other.wait()
