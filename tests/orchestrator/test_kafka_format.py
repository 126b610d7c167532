"""A broker's storage is formatted whatever cluster id is drawn.

Seen in a full test run: the two-minute soak failed to start because its random cluster id
began with ``-`` and the storage tool read it as an option ("argument --cluster-id/-t:
expected one argument"), one draw in 64.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest

from scripts.services.kafka import KafkaBroker, KafkaProfile
from scripts.services.plan import Layout, PortPlan
from tests.orchestrator.scratch import REPO

# It installs Kafka (Java and the broker's jars) to format a broker's storage.
pytestmark = pytest.mark.services

BASE = 24800  # formatting binds nothing; kept clear of the other blocks anyway


@pytest.mark.timeout(960)
def test_an_id_that_reads_as_an_option_does_not_stop_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = KafkaBroker(
        ports=PortPlan(BASE),
        home=tmp_path / "kafka",
        lib=Layout.for_checkout(REPO).state / "kafka-lib",
        profile=KafkaProfile(secured=False),
    )
    broker.install()
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    draws = iter([dashed, uuid.UUID(int=1)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))

    broker.configure()
    broker.format()

    meta = (tmp_path / "kafka" / "data" / "meta.properties").read_text()
    assert "cluster.id=AAAAAAAAAAAAAAAAAAAAAQ\n" in meta
