"""Where the benchmarks keep their figures and the report its history and document; reading
and writing the figures, and the commit measured.

The paths are read as attributes of this module when used (``files.HISTORY``), so that a test
can point them all at a temporary directory in one place."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS_BENCH = ROOT / "docs" / "bench"
RESULTS = DOCS_BENCH / "results.json"
PLOT = DOCS_BENCH / "peers.png"
# Hook for the sidecar's cost (measured by bench/test_health_cost.py, not here): a JSON object
# {"ratio_to_sidecar_empty": <steady state with 1,000,000 terminal jobs / the same sidecar's
# steady state on an empty history>, "ratio": <the same / the one-shot check on an empty
# history>, "ratio_grace_0": ...}.
HEALTH_COST = DOCS_BENCH / "health_cost.json"
# bench/test_memory.py's figures, kept beside the comparison's (memory_figures()): a JSON
# object {"backlog": <events drained>, "peak_rss_mb": <the relay process' peak RSS>, ...}.
MEMORY = DOCS_BENCH / "memory.json"
# Every judged run, oldest first: one JSON object per line (history.history_entry()).
HISTORY = DOCS_BENCH / "history.jsonl"
# The document whose judged-run block the report writes (history.judged_block()).
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


Figures = Mapping[str, Any]


def loaded(source: Path | Figures) -> Figures:
    """A figures file's object ({} when there is none), or the object itself."""
    if isinstance(source, Path):
        return json.loads(source.read_text()) if source.is_file() else {}
    return source


def results_path() -> Path:
    """Where a run keeps the comparison's figures: BENCH_RESULTS, as bench/test_peers.py
    reads it, or docs/bench/results.json."""
    return Path(os.environ.get("BENCH_RESULTS", RESULTS))


def memory_figures(results: Path | None = None) -> Path:
    """bench/test_memory.py's figures: beside the comparison's (a trial with BENCH_RESULTS
    leaves the figures of make bench's run alone)."""
    return (results or results_path()).with_name(MEMORY.name)


def current_commit() -> str | None:
    """The checkout's commit, marked when tracked files outside docs/ have changes (the code
    measured is then not that commit's); None outside a git checkout."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run(
            [*git, "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{head}+changes" if changed else head


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Keep one benchmark's raw figures as JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
