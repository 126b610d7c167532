"""The KRaft cluster id the orchestrator formats a broker's storage with."""

from __future__ import annotations

import base64
import uuid

from scripts.services.kafka import cluster_id


def test_an_id_that_would_read_as_an_option_is_drawn_again() -> None:
    # 0xF8 starts URL-safe base64 with "-": the storage tool took such an id for an option
    # and the services failed to start ("argument --cluster-id/-t: expected one argument").
    dashed = bytes([0xF8]) + bytes(15)
    plain = uuid.UUID(int=1).bytes
    assert base64.urlsafe_b64encode(dashed).decode().startswith("-")
    draws = iter([dashed, dashed, plain])
    assert cluster_id(lambda: next(draws)) == "AAAAAAAAAAAAAAAAAAAAAQ"


def test_a_drawn_id_is_a_uuid_in_kafka_s_form() -> None:
    drawn = cluster_id()
    assert len(drawn) == 22 and not drawn.startswith("-")
    assert len(base64.urlsafe_b64decode(drawn + "==")) == 16
