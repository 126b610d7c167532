"""The Rust worker example builds from crates.io alone, with nothing fetched at build time:
its lock file is committed and names only registry crates, it has no build script, and its
two direct dependencies (a PostgreSQL client and Tokio) leave their default features off."""

from __future__ import annotations

import tomllib
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rust-worker"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"


def test_every_locked_crate_comes_from_crates_io_with_a_checksum() -> None:
    lock = tomllib.loads((EXAMPLE / "Cargo.lock").read_text(encoding="utf-8"))
    packages = lock["package"]
    ours = [p for p in packages if "source" not in p]
    assert [p["name"] for p in ours] == ["outbox-relay-rust-worker"]
    for package in packages:
        if package in ours:
            continue
        assert package["source"] == CRATES_IO, package["name"]
        assert len(package["checksum"]) == 64, package["name"]


def test_no_build_script_and_two_dependencies_without_default_features() -> None:
    manifest = tomllib.loads((EXAMPLE / "Cargo.toml").read_text(encoding="utf-8"))
    assert "build" not in manifest["package"]
    assert not (EXAMPLE / "build.rs").exists()
    dependencies = manifest["dependencies"]
    assert set(dependencies) == {"tokio-postgres", "tokio"}
    for name, spec in dependencies.items():
        assert spec["default-features"] is False, name
        assert "git" not in spec and "path" not in spec, name
    assert manifest.get("patch") is None
    assert not (EXAMPLE / ".cargo").exists()  # no source replacement or vendored registry
