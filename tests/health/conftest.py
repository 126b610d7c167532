"""The health tests' fixtures; their policies and rows come from tests/support."""

from __future__ import annotations

import pytest

from tests.support.policies import RECEIPT_RETENTION_MS


@pytest.fixture
def receipt_retention_ms() -> int:
    return RECEIPT_RETENTION_MS
