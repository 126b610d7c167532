"""Cutting a release: ``make release VERSION=X.Y.Z`` (docs/development.md, "Releases").

Two steps, with the upgrade test between them (the Makefile runs them in order):

- ``python -m scripts.release prepare X.Y.Z`` checks that the release can be cut (a clean
  tree, a new version, no tag ``vX.Y.Z`` yet, a CHANGELOG "Unreleased" section with its
  "Upgrading" notes, the previous release's commit in this history), then writes the
  version into every copy (:data:`COPIES`) and turns "Unreleased" into the release's
  section, leaving the changes uncommitted;
- ``python -m scripts.release tag X.Y.Z`` commits exactly those changes as ``release:
  vX.Y.Z``, tags that commit ``vX.Y.Z`` (annotated), and records it as the previous release
  in release/previous.toml, in a second commit. Nothing is pushed.

Exit codes: 0 done; 2 the release cannot be cut (one line says why); 1 git failed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS = Path("release/previous.toml")
CHANGELOG = Path("CHANGELOG.md")
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
UNRELEASED = "## Unreleased"
UPGRADING = "### Upgrading"
_RELEASED = re.compile(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", re.M)


class CannotRelease(Exception):
    """The release cannot be cut; the message says why (exit 2)."""


@dataclass(frozen=True)
class Copy:
    """One place the version is written, as a pattern whose ``version`` group holds it."""

    path: Path
    pattern: re.Pattern[str]
    dashed: bool = False  # written with dashes for dots (a Kubernetes name)

    def read(self, root: Path) -> str:
        found = self.pattern.search((root / self.path).read_text())
        if found is None:
            raise CannotRelease(f"{self.path}: the version is not where it is expected")
        return found["version"].replace("-", ".") if self.dashed else found["version"]

    def write(self, root: Path, version: str) -> None:
        file = root / self.path
        text = file.read_text()
        written = version.replace(".", "-") if self.dashed else version
        new, count = self.pattern.subn(
            lambda m: m.group(0).replace(m["version"], written, 1), text, count=1
        )
        if count != 1:
            raise CannotRelease(f"{self.path}: the version is not where it is expected")
        file.write_text(new)


_V = r"(?P<version>\d+\.\d+\.\d+)"
COPIES: tuple[Copy, ...] = (
    # The one source: pyproject reads it, every part reports it (contracts.__version__).
    Copy(Path("contracts/__init__.py"), re.compile(rf'^__version__ = "{_V}"$', re.M)),
    Copy(Path("Dockerfile"), re.compile(rf"^ARG VERSION={_V}$", re.M)),
    Copy(Path("Dockerfile"), re.compile(rf"-t outbox-relay:{_V} \.$", re.M)),
    Copy(Path("deploy/base/kustomization.yaml"), re.compile(rf"^    newTag: {_V}$", re.M)),
    Copy(
        Path("deploy/overlays/example/kustomization.yaml"),
        re.compile(rf"^    newTag: {_V}$", re.M),
    ),
    Copy(
        Path("deploy/base/migrate-job.yaml"),
        re.compile(r"^  name: outbox-relay-migrate-(?P<version>\d+-\d+-\d+)$", re.M),
        dashed=True,
    ),
)


def parse_version(text: str) -> tuple[int, int, int]:
    found = _VERSION.fullmatch(text)
    if found is None:
        raise CannotRelease(f"the version must be X.Y.Z, got {text!r}")
    return int(found[1]), int(found[2]), int(found[3])


def released_versions(changelog: str) -> list[str]:
    """The versions with a section of their own, newest first."""
    return [m[1] for m in _RELEASED.finditer(changelog)]


def unreleased(changelog: str) -> str:
    """The text of the "Unreleased" section (without its heading)."""
    start = changelog.find(f"\n{UNRELEASED}\n")
    if start < 0:
        raise CannotRelease(f"CHANGELOG.md has no {UNRELEASED!r} section")
    body = changelog[start + len(UNRELEASED) + 2 :]
    following = body.find("\n## ")
    return body if following < 0 else body[: following + 1]


def cut_changelog(changelog: str, version: str, day: dt.date) -> str:
    """ "Unreleased" becomes the release's section, under a new, empty "Unreleased"."""
    notes = unreleased(changelog)
    if UPGRADING not in notes:
        raise CannotRelease(
            f"CHANGELOG.md's {UNRELEASED} section has no {UPGRADING!r} notes: say what an "
            "operator runs, and in which order, to upgrade from the previous release"
        )
    heading = f"## {version} - {day.isoformat()}"
    return changelog.replace(f"\n{UNRELEASED}\n", f"\n{UNRELEASED}\n\n{heading}\n", 1)


def _git(root: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(
            done.returncode, ["git", *args], done.stdout, done.stderr
        )
    return done.stdout.strip() if done.returncode == 0 else ""


def current_version(root: Path) -> str:
    return COPIES[0].read(root)


def previous_commit(root: Path) -> str:
    commit: str = tomllib.loads((root / PREVIOUS).read_text())["commit"]
    return commit


def check_can_release(root: Path, version: str) -> None:
    """Refuse, with the reason, a release that cannot be cut from this tree now."""
    wanted = parse_version(version)
    if _git(root, "status", "--porcelain"):
        raise CannotRelease("the working tree has changes: commit or stash them first")
    if _git(root, "tag", "--list", f"v{version}"):
        raise CannotRelease(f"tag v{version} exists already")
    changelog = (root / CHANGELOG).read_text()
    current = current_version(root)
    released = released_versions(changelog)
    if wanted < parse_version(current) or (
        wanted == parse_version(current) and current in released
    ):
        raise CannotRelease(f"{version} is not newer than {current}, released or in the tree")
    if version in released:
        raise CannotRelease(f"CHANGELOG.md has a {version} section already")
    if not unreleased(changelog).strip():
        raise CannotRelease(f"CHANGELOG.md's {UNRELEASED} section is empty")
    commit = previous_commit(root)
    ancestor = subprocess.run(
        ["git", "-C", str(root), "merge-base", "--is-ancestor", commit, "HEAD"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if ancestor.returncode != 0:
        raise CannotRelease(
            f"the previous release's commit {commit[:12]} (release/previous.toml) is not in "
            "this history: fetch it (a shallow clone lacks it)"
        )


def prepare(root: Path, version: str, day: dt.date) -> list[Path]:
    """Write the release into the tree (uncommitted); the files changed."""
    check_can_release(root, version)
    changelog = root / CHANGELOG
    changelog.write_text(cut_changelog(changelog.read_text(), version, day))
    for copy in COPIES:
        copy.write(root, version)
    return sorted({CHANGELOG, *(copy.path for copy in COPIES)})


def tag(root: Path, version: str) -> str:
    """Commit the prepared release, tag it, record it as the previous release; its commit."""
    expected = {str(p) for p in (CHANGELOG, *(copy.path for copy in COPIES))}
    changed = {
        *_git(root, "diff", "--name-only", "HEAD").splitlines(),
        *_git(root, "ls-files", "--others", "--exclude-standard").splitlines(),
    }
    if not changed or not changed <= expected:
        raise CannotRelease(
            f"the tree is not a prepared release of {version}: run `make release` "
            f"(changed: {', '.join(sorted(changed)) or 'nothing'})"
        )
    for copy in COPIES:
        if copy.read(root) != version:
            raise CannotRelease(f"{copy.path} does not say {version}: run prepare again")
    if version not in released_versions((root / CHANGELOG).read_text()):
        raise CannotRelease(f"CHANGELOG.md has no {version} section: run prepare again")
    _git(root, "add", "--", *sorted(expected))
    _git(root, "commit", "--quiet", "-m", f"release: v{version}")
    commit = _git(root, "rev-parse", "HEAD")
    _git(root, "tag", "--annotate", f"v{version}", "-m", f"outbox-relay {version}")
    (root / PREVIOUS).write_text(
        _PREVIOUS_TEMPLATE.format(commit=commit, version=version, tag=f"v{version}")
    )
    _git(root, "add", "--", str(PREVIOUS))
    _git(
        root,
        "commit",
        "--quiet",
        "-m",
        f"release: v{version} is the release the next one upgrades from",
    )
    return commit


_PREVIOUS_TEMPLATE = """\
# The previous release: the commit the upgrade test (tests/upgrade/) starts from, checked out
# beside this one with `git worktree` (a tag may not travel with every clone; the commit
# does). `make release` rewrites it once a release is tagged (docs/development.md,
# "Releases").
commit = "{commit}"  # {tag}
version = "{version}"
"""


def main(argv: Sequence[str] | None = None, *, today: Callable[[], dt.date] = dt.date.today) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.release")
    parser.add_argument("step", choices=("prepare", "tag"))
    parser.add_argument("version")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    try:
        if args.step == "prepare":
            changed = prepare(args.root, args.version, today())
            print(f"release {args.version} prepared: {', '.join(map(str, changed))}")
        else:
            commit = tag(args.root, args.version)
            print(f"tagged v{args.version} at {commit}; recorded as the previous release")
            print(f"publish it: git push origin HEAD v{args.version}")
    except CannotRelease as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(
            f"release: git {' '.join(exc.cmd[1:2])} failed: {exc.stderr.strip()}", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
