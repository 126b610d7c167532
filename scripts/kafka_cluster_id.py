"""Print a fresh KRaft cluster id for ``kafka-storage format``.

A cluster id is a random UUID in URL-safe base64 without padding, as Kafka's own
``Uuid.randomUuid()`` makes it. Kafka also draws again when the text starts with ``-``:
the storage tool's argument parser reads such an id as an option
(``argument --cluster-id/-t: expected one argument``), which happens to one random id
in 64.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable


def cluster_id(draw: Callable[[], bytes] = lambda: uuid.uuid4().bytes) -> str:
    """A random cluster id that no argument parser takes for an option."""
    while True:
        text = base64.urlsafe_b64encode(draw()).decode().rstrip("=")
        if not text.startswith("-"):
            return text


if __name__ == "__main__":
    print(cluster_id())
