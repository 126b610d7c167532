"""An aiokafka without an internal the relay relies on refuses `run` at start: one line
naming the installed aiokafka version, exit 2, against the real services.

Before the check, such an aiokafka either failed later with a raw traceback (a missing
``_compression_type``) or, for a connection's ``_writer``, silently turned off the reset
that keeps per-key order when a path to the broker stalls.
"""

from __future__ import annotations

import aiokafka
import pytest

from tests.foundation.test_unexpected_errors import json_lines, planted, run_args
from tests.support.cli import cli_env


@pytest.mark.parametrize(
    ("plant", "named"),
    [
        (
            "producer-without:_message_accumulator._compression_type",
            "MessageAccumulator._compression_type",
        ),
        ("connection-without:_writer", "AIOKafkaConnection._writer"),
        ("producer-without:_sender", "AIOKafkaProducer._sender"),
    ],
    ids=["compression", "writer", "sender"],
)
async def test_run_refuses_an_aiokafka_that_lacks_an_internal(
    database_url: str, kafka_bootstrap: str, plant: str, named: str
) -> None:
    code, stdout, stderr = await planted(
        plant, *run_args(database_url, kafka_bootstrap), env=cli_env(), timeout=90
    )

    assert code == 2, stderr
    assert "Traceback" not in stderr
    *logged, last = stderr.strip().splitlines()
    json_lines("\n".join(logged))  # whatever came before is log lines
    assert last.startswith("outbox-relay: error: "), stderr
    assert f"aiokafka {aiokafka.__version__} lacks" in last
    assert named in last
    assert "published_events_total" not in stdout
