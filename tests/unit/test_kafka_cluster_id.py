"""scripts/kafka_cluster_id.py: the id services.sh formats the broker's storage with."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid

from tests.services import KAFKA_CLUSTER_ID_SCRIPT, kafka_cluster_id_script


def test_an_id_that_would_read_as_an_option_is_drawn_again() -> None:
    # 0xF8 starts URL-safe base64 with "-": the storage tool took such an id for an option
    # and the services failed to start ("argument --cluster-id/-t: expected one argument").
    dashed = bytes([0xF8]) + bytes(15)
    plain = uuid.UUID(int=1).bytes
    assert base64.urlsafe_b64encode(dashed).decode().startswith("-")
    draws = iter([dashed, dashed, plain])
    assert kafka_cluster_id_script().cluster_id(lambda: next(draws)) == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_the_printed_id_is_a_uuid_in_kafka_s_form() -> None:
    printed = subprocess.run(
        [sys.executable, str(KAFKA_CLUSTER_ID_SCRIPT)], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert len(printed) == 22 and not printed.startswith("-")
    assert len(base64.urlsafe_b64decode(printed + "==")) == 16
