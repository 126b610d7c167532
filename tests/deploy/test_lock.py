"""The build is reproducible: requirements.lock pins the whole dependency set with hashes,
requirements-runtime.lock is its runtime part (with the otlp extra) at the same versions,
neither names a machine's wheel folder, and `make venv` in a
clean copy of the repository installs exactly the lock: `pip freeze` says so, and a venv
that drifted from it (a package removed or changed by hand) is told apart."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements.lock"
RUNTIME_LOCK = REPO / "requirements-runtime.lock"
# pip freeze leaves out the installer's own packages unless asked; the lock pins them too
# (pip, and the build backend the editable install runs without isolation).
_INSTALLER = frozenset({"pip", "setuptools", "wheel", "distribute"})
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)
_HASHED = re.compile(
    r"^[A-Za-z0-9][^\n]*\\\n(?:\s+--hash=sha256:[0-9a-f]{64}[ \\]*\n)+", re.MULTILINE
)


def canonical(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """name → version of every ``name==version`` line of a lock or of ``pip freeze``."""
    return {canonical(name): version for name, version in _PIN.findall(text)}


def drift(lock_text: str, freeze_text: str) -> dict[str, tuple[str | None, str | None]]:
    """name → (locked, installed) for every package where the venv and the lock differ."""
    locked = {k: v for k, v in pins(lock_text).items() if k not in _INSTALLER}
    installed = pins(freeze_text)
    return {
        name: (locked.get(name), installed.get(name))
        for name in locked.keys() | installed.keys()
        if locked.get(name) != installed.get(name)
    }


def test_every_pin_has_hashes_and_the_runtime_lock_is_the_same_versions() -> None:
    for lock in (LOCK, RUNTIME_LOCK):
        text = lock.read_text()
        pinned = pins(text)
        assert pinned, lock
        # Every pinned line is followed by at least one sha256 hash, so pip checks each file.
        assert len(_HASHED.findall(text)) == len(pinned), lock
    whole, runtime = pins(LOCK.read_text()), pins(RUNTIME_LOCK.read_text())
    assert runtime.items() <= whole.items()
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # The image's part: the dependencies and the otlp extra (run exports its spans).
    for requirement in declared["dependencies"] + declared["optional-dependencies"]["otlp"]:
        assert canonical(re.split(r"[<>=!~;\[ ]", requirement)[0]) in runtime, requirement
    for extra in ("test", "lint", "bench", "otel"):
        for requirement in declared["optional-dependencies"][extra]:
            assert canonical(re.split(r"[<>=!~;\[ ]", requirement)[0]) in whole, requirement


def test_the_locks_name_no_wheel_folder_of_the_machine_that_made_them() -> None:
    for lock in (LOCK, RUNTIME_LOCK):
        assert "--find-links" not in lock.read_text(), lock


def test_drift_names_each_difference() -> None:
    lock = (
        "a==1.0 \\\n    --hash=sha256:"
        + "0" * 64
        + "\nb-c==2.0 \\\n    --hash=sha256:"
        + "1" * 64
        + "\n"
    )
    assert drift(lock, "a==1.0\nB_C==2.0\n") == {}
    assert drift(lock, "a==1.1\nb-c==2.0\nextra==3\n") == {
        "a": ("1.0", "1.1"),
        "extra": (None, "3"),
    }


def _clean_copy(destination: Path) -> None:
    """The files a clone would have (tracked, or new and not ignored): no venv, no service state."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=False,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to copy")
    for name in listed.stdout.decode().split("\0"):
        if not name:
            continue
        source = REPO / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def _make_venv(clone: Path) -> subprocess.CompletedProcess[str]:
    # As a developer runs it, not as a sub-make of `make test` (its flags stay there).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "venv", f"PYTHON={sys.executable}"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def _freeze(clone: Path) -> str:
    return subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.timeout(1800)
def test_make_venv_installs_exactly_the_lock_and_a_drift_is_caught(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    _clean_copy(clone)
    made = _make_venv(clone)
    assert made.returncode == 0, made.stdout + made.stderr
    lock_text = (clone / "requirements.lock").read_text()
    assert drift(lock_text, _freeze(clone)) == {}

    # A planted drift: a locked package gone from the venv, as a hand-run pip would leave it.
    removed = "sortedcontainers"
    assert removed in pins(lock_text)
    subprocess.run(
        [str(clone / ".venv" / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", removed],
        check=True,
        capture_output=True,
    )
    assert drift(lock_text, _freeze(clone)) == {removed: (pins(lock_text)[removed], None)}

    # A changed lock is noticed: make venv brings the venv to the new lock, so a package
    # the lock no longer lists does not linger. iniconfig goes (pytest needs it at run
    # time, not to install), sortedcontainers comes back.
    dropped = "iniconfig"
    block = re.compile(rf"^{dropped}==[^\n]*\\\n(?:\s+--hash[^\n]*\n)+(?:\s+#[^\n]*\n)*", re.M)
    changed = block.sub("", lock_text)
    assert dropped not in pins(changed)
    (clone / "requirements.lock").write_text(changed)
    again = _make_venv(clone)
    assert again.returncode == 0, again.stdout + again.stderr
    assert drift(changed, _freeze(clone)) == {}
