"""Fuzzing the operator's policy file: any text is a valid policy or one clear line.

A generated document starts from the documented example and is bent: wrong types, unknown
keys and sections, huge, negative and non-finite numbers, unicode keys, deep nesting,
truncated and spliced text. :func:`parse_policy` must return a policy whose bounds are
usable, or raise one :class:`ConfigError` of one line; ``check --policy`` must then exit 3
(monitoring-plugins: invalid arguments are UNKNOWN) with that line and nothing else (no
traceback, no report).
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from contracts.errors import ConfigError
from contracts.policy import Policy
from health.policy import parse_policy
from outbox_relay.cli import main
from tests.fuzz.profiles import fuzz_settings
from tests.fuzz.tomltext import toml_document

EXAMPLE = Path(__file__).parents[2] / "docs" / "policy.example.toml"
BASE: dict[str, Any] = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
SECTIONS = sorted(BASE)
KEYS = sorted({key for section in BASE.values() for key in section} | {"enabled"})
# Bounds the loader must refuse; a policy that accepts them is a finding too.
MAX_BOUND = 10**15

names = st.one_of(st.sampled_from(KEYS), st.text(max_size=12))
scalars = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, MAX_BOUND, MAX_BOUND + 1, 2**63, -(2**63), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=20),
    st.datetimes(),
    st.dates(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def bent_documents(draw: st.DrawFn) -> dict[str, Any]:
    """The example policy with a few sections or keys set, removed or added."""
    document = {section: dict(keys) for section, keys in BASE.items()}
    for _ in range(draw(st.integers(0, 4))):
        section = draw(st.one_of(st.sampled_from(SECTIONS), st.text(max_size=10)))
        match draw(st.sampled_from(["set", "delete", "replace_section", "disable"])):
            case "set":
                target = document.setdefault(section, {})
                if isinstance(target, dict):
                    target[draw(names)] = draw(values)
            case "delete":
                target = document.get(section)
                if isinstance(target, dict) and target:
                    target.pop(draw(st.sampled_from(sorted(target))))
                elif draw(st.booleans()):
                    document.pop(section, None)
            case "replace_section":
                document[section] = draw(values)
            case "disable":
                document[section] = {"enabled": draw(st.one_of(st.booleans(), values))}
    return document


def deep(depth: int) -> str:
    """Nesting deeper than a recursive parser's stack."""
    return "[outbox]\nmax_pending_count = " + "[" * depth + "]" * depth + "\n"


def texts() -> st.SearchStrategy[str]:
    """Whole documents, bent ones, and their text cut or spliced with random characters."""
    documents = bent_documents().map(toml_document)
    cut = st.tuples(documents, st.integers(0, 2000), st.text(max_size=10)).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] :]
    )
    nested = st.integers(1, 3000).map(deep)
    return st.one_of(documents, cut, nested, st.text(max_size=200))


def assert_usable(policy: Policy) -> None:
    """Every bound of an accepted policy is an integer the probes can use."""
    for section in msgspec.structs.asdict(policy).values():
        if section is None:
            continue
        fields = section if isinstance(section, dict) else msgspec.structs.asdict(section)
        for key, value in fields.items():
            if isinstance(value, bool):
                continue
            assert isinstance(value, int), key
            assert 0 <= value <= MAX_BOUND, key
    assert policy.evaluation.interval_ms > 0 and policy.evaluation.timeout_ms > 0


def parse_or_error(text: str) -> Policy | str:
    """The policy, or the error's message; anything else escapes and fails the test."""
    try:
        return parse_policy(text)
    except ConfigError as exc:
        return str(exc)


@fuzz_settings(max_examples=400)
@given(text=texts())
@example(text=toml_document(BASE))
@example(text=deep(1000))  # was a RecursionError traceback
@example(text='["a\\nb"]\nx = 1\n')  # a key with a line break must not break the line
@example(text=toml_document({**BASE, "outbox": {**BASE["outbox"], "x\ny": 1}}))
@example(text=toml_document({**BASE, "evaluation": {"interval_ms": math.nan}}))
@example(text=toml_document({**BASE, "evaluation": {"timeout_ms": -(2**64)}}))
def test_policy_text_is_a_policy_or_one_line(text: str) -> None:
    result = parse_or_error(text)
    if isinstance(result, Policy):
        assert_usable(result)
    else:
        assert result.startswith("policy"), result
        assert result.isprintable(), repr(result)


@fuzz_settings(max_examples=15)
@given(document=bent_documents())
@example(document={**BASE, "outbox": {**BASE["outbox"], "max_pending_count": "1e999"}})
def test_check_with_a_policy_file_refuses_it_on_one_line_or_runs(
    document: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = toml_document(document)
    path = tmp_path_factory.mktemp("policy") / "policy.toml"
    path.write_text(text, encoding="utf-8")
    capsys.readouterr()
    # Port 1 refuses at once: a valid policy then gets check's "unknown" (3), not a hang.
    code = main(["check", "--policy", str(path), "--database-url", "postgresql://127.0.0.1:1/none"])
    out, err = capsys.readouterr()
    # Both are 3 (unknown); what tells them apart is a report against one line.
    assert code == 3
    if isinstance(parse_or_error(text), Policy):
        assert '"status"' in out, out
        assert "outbox-relay: error:" not in err, err
    else:
        assert out == "", out
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("outbox-relay: error: policy"), err
