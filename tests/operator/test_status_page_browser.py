"""The status page as a browser shows it: headless Chromium, JavaScript and network off.

Events are published and a stall is staged (a leased scoring job whose lease expired: a
dead worker), recorded by the sidecar's history, then ended; the page must show every
family, each bound equal to the one /health reports, charts over the history there is
(not the whole window) with a time axis and a value scale, the band with the stall
followed by recovery, and the relay's publish rate; in a narrow window and in a wide one.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from health.history import WINDOW_MS
from tests.operator.browser import Rendered, chromium, render
from tests.operator.stack import PORT_BASE, Stack, fetch, header, health, running
from tests.support.health_rows import insert_job
from tests.support.waiting import wait_until_blocking

SCREENSHOT_ENV = "OUTBOX_RELAY_STATUS_SCREENSHOT"
"""When set, the wide screenshot is also written there (how docs/status.png is made), and
each phase (calm, stalled, recovered) lasts a minute so the chart shows them at a readable
width."""
PHASE_S = 60.0 if os.environ.get(SCREENSHOT_ENV) else 1.0
NARROW, WIDE = 480, 1280
EVENTS = 300
_CHARTS = ("svg.chart", "section.family", "ul.observations", "div.history")


@pytest.fixture
def browser() -> None:
    if chromium() is None:
        message = "chromium is not installed: bash scripts/tools.sh ensure chromium"
        if os.environ.get("OUTBOX_RELAY_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


class _Page(HTMLParser):
    """Per family section (and the publish-rate section, as ``publishing``): its classes,
    observations, and its chart: the plot area, the band, the lines and the axes' ticks."""

    def __init__(self) -> None:
        super().__init__()
        self.families: dict[str, dict[str, Any]] = {}
        self._current: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        classes = attributes.get("class", "").split()
        if tag == "section" and ("family" in classes or "publishing" in classes):
            self._current = {
                "classes": classes,
                "observations": {},
                "band": [],
                "band_x": [],
                "lines": set(),
                "ticks": [],
                "chart": {},
                "plot": {},
            }
            self.families[attributes.get("data-family", "publishing")] = self._current
        elif self._current is None:
            return
        elif tag == "li" and "observation" in classes:
            self._current["observations"][attributes["data-name"]] = attributes
        elif tag == "svg" and "chart" in classes:
            self._current["chart"] = attributes
        elif tag == "rect" and "plot" in classes:
            self._current["plot"] = attributes
        elif tag == "rect" and "band" in classes:
            self._current["band"].append(classes[1])
            self._current["band_x"].append((float(attributes["x"]), float(attributes["width"])))
        elif tag in ("polyline", "circle"):
            self._current["lines"].add(classes[0])
        elif tag == "text" and "tick" in classes:
            self._current["ticks"].append((classes, attributes))
        elif tag == "a" and "runbook" in classes:
            self._current["runbook"] = attributes["href"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._current = None


def _published(port: int) -> float:
    answer = fetch(port, "/metrics")
    if answer is None:
        return 0.0
    for family in text_string_to_metric_families(answer[1].decode()):
        if family.name == "outbox_relay_published_events":
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    return 0.0


def _classification(port: int, family: str) -> str | None:
    document = health(port)
    if document is None:
        return None
    check: str = document["checks"][f"{family}:classification"][0]["classification"]
    return check


async def test_the_status_page_in_chromium_shows_families_bounds_charts_and_the_publish_rate(
    browser: None, stack: Stack, db: asyncpg.Connection, tmp_path: Path
) -> None:
    port = PORT_BASE + 2
    runbook = "https://runbook.example/operations.html"
    with running(stack, port, "--runbook-url", runbook) as process:
        await asyncio.to_thread(
            wait_until_blocking,
            lambda: (health(port) or {}).get("status") == "pass",
            what="/health says pass",
            timeout=90,
        )
        started = time.time()
        await asyncio.sleep(PHASE_S)
        await db.executemany(
            "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4)",
            [("order", f"key-{n % 20}", "placed", json.dumps({"n": n})) for n in range(EVENTS)],
        )
        await asyncio.to_thread(
            wait_until_blocking,
            lambda: _published(port) >= EVENTS,
            what=f"{EVENTS} events published",
            timeout=90,
        )
        # Stage: a worker died holding its lease (expired a minute ago by the database clock).
        expired_at = int(time.time() * 1000) - 60_000
        job = await insert_job(db, "leased", lease_expires_at_unix_ms=expired_at)
        await asyncio.to_thread(
            wait_until_blocking,
            lambda: _classification(port, "scoring_jobs") == "stalled",
            what="scoring_jobs stalled",
            timeout=90,
        )
        await asyncio.sleep(PHASE_S)  # more evaluations of the stall in the history
        await db.execute("DELETE FROM scoring_job_state WHERE scoring_job_ref = $1", job)
        await asyncio.to_thread(
            wait_until_blocking,
            lambda: _classification(port, "scoring_jobs") == "within_bounds",
            what="scoring_jobs within bounds again",
            timeout=90,
        )
        await asyncio.sleep(PHASE_S)
        document = health(port)
        page_policy = await asyncio.to_thread(header, port, "/", "Content-Security-Policy")
        url = f"http://127.0.0.1:{port}/"
        shown = {
            width: await asyncio.to_thread(render, url, width=width, selectors=_CHARTS)
            for width in (NARROW, WIDE)
        }
        lasted_ms = (time.time() - started) * 1000
        assert process.poll() is None, stack.log(port)

    for width, rendered in shown.items():
        # Looked at by people: kept beside the test's other files.
        (tmp_path / f"status-{width}.png").write_bytes(rendered.png)
        assert rendered.png.startswith(b"\x89PNG\r\n\x1a\n")
        _requested_nothing_else(rendered, port)
        _fits(rendered, width)
    if os.environ.get(SCREENSHOT_ENV):
        await asyncio.to_thread(Path(os.environ[SCREENSHOT_ENV]).write_bytes, shown[WIDE].png)
    # The server also tells any browser that the page needs nothing but itself.
    assert page_policy is not None
    assert page_policy.startswith("default-src 'none';")
    assert "script-src" not in page_policy

    page = _Page()
    page.feed(shown[WIDE].dom)
    assert document is not None
    _families_and_bounds(page, document, runbook)
    for name, section in page.families.items():
        _chart_spans_the_history(name, section, lasted_ms)
    band = page.families["scoring_jobs"]["band"]
    assert "stalled" in band
    assert band[-1] == "within_bounds"
    assert band.index("stalled") < len(band) - 1 - band[::-1].index("within_bounds")
    assert "stalled" not in page.families["outbox"]["band"]
    # Backlog on the left scale, the oldest age on the right one, each from 0 past its peak.
    jobs = page.families["scoring_jobs"]
    assert {"backlog", "oldest"} <= jobs["lines"]
    _scale_covers(jobs, "backlog", float(jobs["chart"]["data-backlog-peak"]))
    _scale_covers(jobs, "oldest", float(jobs["chart"]["data-oldest-peak"]))
    assert float(jobs["chart"]["data-backlog-peak"]) >= 1  # the leased job
    assert float(jobs["chart"]["data-oldest-peak"]) > 0
    # The publish rate: events/s from the relay's published counter, on its own scale.
    publishing = page.families["publishing"]
    assert "rate" in publishing["lines"]
    peak = float(publishing["chart"]["data-rate-peak"])
    assert peak > 0
    _scale_covers(publishing, "rate", peak)
    assert int(publishing["chart"]["data-published"]) >= EVENTS


def _requested_nothing_else(rendered: Rendered, port: int) -> None:
    # Nothing but the page itself was asked for (the browser may try its favicon there too).
    assert rendered.requested[0] == f"http://127.0.0.1:{port}/"
    assert all(url.startswith(f"http://127.0.0.1:{port}/") for url in rendered.requested)


def _fits(rendered: Rendered, width: int) -> None:
    """Nothing scrolls sideways; every chart is whole in the window and wide enough to read;
    in a wide window each family's chart stands beside its observations, in a narrow one
    below them."""
    # The viewport is the window less its vertical scroll bar.
    assert width - 20 <= rendered.viewport_width <= width
    assert rendered.content_width <= rendered.viewport_width
    charts = rendered.boxes["svg.chart"]
    assert len(charts) == 5  # four families and the publish rate
    for chart in charts:
        assert chart.left >= 0, (width, chart)
        assert chart.right <= rendered.viewport_width, (width, chart)
        assert chart.width >= 0.75 * min(width, 560), (width, chart)
    observations = rendered.boxes["ul.observations"]
    histories = rendered.boxes["div.history"][-len(observations) :]
    for listed, chart in zip(observations, histories, strict=True):
        if width == WIDE:
            assert chart.left >= listed.right and chart.top < listed.bottom, (listed, chart)
        else:
            assert chart.top >= listed.bottom, (listed, chart)


def _families_and_bounds(page: _Page, document: dict[str, Any], runbook: str) -> None:
    # process:ready is the serving process's own readiness (a system check), not a
    # family; it passes while the process serves.
    assert document["checks"]["process:ready"][0]["status"] == "pass"
    checks = {key: check for key, check in document["checks"].items() if key != "process:ready"}
    families = {key.split(":")[0] for key in checks}
    assert (
        set(page.families) - {"publishing"}
        == families
        == {
            "outbox",
            "scoring_jobs",
            "completion_outbox",
            "relay",
        }
    )
    for family in families:
        shown = page.families[family]
        assert shown["runbook"] == f"{runbook}#family-{family}"
        # Every bound /health reports is on the page with the same value, and no other.
        reported = {
            key.split(":")[1]: check[0]
            for key, check in checks.items()
            if key.startswith(f"{family}:") and "bound" in check[0]
        }
        on_page = {
            name: attributes
            for name, attributes in shown["observations"].items()
            if "data-bound" in attributes
        }
        assert set(on_page) == set(reported), family
        assert reported, family
        for name, attributes in on_page.items():
            assert int(attributes["data-bound"]) == reported[name]["bound"], (family, name)
            assert attributes["data-bound-name"] == reported[name]["boundName"]


def _chart_spans_the_history(name: str, section: dict[str, Any], lasted_ms: float) -> None:
    """The chart runs from the oldest evaluation kept to the latest, not over the whole
    window: its band (a family's) starts at the plot's left edge and ends at its right one,
    and the time axis says how long ago each tick was, down to "now" at the right."""
    chart, plot = section["chart"], section["plot"]
    span = int(chart["data-to-unix-ms"]) - int(chart["data-from-unix-ms"])
    assert 0.5 * lasted_ms <= span <= lasted_ms + 60_000 < WINDOW_MS, (name, span, lasted_ms)
    left, right = float(plot["x"]), float(plot["x"]) + float(plot["width"])
    if name != "publishing":
        (first_x, _), (last_x, last_width) = section["band_x"][0], section["band_x"][-1]
        assert abs(first_x - left) < 0.5, (name, first_x, left)
        assert abs(last_x + last_width - right) < 0.5, (name, last_x + last_width, right)
    ago = [
        int(attributes["data-ago-ms"])
        for classes, attributes in section["ticks"]
        if "time" in classes
    ]
    assert len(ago) >= 2 and ago[-1] == 0, (name, ago)
    assert ago == sorted(ago, reverse=True) and ago[0] <= span, (name, ago, span)


def _scale_covers(section: dict[str, Any], series: str, peak: float) -> None:
    """The series' value scale is labelled from 0 to at least its peak."""
    values = [
        float(attributes["data-value"])
        for classes, attributes in section["ticks"]
        if "value" in classes and series in classes
    ]
    assert len(values) >= 2, (series, values)
    assert min(values) == 0 and max(values) >= peak, (series, values, peak)
