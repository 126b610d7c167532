"""``.services/env``: the services' addresses as ``export`` lines a shell can source.

``up SVC...`` rewrites only the lines those services own and keeps the others an earlier
``up`` wrote; a full ``up`` writes them all anew.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping

HEADER = "# written by python -m scripts.services up; source it: set -a; . .services/env; set +a"


def render(values: Mapping[str, str]) -> str:
    """``export NAME=value`` lines, each value quoted for the shell (paths may hold spaces)."""
    lines = [HEADER, *(f"export {name}={shlex.quote(value)}" for name, value in values.items())]
    return "\n".join(lines) + "\n"


def parse(text: str) -> dict[str, str]:
    """The values of a file :func:`render` wrote (other lines are ignored)."""
    values = {}
    for line in text.splitlines():
        if not line.startswith("export "):
            continue
        name, sep, quoted = line.removeprefix("export ").partition("=")
        if not sep:
            continue
        words = shlex.split(quoted)
        values[name] = words[0] if words else ""
    return values


def merge(
    earlier: Mapping[str, str], owned: Iterable[str], fresh: Mapping[str, str]
) -> dict[str, str]:
    """An earlier file's values without any of ``owned`` (the variables the services brought
    up now may write), then the fresh values of those services."""
    dropped = set(owned) | set(fresh)
    kept = {name: value for name, value in earlier.items() if name not in dropped}
    return {**kept, **fresh}
