"""A soak whose services fail to start leaves nothing running behind it.

Seen in a full test run: the broker's storage format failed after PostgreSQL had started,
the run ended, and its PostgreSQL kept the port, so the next soak on that port could not
start at all.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from scripts.services.host import ServiceError
from tests.soak.run import Soak, SoakConfig
from tests.support.services import REQUIRED

# It starts services of its own.
pytestmark = pytest.mark.services

BASE_PORT = 25700  # neither make soak (25000) nor the two-minute soak (25500)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(300)
async def test_a_failed_start_stops_what_it_started(tmp_path: Path) -> None:
    if os.geteuid() != 0 and not REQUIRED:
        pytest.skip("the soak runs PostgreSQL as the postgres OS user: needs root")
    soak = Soak(SoakConfig(seconds=1, seed=1, base_port=BASE_PORT), tmp_path)

    def format_fails() -> None:
        raise ServiceError("kafka: storage format failed: (staged)")

    soak.services.kafka.format = format_fails  # type: ignore[method-assign]
    with pytest.raises(ServiceError, match="staged"):
        await soak.run()
    assert not _listening(soak.ports.postgres), "the soak's PostgreSQL outlived its run"
    assert not soak.services.root.exists()
