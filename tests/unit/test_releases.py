"""Releases: one version and its copies, a CHANGELOG section per release with its upgrade
notes, the previous release recorded as a commit, and the procedure that cuts one
(scripts/release.py), run here on a scratch repository (never on this one)."""

from __future__ import annotations

import datetime as dt
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from contracts import __version__
from scripts.release import (
    CHANGELOG,
    COPIES,
    PREVIOUS,
    UNRELEASED,
    UPGRADING,
    main,
    released_versions,
    unreleased,
)

REPO = Path(__file__).resolve().parents[2]
DAY = dt.date(2027, 1, 15)


def test_every_copy_of_the_version_is_the_one_version() -> None:
    # pyproject reads contracts.__version__; the Dockerfile, both kustomizations and the
    # migration Job's name copy it.
    assert {copy.path.as_posix() for copy in COPIES} >= {
        "contracts/__init__.py",
        "Dockerfile",
        "deploy/base/kustomization.yaml",
        "deploy/overlays/example/kustomization.yaml",
        "deploy/base/migrate-job.yaml",
    }
    assert {str(copy.path): copy.read(REPO) for copy in COPIES} == {
        str(copy.path): __version__ for copy in COPIES
    }
    assert 'version = { attr = "contracts.__version__" }' in (REPO / "pyproject.toml").read_text()


def test_the_changelog_has_upgrading_notes_for_unreleased_and_each_release() -> None:
    changelog = (REPO / CHANGELOG).read_text()
    headings = re.findall(r"^## .*$", changelog, re.M)
    assert headings[0] == UNRELEASED
    released = released_versions(changelog)
    assert len(headings) == 1 + len(released), headings  # every other section is a release
    # Right after a release nothing is unreleased yet; what is, says how to upgrade to it.
    notes = unreleased(changelog)
    assert notes.strip() == "" or UPGRADING in notes
    for version in released:
        section = changelog.split(f"\n## {version} - ", 1)[1].split("\n## ", 1)[0]
        assert UPGRADING in section, version
    if released:
        assert released[0] == __version__


def test_the_previous_release_is_recorded_as_a_commit_of_this_history() -> None:
    recorded = tomllib.loads((REPO / PREVIOUS).read_text())
    assert re.fullmatch(r"[0-9a-f]{40}", recorded["commit"])
    released = released_versions((REPO / CHANGELOG).read_text())
    # Before the first release: no version, no released section; after: the newest one.
    assert recorded["version"] == (released[0] if released else "")
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{recorded['commit']}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if known.returncode != 0:
        pytest.skip("a shallow clone: the previous release's commit is not here")
    ancestor = subprocess.run(
        ["git", "-C", str(REPO), "merge-base", "--is-ancestor", recorded["commit"], "HEAD"],
        check=False,
    )
    assert ancestor.returncode == 0


# -- the procedure, on a scratch repository ----------------------------------------------------
def _git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(root), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A repository holding the files a release writes, as this checkout has them, with its
    first commit recorded as the previous release."""
    root = tmp_path / "repo"
    for path in {CHANGELOG, *(copy.path for copy in COPIES)}:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)
    changelog = (root / CHANGELOG).read_text()
    if not unreleased(changelog).strip():  # this checkout was just released: work since
        (root / CHANGELOG).write_text(
            changelog.replace(
                f"{UNRELEASED}\n",
                f"{UNRELEASED}\n\n{UPGRADING}\n\nRun `outbox-relay migrate`.\n",
                1,
            )
        )
    _git(tmp_path, "init", "--quiet", str(root))
    _git(root, "config", "user.email", "release-test@example.invalid")
    _git(root, "config", "user.name", "release test")
    _git(root, "add", ".")
    _git(root, "commit", "--quiet", "-m", "the previous release")
    (root / PREVIOUS).parent.mkdir()
    (root / PREVIOUS).write_text(f'commit = "{_git(root, "rev-parse", "HEAD")}"\nversion = ""\n')
    _git(root, "add", ".")
    _git(root, "commit", "--quiet", "-m", "work since")
    return root


def _next(version: str) -> str:
    major, minor, _ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def test_a_release_is_prepared_then_committed_tagged_and_recorded(scratch: Path) -> None:
    version = _next(__version__)
    assert main(["prepare", version, "--root", str(scratch)], today=lambda: DAY) == 0
    for copy in COPIES:
        assert copy.read(scratch) == version, copy.path
    changelog = (scratch / CHANGELOG).read_text()
    assert f"{UNRELEASED}\n\n## {version} - 2027-01-15\n" in changelog
    assert unreleased(changelog).strip() == ""
    assert _git(scratch, "tag", "--list") == ""  # nothing tagged before the upgrade test ran

    assert main(["tag", version, "--root", str(scratch)]) == 0
    released = _git(scratch, "rev-parse", f"v{version}^{{commit}}")
    assert _git(scratch, "log", "-1", "--format=%s", released) == f"release: v{version}"
    assert _git(scratch, "cat-file", "-t", f"v{version}") == "tag"  # annotated
    recorded = tomllib.loads((scratch / PREVIOUS).read_text())
    assert recorded == {"commit": released, "version": version}
    assert _git(scratch, "rev-parse", "HEAD^") == released
    assert _git(scratch, "status", "--porcelain") == ""


def test_a_release_is_refused_on_a_changed_tree(scratch: Path) -> None:
    (scratch / CHANGELOG).write_text((scratch / CHANGELOG).read_text() + "\nmore\n")
    assert main(["prepare", _next(__version__), "--root", str(scratch)]) == 2


def test_a_release_is_refused_without_upgrading_notes(scratch: Path) -> None:
    changelog = (scratch / CHANGELOG).read_text().replace(UPGRADING, "### Notes")
    (scratch / CHANGELOG).write_text(changelog)
    _git(scratch, "commit", "--quiet", "-am", "no notes")
    assert main(["prepare", _next(__version__), "--root", str(scratch)]) == 2
    assert _git(scratch, "status", "--porcelain") == ""


def test_a_release_is_refused_when_its_tag_exists_or_it_is_older(scratch: Path) -> None:
    assert main(["prepare", "0.0.1", "--root", str(scratch)]) == 2
    assert main(["prepare", "1.2", "--root", str(scratch)]) == 2
    _git(scratch, "tag", f"v{_next(__version__)}")
    assert main(["prepare", _next(__version__), "--root", str(scratch)]) == 2
    assert _git(scratch, "status", "--porcelain") == ""


def test_a_release_is_refused_when_the_previous_one_is_not_in_the_history(scratch: Path) -> None:
    (scratch / PREVIOUS).write_text(f'commit = "{"0" * 40}"\nversion = ""\n')
    _git(scratch, "commit", "--quiet", "-am", "lost")
    assert main(["prepare", _next(__version__), "--root", str(scratch)]) == 2


def test_tagging_a_tree_that_was_not_prepared_is_refused(scratch: Path) -> None:
    assert main(["tag", _next(__version__), "--root", str(scratch)]) == 2
    (scratch / "stray.txt").write_text("x")
    assert main(["prepare", _next(__version__), "--root", str(scratch)]) == 2
    assert _git(scratch, "tag", "--list") == ""
