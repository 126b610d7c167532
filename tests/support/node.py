"""The npm packages in scripts/node (``bash scripts/tools.sh ensure node-packages``, which
``make test`` runs), called from the tests: custom resources validated against their
operators' CRD schemas, AsyncAPI documents read by the AsyncAPI parser. Without node or the
packages a test fails under ``OUTBOX_RELAY_REQUIRE_SERVICES=1`` and is skipped otherwise."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import REQUIRED

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "node"
MISSING = "the npm packages are not installed: bash scripts/tools.sh ensure node-packages"


def _script(name: str, *args: str, stdin: str = "") -> str:
    node = shutil.which("node")
    if node is None or not (SCRIPTS / "node_modules").is_dir():
        if REQUIRED:
            pytest.fail(MISSING)
        pytest.skip(MISSING)
    assert node is not None
    done = subprocess.run(
        [node, str(SCRIPTS / name), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=SCRIPTS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def crd_errors(objects: list[dict[str, Any]]) -> list[str]:
    """One line per schema error of each object (all must be custom resources of Strimzi or
    the Prometheus operator)."""
    if not objects:
        return []
    errors: list[str] = json.loads(_script("validate-objects.mjs", stdin=json.dumps(objects)))
    return errors


def asyncapi_diagnostics(document: Path) -> list[dict[str, Any]]:
    """What the AsyncAPI parser says of a document: each diagnostic's severity (0 error,
    1 warning, 2 information, 3 hint), code, message and path."""
    found: list[dict[str, Any]] = json.loads(_script("parse-asyncapi.mjs", str(document)))
    return found
