"""A broker just started is this checkout's at once: ``up`` lists it as started (and
make test's clean-up stops it) only if ``pid()`` sees it straight after the launch.

Right after ``Popen`` returns, the JVM's ``/proc/<pid>/cmdline`` can still read empty, so
the command-line check that tells our broker from a stranger's on a pid file failed, and
``up`` left the broker out of the started list: in fresh-clone CI runs the clean-up
stopped PostgreSQL and PgBouncer and left the broker running. The started process's own
handle says it is ours without its command line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.services.kafka import KafkaBroker, KafkaProfile
from scripts.services.orchestrator import dev_services
from scripts.services.plan import Layout, PortPlan, port_base
from tests.support.ports import free_port
from tests.support.services import REQUIRED

REPO = Path(__file__).resolve().parents[2]


def test_a_broker_is_ours_the_moment_it_is_started(tmp_path: Path) -> None:
    # the jars where this checkout's up installs them
    (declared,) = [
        s
        for s in dev_services(Layout.for_checkout(REPO), PortPlan(port_base(os.environ)))
        if s.name == "kafka"
    ]
    assert isinstance(declared, KafkaBroker)
    lib = declared.lib
    if not any(lib.glob("kafka_*.jar")):
        if REQUIRED:
            pytest.fail(f"no Kafka jars in {lib}: python -m scripts.services up installs them")
        pytest.skip(f"no Kafka jars in {lib} (python -m scripts.services up installs them)")
    # The plan puts the plain listener at base + 92 and the controller beside it.
    broker = KafkaBroker(
        ports=PortPlan(free_port() - 92),
        home=tmp_path / "kafka",
        lib=lib,
        profile=KafkaProfile(secured=False),
    )
    broker.home.mkdir(parents=True)
    broker.start()
    try:
        started = int((broker.home / "kafka.pid").read_text())
        assert broker.pid() == started
        assert broker.running()
    finally:
        broker.stop()
    assert broker.pid() is None
