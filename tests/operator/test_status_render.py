"""The status page, the table and the history as pure functions of a report."""

from __future__ import annotations

import re

import pytest

from contracts.health import Classification, FamilyResult, HealthReport, ScoringJobsEvidence
from contracts.policy import Family, ScoringJobsPolicy
from health.families.base import Measurement
from health.history import WINDOW_MS, History
from health.render import duration, health_document, in_words, label, status_page, status_table
from health.rules import build_report
from tests.health.conftest import loose_policy

NOW = 1_800_000_000_000
POLICY = loose_policy(
    scoring_jobs=ScoringJobsPolicy(
        max_active_job_count=50,
        max_active_job_age_ms=600_000,
        max_quarantined_job_count=0,
        max_expired_lease_count=0,
        gates_readiness=True,
    )
)


def _report(at: int, *, expired: int, reason: str = "x") -> HealthReport:
    evidence = ScoringJobsEvidence(
        observed_at_unix_ms=at,
        active_count=7,
        oldest_active_created_at_unix_ms=at - 42_000,
        quarantined_count=0,
        expired_lease_count=expired,
        oldest_expired_lease_expires_at_unix_ms=at - 1000 if expired else None,
    )
    stalled = expired > 0
    result = FamilyResult(
        family=Family.SCORING_JOBS,
        classification=Classification.STALLED if stalled else Classification.WITHIN_BOUNDS,
        reasons=(reason,) if stalled else (),
        gates_readiness=True,
        evidence=evidence,
    )
    return build_report([result], at)


@pytest.mark.parametrize(
    ("name", "unit", "words"),
    [
        ("expired_lease_count", "leases", "expired leases"),
        ("pending_count", "events", "pending events"),
        ("instance_count", "instances", "instances"),
        ("live_instance_count", "instances", "live instances"),
        ("oldest_active_age", "ms", "oldest active age"),
    ],
)
def test_a_measurement_is_named_in_words(name: str, unit: str, words: str) -> None:
    assert label(Measurement(name, 1, unit)) == words


@pytest.mark.parametrize(
    ("ms", "text"),
    [(850, "850 ms"), (12_500, "12.5 s"), (252_000, "4.2 min"), (11_160_000, "3.1 h")],
)
def test_durations_read_as_people_say_them(ms: int, text: str) -> None:
    assert duration(ms) == text


def test_a_reason_reads_as_a_sentence() -> None:
    reason = "expired_lease_count 1 > max_expired_lease_count 0"
    assert in_words(reason) == "expired lease 1 exceeds max expired lease 0"


def test_health_and_the_table_show_each_bound_next_to_its_observation() -> None:
    report = _report(NOW, expired=1)
    checks = health_document(report, release="1.0.0", policy=POLICY)["checks"]
    assert checks["scoring_jobs:expired_lease_count"][0]["bound"] == 0
    assert checks["scoring_jobs:expired_lease_count"][0]["boundName"] == "max_expired_lease_count"
    assert checks["scoring_jobs:oldest_active_age"][0]["bound"] == 600_000
    assert "bound" not in checks["scoring_jobs:oldest_expired_lease_age"][0]
    table = status_table(report, POLICY)
    assert "expired_lease_count=1/max 0" in table
    assert "\x1b[" not in table
    assert "\x1b[1;31mstalled" in status_table(report, POLICY, colour=True)


_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("width", [48, 64, 80, 110, 200])
def test_the_table_fits_its_width_and_never_splits_a_measurement_or_a_word(width: int) -> None:
    reason = "expired_lease_count 1 > max_expired_lease_count 0 " * 4
    table = status_table(
        _report(NOW, expired=1, reason=reason.strip()), POLICY, colour=True, width=width
    )
    lines = _ANSI_CODE.sub("", table).splitlines()
    assert max(len(line) for line in lines) <= width, table
    shown = [m for line in lines for m in re.findall(r"\b[a-z_]+=\S+(?: \d+(?:ms)?)?", line)]
    assert shown == [
        "active_count=7/max 50",
        "oldest_active_age=42000ms/max 600000ms",
        "quarantined_count=0/max 0",
        "expired_lease_count=1/max 0",
        "oldest_expired_lease_age=1000ms",
    ]
    # The reason wraps between words: put back together it reads as it was.
    first = next(n for n, line in enumerate(lines) if "reason: " in line)
    overall = next(n for n, line in enumerate(lines) if line.startswith("overall: "))
    wrapped = " ".join(line.strip() for line in lines[first:overall])
    assert wrapped.removeprefix("reason: ").split() == reason.split()


def test_the_table_puts_measurements_in_columns_beside_their_family_when_they_fit() -> None:
    wide = status_table(_report(NOW, expired=0), POLICY, width=200).splitlines()
    assert wide[1].startswith("scoring_jobs       within_bounds  yes   active_count=7/max 50 ")
    assert wide[1].count("=") == 4  # four columns fit in 160, the fifth starts a line
    assert wide[2].strip() == "oldest_expired_lease_age=-"
    assert wide[2].index("oldest") == wide[1].index("active")
    narrow = status_table(_report(NOW, expired=0), POLICY, width=60).splitlines()
    assert narrow[1] == "scoring_jobs       within_bounds  yes"
    assert narrow[0] == "FAMILY             CLASSIFICATION GATES"
    overall = next(n for n, line in enumerate(narrow) if line.startswith("overall: "))
    # No two columns of the longest fit in 56: a measurement per line.
    assert [line.strip() for line in narrow[2:overall]] == [
        "active_count=7/max 50",
        "oldest_active_age=42000ms/max 600000ms",
        "quarantined_count=0/max 0",
        "expired_lease_count=0/max 0",
        "oldest_expired_lease_age=-",
    ]
    assert all(line.startswith("    ") for line in narrow[2:overall])


def test_the_page_shows_bounds_in_words_and_escapes_everything() -> None:
    hostile = '<script>alert(1)</script>"'
    page = status_page(
        _report(NOW, expired=1, reason=hostile),
        live=True,
        ready=False,
        policy=POLICY,
        history=None,
        runbook_url='https://runbook.example/ops"><script>x</script>',
    )
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;" in page
    assert (
        'href="https://runbook.example/ops&quot;&gt;&lt;script&gt;x&lt;/script&gt;#family-scoring_jobs"'
        in page
    )
    assert re.search(r"expired leases <strong>1</strong> / max 0", page)
    assert re.search(r"oldest active age <strong>42.0 s</strong> / max 10.0 min", page)
    # Nothing is fetched from anywhere: no script, stylesheet, image or font from outside.
    assert not re.search(r"<(script|link|img|iframe)\b|@import|url\(", page)


def test_the_chart_bands_a_stall_and_draws_backlog_and_oldest_age() -> None:
    history = History(interval_ms=5000)
    for n in range(10):
        history.record(_report(NOW - (10 - n) * 5000, expired=1 if 3 <= n <= 5 else 0))
    last = _report(NOW, expired=0)
    history.record(last)
    page = status_page(last, live=True, ready=True, policy=POLICY, history=history)
    bands = re.findall(r'<rect class="band (\w+)"', page)
    assert bands == ["within_bounds"] * 3 + ["stalled"] * 3 + ["within_bounds"] * 5
    assert '<polyline class="backlog"' in page
    assert '<polyline class="oldest"' in page
    assert "backlog (peak 7)" in page


def test_the_history_keeps_only_the_window_and_a_bounded_ring() -> None:
    history = History(interval_ms=60_000)
    for n in range(40):
        history.record(_report(NOW + n * 60_000, expired=0))
    points = history.points(Family.SCORING_JOBS)
    assert len(points) == WINDOW_MS // 60_000 + 1
    assert points[-1].at_unix_ms - points[0].at_unix_ms <= WINDOW_MS
    assert (points[-1].backlog, points[-1].oldest_ms) == (7, 42_000)
    # A clock that stands still cannot grow it either.
    for _ in range(100):
        history.record(_report(NOW, expired=0))
    assert len(history.points(Family.SCORING_JOBS)) == WINDOW_MS // 60_000 + 1


def test_a_page_without_families_says_why() -> None:
    assert "no evaluation has completed yet" in status_page(None, live=True, ready=False)
    empty = status_page(build_report([], NOW), live=True, ready=True)
    assert "every family is disabled in the policy" in empty
