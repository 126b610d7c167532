"""Policy files: every family fully configured or disabled; one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.errors import ConfigError
from contracts.policy import EvaluationSettings, Family, OutboxPolicy
from health.policy import load_policy, parse_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "policy.example.toml"

MINIMUM = """
[outbox]
max_pending_count = 10000
max_pending_age_ms = 60000
max_quarantined_count = 0
gates_readiness = true

[scoring_jobs]
max_active_job_count = 5000
max_active_job_age_ms = 600000
max_quarantined_job_count = 0
max_expired_lease_count = 0
gates_readiness = true

[completion_outbox]
grace_ms = 30000          # how long a terminal job may wait for its event
lookback_ms = 86400000    # how far back terminal jobs are checked
max_missing_count = 0
gates_readiness = true

[relay]
enabled = false
"""


def test_design_minimum_is_accepted() -> None:
    policy = parse_policy(MINIMUM)
    assert policy.outbox == OutboxPolicy(
        max_pending_count=10000,
        max_pending_age_ms=60000,
        max_quarantined_count=0,
        gates_readiness=True,
    )
    assert policy.scoring_jobs is not None
    assert policy.scoring_jobs.max_expired_lease_count == 0
    assert policy.relay is None
    assert policy.evaluation == EvaluationSettings()
    assert policy.enabled_families() == (
        Family.OUTBOX,
        Family.SCORING_JOBS,
        Family.COMPLETION_OUTBOX,
    )


def test_documented_example_loads(tmp_path: Path) -> None:
    policy = load_policy(str(EXAMPLE))
    assert policy.relay is not None
    assert policy.relay.max_unowned_lane_count == 0
    assert policy.enabled_families() == tuple(Family)


def test_disabled_family_needs_no_bounds_but_still_rejects_typos() -> None:
    text = MINIMUM.replace(
        "[outbox]\nmax_pending_count = 10000",
        "[outbox]\nenabled = false\nmax_pending_count = 10000",
    )
    assert parse_policy(text).outbox is None
    with pytest.raises(ConfigError, match=r"^policy: \[relay\] max_heartbeat_ag is not a known"):
        parse_policy(MINIMUM.replace("enabled = false", "enabled = false\nmax_heartbeat_ag = 1"))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("max_active_job_age_ms = 600000\n", ""),
            "policy: [scoring_jobs] max_active_job_age_ms is missing",
        ),
        (
            ("max_missing_count = 0", "max_missing_count = 0\nmax_mising = 1"),
            "policy: [completion_outbox] max_mising is not a known setting",
        ),
        (
            ("max_pending_count = 10000", 'max_pending_count = "10000"'),
            "policy: [outbox] max_pending_count must be an integer",
        ),
        (
            ("max_pending_count = 10000", "max_pending_count = 1.5"),
            "policy: [outbox] max_pending_count must be an integer",
        ),
        (
            ("max_pending_count = 10000", "max_pending_count = true"),
            "policy: [outbox] max_pending_count must be an integer",
        ),
        (
            ("max_pending_count = 10000", "max_pending_count = -1"),
            "policy: [outbox] max_pending_count must not be negative",
        ),
        (
            (
                "gates_readiness = true\n\n[scoring_jobs]",
                'gates_readiness = "yes"\n\n[scoring_jobs]',
            ),
            "policy: [outbox] gates_readiness must be true or false",
        ),
        (
            ("gates_readiness = true\n\n[scoring_jobs]", "\n[scoring_jobs]"),
            "policy: [outbox] gates_readiness is missing",
        ),
        (
            ("enabled = false", "enabled = 0"),
            "policy: [relay] enabled must be true or false",
        ),
        (
            ("[relay]\nenabled = false", ""),
            "policy: [relay] is missing; configure every bound or set enabled = false",
        ),
        (
            ("[relay]\nenabled = false", "[relay]\nenabled = false\n[alerts]\nx = 1"),
            "policy: unknown section [alerts]",
        ),
        (
            ("[relay]\nenabled = false", "[relay]"),
            "policy: [relay] max_heartbeat_age_ms is missing",
        ),
        (
            ("grace_ms = 30000", "grace_ms = 86400000"),
            "policy: [completion_outbox] grace_ms must be less than lookback_ms",
        ),
        (
            ("[relay]\nenabled = false", "[relay]\nenabled = false\n[evaluation]\ninterval_ms = 0"),
            "policy: [evaluation] interval_ms must be greater than 0",
        ),
        (
            (
                "[relay]\nenabled = false",
                "[relay]\nenabled = false\n[evaluation]\nmax_evidence_age_ms = 1000",
            ),
            "policy: [evaluation] max_evidence_age_ms must be at least interval_ms + timeout_ms",
        ),
        (
            ("[outbox]", "[outbox"),
            "policy: invalid TOML",
        ),
    ],
)
def test_bad_policy_is_one_line_naming_the_field(edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in MINIMUM
    text = MINIMUM.replace(old, new, 1)
    with pytest.raises(ConfigError) as caught:
        parse_policy(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_file_problems_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"^policy file .*nope\.toml does not exist$"):
        load_policy(str(missing))
    with pytest.raises(ConfigError, match="is a directory"):
        load_policy(str(tmp_path))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe[outbox]")
    with pytest.raises(ConfigError, match="is not UTF-8"):
        load_policy(str(binary))
    good = tmp_path / "policy.toml"
    good.write_text(MINIMUM)
    assert load_policy(str(good)).relay is None
