"""Tests find the broker by the address they were given, never as "the only broker here".

With a second, unrelated broker running on the machine (another project's), ``make test``
failed: the broker-metrics reader took the only ``kafka.Kafka`` process for the suite's
broker, found two, and read nothing. Here the second broker is a stand-in process named
``java`` with ``kafka.Kafka`` among its arguments, listening on a port of its own.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from bench.peers import measure
from scripts.services.host import command_line
from tests.support.services import REQUIRED

OTHER_BROKER = (
    "import socket, time\nserver = socket.create_server(('127.0.0.1', 0))\ntime.sleep(300)\n"
)


@pytest.fixture
def other_broker(tmp_path: Path) -> Iterator[int]:
    java = tmp_path / "java"
    java.symlink_to(sys.executable)
    process = subprocess.Popen(
        [str(java), "-c", OTHER_BROKER, "kafka.Kafka", "/elsewhere/server.properties"]
    )
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{process.pid}/comm").read_text().strip() != "java":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert " kafka.Kafka " in f" {command_line(process.pid)} "
        yield process.pid
    finally:
        process.kill()
        process.wait()


async def test_the_brokers_metrics_are_read_beside_another_broker(
    kafka_bootstrap: str, other_broker: int
) -> None:
    found = measure.broker_pid(kafka_bootstrap)
    if found is None:
        if REQUIRED:
            pytest.fail(f"no broker process listens on {kafka_bootstrap} on this machine")
        pytest.skip("the broker is not a process on this machine")
    assert found != other_broker
    assert " kafka.Kafka " in f" {command_line(found)} "

    before = await asyncio.to_thread(measure.read_produce_metrics, kafka_bootstrap)
    assert before, "the broker's request metrics could not be read"
    topic = f"t{uuid.uuid4().hex[:10]}-other-broker"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
    await producer.start()
    try:
        for n in range(5):
            await producer.send_and_wait(topic, b"x", key=b"%d" % n)
    finally:
        await producer.stop()
        await measure.delete_topics(kafka_bootstrap, [topic])
    after = await asyncio.to_thread(measure.read_produce_metrics, kafka_bootstrap)
    assert measure.produce_window(before, after)["produce_requests"] >= 5
