"""``up`` waits for a broker that is still loading its logs, and no longer than that.

A development broker stopped uncleanly (a session that ended without ``services-down``)
recovers every partition it holds before it answers: with many topics left behind, that
can take longer than the wait's 90 s. The wait runs out only once the broker's own count
of loaded logs stops moving.

The broker here is a ``sleep`` whose log the test writes; it "answers" once a file appears.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.services.declaration import wait_until_ready
from scripts.services.host import ServiceError
from scripts.services.kafka import KafkaBroker, KafkaProfile
from scripts.services.plan import PortPlan


class RecoveringBroker(KafkaBroker):
    """A broker whose process is a ``sleep`` and whose answer is a file."""

    def __init__(self, home: Path, process: subprocess.Popen[bytes]) -> None:
        super().__init__(
            ports=PortPlan(30000), home=home, lib=home / "lib", profile=KafkaProfile(secured=False)
        )
        self.wait_s = 2.0
        self.process = process
        (home / "logs").mkdir(parents=True, exist_ok=True)

    def ready(self) -> str | None:
        return None if (self.home / "answers").exists() else "connection refused"

    def running(self) -> bool:
        return self.process.poll() is None


def _line(done: int, total: int) -> str:
    return (
        f"[2026-12-04 06:15:21,181] INFO Completed load of Log(dir=/data/t-{done}, topic=t) "
        f"with 1 segments in 35ms ({done}/{total} completed in /data) (kafka.log.LogManager)\n"
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_the_wait_goes_on_while_the_broker_loads_its_logs(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="services")
    broker = RecoveringBroker(tmp_path, sleeper)

    def recover() -> None:
        # loading takes twice the wait's 2 s, a log every 0.4 s, then the broker answers
        for done in range(1, 11):
            with broker.log_file().open("a") as out:
                out.write(_line(done, 10))
            time.sleep(0.4)
        (tmp_path / "answers").touch()

    started = time.monotonic()
    loader = threading.Thread(target=recover)
    loader.start()
    try:
        wait_until_ready(broker, pause_s=0.1)
    finally:
        loader.join()
    assert time.monotonic() - started >= 4.0
    said = [m for m in caplog.messages if m.startswith("kafka: still coming up (loading its logs")]
    assert said and said[0].endswith("/10 partitions)")


def test_a_broker_that_shows_no_progress_is_given_up_on(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    broker = RecoveringBroker(tmp_path, sleeper)
    started = time.monotonic()
    with pytest.raises(
        ServiceError, match=r"^kafka: did not answer within 2s \(connection refused\)"
    ):
        wait_until_ready(broker, pause_s=0.1)
    assert time.monotonic() - started < 5


def test_loading_lines_of_an_earlier_start_are_not_progress(
    tmp_path: Path, sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture
) -> None:
    # The broker's server.log is appended to across starts: what an earlier start logged
    # must not keep this wait alive. start() notes the log's size when it starts a broker.
    caplog.set_level(logging.INFO, logger="services")
    broker = RecoveringBroker(tmp_path, sleeper)
    broker.log_file().write_text("".join(_line(done, 400) for done in range(1, 400)))
    (tmp_path / "server.log.offset").write_text(str(broker.log_file().stat().st_size))
    with pytest.raises(ServiceError, match="did not answer"):
        wait_until_ready(broker, pause_s=0.1)
    assert not any("loading its logs" in message for message in caplog.messages)


def test_a_broker_that_exits_is_reported_at_once_with_its_log_s_reason(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    broker = RecoveringBroker(tmp_path, sleeper)
    broker.wait_s = 60
    broker.log_file().write_text(
        "[2026] INFO starting\n[2026] ERROR Exiting Kafka due to fatal exception "
        "(org.apache.kafka.common.KafkaException: Failed to bind to 127.0.0.1:30092)\n"
        "[2026] INFO shut down completed\n"
    )
    sleeper.kill()
    sleeper.wait()
    started = time.monotonic()
    with pytest.raises(ServiceError) as raised:
        wait_until_ready(broker, pause_s=0.1)
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert message.startswith("kafka: exited while starting: [2026] ERROR Exiting Kafka")
    assert "Failed to bind to 127.0.0.1:30092" in message and "\n" not in message
