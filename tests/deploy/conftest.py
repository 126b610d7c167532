"""The deployment artefacts as a platform reads them: deploy/ rendered by kustomize (a pinned
release, built from the Go module proxy into this venv when missing), the Dockerfile's
instructions and compose.yaml's services."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts import __version__
from tests.support.services import REQUIRED

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
EXAMPLE = DEPLOY / "overlays" / "example"
STRIMZI = DEPLOY / "overlays" / "strimzi"
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5"
KUSTOMIZE_VERSION = "v5.8.2"  # the newest release the machine's Go (1.26) builds


def _version_of(binary: str) -> str | None:
    try:
        shown = subprocess.run(
            [binary, "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return None
    return shown.stdout.strip() or None


def _unavailable(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"kustomize {KUSTOMIZE_VERSION}: {why}")
    pytest.skip(f"kustomize {KUSTOMIZE_VERSION}: {why}")


@pytest.fixture(scope="session")
def kustomize() -> str:
    """The path of kustomize at the pinned release; built with ``go install`` if missing."""
    # Into the test venv's bin (made and thrown away with it); outside a venv, a user cache.
    in_venv = sys.prefix != sys.base_prefix
    bin_dir = Path(sys.executable).parent if in_venv else Path.home() / ".cache/outbox-relay/bin"
    here = bin_dir / "kustomize"
    for candidate in (os.environ.get("KUSTOMIZE"), str(here), shutil.which("kustomize")):
        if candidate and _version_of(candidate) == KUSTOMIZE_VERSION:
            return candidate
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        _unavailable("not installed and no Go toolchain to build it (or set KUSTOMIZE)")
    assert go is not None
    bin_dir.mkdir(parents=True, exist_ok=True)
    built = subprocess.run(
        [go, "install", f"{KUSTOMIZE_MODULE}@{KUSTOMIZE_VERSION}"],
        env={**os.environ, "GOBIN": str(bin_dir), "GOFLAGS": "-buildvcs=false"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if built.returncode != 0 or _version_of(str(here)) != KUSTOMIZE_VERSION:
        _unavailable(f"go install failed: {built.stderr[-2000:]}")
    return str(here)


def migrate_job_name(version: str = __version__) -> str:
    """The migration Job of a release: one per release, named for its version."""
    return f"outbox-relay-migrate-{version.replace('.', '-')}"


MIGRATE_JOB = migrate_job_name()


def render(kustomize: str, directory: Path) -> list[dict[str, Any]]:
    """``kustomize build directory`` as a list of objects."""
    built = subprocess.run(
        [kustomize, "build", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return [doc for doc in yaml.safe_load_all(built.stdout) if doc]


@pytest.fixture(scope="session")
def rendered(kustomize: str) -> list[dict[str, Any]]:
    """The example overlay, rendered."""
    return render(kustomize, EXAMPLE)


@pytest.fixture(scope="session")
def rendered_strimzi(kustomize: str) -> list[dict[str, Any]]:
    """The Strimzi overlay, rendered."""
    return render(kustomize, STRIMZI)


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The object of ``kind`` whose name is ``name`` (or starts with it and a hash suffix)."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and re.fullmatch(rf"{re.escape(name)}(-[a-z0-9]{{10}})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, (kind, name, [o["metadata"]["name"] for o in objects])
    return found[0]


# -- the Dockerfile --------------------------------------------------------------------------
@dataclass(frozen=True)
class Instruction:
    """One Dockerfile instruction of the final stage (continuations joined)."""

    keyword: str
    text: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form ENTRYPOINT, CMD or HEALTHCHECK ... CMD."""
        text = self.text.split(" CMD ", 1)[1] if self.keyword == "HEALTHCHECK" else self.text
        value = json.loads(text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), self.text
        return value

    def pairs(self) -> dict[str, str]:
        """The key=value pairs of an ENV, LABEL or ARG."""
        return {
            key: value.strip('"') for key, value in re.findall(r'([\w.]+)=("[^"]*"|\S*)', self.text)
        }


def dockerfile_stages(path: Path = REPO / "Dockerfile") -> list[list[Instruction]]:
    """Every stage's instructions, in order."""
    joined = re.sub(r"\s*\\\n\s*", " ", path.read_text())
    stages: list[list[Instruction]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, text = line.partition(" ")
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append(Instruction(keyword.upper(), text.strip()))
    return stages


def image_config(stage: list[Instruction]) -> dict[str, Any]:
    """What the final stage gives a container: entry point, command, user, env, port."""
    env: dict[str, str] = {}
    for instruction in stage:
        if instruction.keyword == "ENV":
            env.update(instruction.pairs())
    last = {i.keyword: i for i in stage}
    return {
        "entrypoint": last["ENTRYPOINT"].exec_form(),
        "cmd": last["CMD"].exec_form(),
        "user": last["USER"].text,
        "env": env,
        "expose": last["EXPOSE"].text.split(),
        "healthcheck": last["HEALTHCHECK"].exec_form(),
        "labels": {k: v for i in stage if i.keyword == "LABEL" for k, v in i.pairs().items()},
        "args": {k: v for i in stage if i.keyword == "ARG" for k, v in i.pairs().items()},
    }


@pytest.fixture(scope="session")
def image() -> dict[str, Any]:
    """The final stage's container settings."""
    return image_config(dockerfile_stages()[-1])


def compose_services() -> dict[str, Any]:
    """compose.yaml's services (anchors resolved)."""
    services: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    return services
