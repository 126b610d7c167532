"""docs/security.md, "Threat model": every line names a test that exists (a file, and a
test function in it where the line names one), or says it is a residue."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECURITY = REPO / "docs" / "security.md"
_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`")


def threat_model_rows() -> list[str]:
    text = SECURITY.read_text()
    section = text.split("\n## Threat model\n", 1)[1].split("\n## ", 1)[0]
    return [
        line
        for line in section.splitlines()
        if line.startswith("| can") or line.startswith("| cannot")
    ]


def test_the_threat_model_has_lines() -> None:
    assert len(threat_model_rows()) >= 10


def test_every_line_names_a_test_that_exists_or_says_it_is_a_residue() -> None:
    for row in threat_model_rows():
        test_cell = row.rstrip(" |").rsplit("|", 1)[1]
        references = _REFERENCE.findall(test_cell)
        assert references or "residue" in test_cell, row
        for path, name in references:
            source = REPO / path
            assert source.is_file(), (path, row)
            if name:
                assert re.search(rf"^(async )?def {name}\(", source.read_text(), re.M), (
                    f"{path}::{name}",
                    row,
                )
