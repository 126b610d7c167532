"""The status page, the table and the history as pure functions of a report."""

from __future__ import annotations

import re

import msgspec
import pytest

from contracts.health import Classification, FamilyResult, HealthReport, ScoringJobsEvidence
from contracts.policy import Family, ScoringJobsPolicy
from health.families.base import Measurement
from health.history import WINDOW_MS, History
from health.render.document import health_document
from health.render.page import status_page
from health.render.table import status_table
from health.render.words import duration, in_words, label
from health.rules import build_report
from tests.support.policies import loose_policy

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
def test_the_table_fits_its_width_and_never_splits_a_measurement_or_a_reason(width: int) -> None:
    reason = "expired_lease_count 1 > max_expired_lease_count 0"
    long_reason = "a reason longer than any terminal: " + "x" * 200
    result = _report(NOW, expired=1, reason=reason).families[0]
    report = build_report([msgspec.structs.replace(result, reasons=(reason, long_reason))], NOW)
    table = status_table(report, POLICY, colour=True, width=width)
    lines = _ANSI_CODE.sub("", table).splitlines()
    # Only a reason that cannot fit is longer than the width.
    too_long = [line for line in lines if len(line) > width]
    assert f"    reason: {long_reason}" in too_long
    assert all(line.startswith("    reason: ") and len(line) > width for line in too_long)
    assert (f"    reason: {reason}" in too_long) is (len(reason) + 12 > width)
    shown = [m for line in lines for m in re.findall(r"\b[a-z_]+=\S+(?: \d+(?:ms)?)?", line)]
    assert shown == [
        "active_count=7/max 50",
        "oldest_active_age=42000ms/max 600000ms",
        "quarantined_count=0/max 0",
        "expired_lease_count=1/max 0",
        "oldest_expired_lease_age=1000ms",
    ]
    # A reason stays whole on its line, as docs/operations.md lists it.
    assert [line.strip() for line in lines if "reason: " in line] == [
        f"reason: {reason}",
        f"reason: {long_reason}",
    ]


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


def _section(page: str, id_: str) -> str:
    match = re.search(rf'<section [^>]*id="{id_}".*?</section>', page, re.S)
    assert match is not None, id_
    return match.group(0)


def _attribute(text: str, element: str, name: str) -> str:
    match = re.search(rf'<{element}[\s>][^>]*\b{name}="([^"]*)"', text)
    assert match is not None, (element, name)
    return match.group(1)


def _ticks(chart: str, kind: str) -> list[tuple[str, str]]:
    """(data value, label) of each tick of one axis: ``time``, ``backlog``, ``oldest``, ``rate``."""
    return re.findall(
        rf'<text class="tick [a-z]* ?{kind}" data-[a-z-]+="([^"]*)"[^>]*>([^<]*)</text>', chart
    )


def test_the_charts_span_the_history_there_is_with_a_time_axis_and_value_scales() -> None:
    # Five minutes after start: the chart spans those five, not the fifteen of the window.
    history = History(interval_ms=5000)
    for n in range(60):
        history.record(_report(NOW - (60 - n) * 5000, expired=1 if 20 <= n < 30 else 0))
    last = _report(NOW, expired=0)
    history.record(last)
    chart = _section(
        status_page(last, live=True, ready=True, history=history), "family-scoring_jobs"
    )
    assert _attribute(chart, "svg", "data-from-unix-ms") == str(NOW - 300_000)
    assert _attribute(chart, "svg", "data-to-unix-ms") == str(NOW)
    left = float(_attribute(chart, 'rect class="plot"', "x"))
    right = left + float(_attribute(chart, 'rect class="plot"', "width"))
    bands = re.findall(r'<rect class="band \w+" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', chart)
    assert float(bands[0][0]) == left
    assert float(bands[-1][0]) + float(bands[-1][1]) == pytest.approx(right, abs=0.1)
    assert _ticks(chart, "time") == [
        ("240000", "&minus;4 min"),
        ("120000", "&minus;2 min"),
        ("0", "now"),
    ]
    # Each line on its own scale from 0 past its peak, both on one grid: backlog 7 on the
    # left, the oldest age of 42 s on the right.
    assert _ticks(chart, "backlog") == [("0", "0"), ("2", "2"), ("4", "4"), ("6", "6"), ("8", "8")]
    assert _ticks(chart, "oldest") == [
        ("0", "0"),
        ("15000", "15 s"),
        ("30000", "30 s"),
        ("45000", "45 s"),
        ("60000", "1 min"),
    ]
    # Past the window, the chart spans the window.
    for n in range(1, 200):
        history.record(_report(NOW + n * 5000, expired=0))
    later = _report(NOW + 200 * 5000, expired=0)
    history.record(later)
    chart = _section(
        status_page(later, live=True, ready=True, history=history), "family-scoring_jobs"
    )
    span = int(_attribute(chart, "svg", "data-to-unix-ms")) - int(
        _attribute(chart, "svg", "data-from-unix-ms")
    )
    assert span == WINDOW_MS
    assert _ticks(chart, "time")[0] == ("900000", "&minus;15 min")


def test_the_publish_rate_is_events_per_second_between_evaluations() -> None:
    history = History(interval_ms=1000, publishing=True)
    # A count that goes down (no relay's counter does) gives no rate rather than a negative one.
    for n, count in enumerate([0, 0, 500, 1500, 1500, 1200, 1300]):
        history.record(build_report([], NOW + n * 1000), published=count)
    assert [rate.per_second for rate in history.rates()] == [0, 500, 1000, 0, 100]
    page = status_page(build_report([], NOW + 6000), live=True, ready=True, history=history)
    publishing = _section(page, "publishing")
    assert _attribute(publishing, "svg", "data-rate-peak") == "1000"
    assert _attribute(publishing, "svg", "data-published") == "1300"
    assert "rate now <strong>100 events/s</strong>" in publishing
    assert "peak <strong>1000 events/s</strong>" in publishing
    assert '<polyline class="rate"' in publishing
    assert _ticks(publishing, "rate") == [("0", "0"), ("500", "500"), ("1000", "1000")]
    assert "every family is disabled in the policy" in page


def test_a_page_says_when_its_process_runs_no_relay_or_has_no_rate_yet() -> None:
    report = _report(NOW, expired=0)
    sidecar_alone = History(interval_ms=1000)
    sidecar_alone.record(report)
    page = status_page(report, live=True, ready=True, history=sidecar_alone)
    assert "this process runs no relay" in _section(page, "publishing")
    with_relay = History(interval_ms=1000, publishing=True)
    with_relay.record(report, published=0)
    publishing = _section(
        status_page(report, live=True, ready=True, history=with_relay), "publishing"
    )
    assert "no rate yet" in publishing
    assert "<svg" not in publishing


def test_the_history_keeps_only_the_window_and_a_bounded_ring() -> None:
    history = History(interval_ms=60_000, publishing=True)
    for n in range(40):
        history.record(_report(NOW + n * 60_000, expired=0), published=n)
    points = history.points(Family.SCORING_JOBS)
    assert len(history.rates()) == WINDOW_MS // 60_000
    assert history.since_unix_ms() == points[0].at_unix_ms
    assert len(points) == WINDOW_MS // 60_000 + 1
    assert points[-1].at_unix_ms - points[0].at_unix_ms <= WINDOW_MS
    assert (points[-1].backlog, points[-1].oldest_ms) == (7, 42_000)
    # A clock that stands still cannot grow it either.
    for _ in range(100):
        history.record(_report(NOW, expired=0), published=40)
    assert len(history.points(Family.SCORING_JOBS)) == WINDOW_MS // 60_000 + 1
    assert len(history.rates()) <= WINDOW_MS // 60_000


def test_a_page_without_families_says_why() -> None:
    assert "no evaluation has completed yet" in status_page(None, live=True, ready=False)
    empty = status_page(build_report([], NOW), live=True, ready=True)
    assert "every family is disabled in the policy" in empty
