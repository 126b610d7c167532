"""The soak's broker formats its storage whatever cluster id it draws.

Seen in a full test run: the two-minute soak failed to start because its random cluster id
began with ``-`` and the storage tool read it as an option ("argument --cluster-id/-t:
expected one argument"), one draw in 64. scripts/services.sh had been fixed for that
(scripts/kafka_cluster_id.py); the soak's own broker drew its id by itself.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest

from tests.soak import services
from tests.soak.services import Ports, SoakKafka

BASE_PORT = 25800  # formatting binds nothing; kept clear of the other soaks' ranges anyway


@pytest.mark.timeout(960)
def test_an_id_that_reads_as_an_option_does_not_stop_the_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, kafka_lib = services.prepare()
    dashed = uuid.UUID(bytes=bytes([0xF8]) + bytes(15))
    assert base64.urlsafe_b64encode(dashed.bytes).decode().startswith("-")
    draws = iter([dashed, uuid.UUID(int=1)])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(draws))

    kafka = SoakKafka(kafka_lib, tmp_path, Ports(BASE_PORT))
    kafka.init()

    meta = (tmp_path / "kafka" / "data" / "meta.properties").read_text()
    assert "cluster.id=AAAAAAAAAAAAAAAAAAAAAQ\n" in meta
