"""Fixtures of the operator tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.operator.stack import Stack, write_policy


@pytest.fixture
def stack(database_url: str, kafka_bootstrap: str, topic_namespace: str, tmp_path: Path) -> Stack:
    """A scratch database, the broker, a topic namespace and the operator tests' policy."""
    return Stack(database_url, kafka_bootstrap, topic_namespace, write_policy(tmp_path))
