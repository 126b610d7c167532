"""PostgreSQL's plans, as ``EXPLAIN (FORMAT JSON)`` gives them, for tests that read them."""

from __future__ import annotations

from typing import Any


def plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    """``node`` and every node beneath it, parents before their children."""
    return [node, *(n for child in node.get("Plans", []) for n in plan_nodes(child))]


def blocks_read(node: dict[str, Any]) -> int:
    """The shared buffers ``node`` and its children read, from cache or not, as ``EXPLAIN
    (ANALYZE, BUFFERS)`` counts them."""
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
