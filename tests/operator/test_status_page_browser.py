"""The status page as a browser shows it: headless Chromium, JavaScript and network off.

A stall is staged (a leased scoring job whose lease expired: a dead worker), recorded by
the sidecar's history, then ended; the page must show every family, each bound equal to
the one /health reports, and a chart whose band has the stall followed by recovery.
"""

from __future__ import annotations

import asyncio
import os
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.health.conftest import insert_job
from tests.operator.browser import chromium, render
from tests.operator.support import PORT_BASE, Stack, header, health, running, wait_for

SCREENSHOT_ENV = "OUTBOX_RELAY_STATUS_SCREENSHOT"
"""When set, the screenshot is also written there (how docs/status.png is made), and each
phase (calm, stalled, recovered) lasts a minute so the chart shows them at a readable width."""
PHASE_S = 60.0 if os.environ.get(SCREENSHOT_ENV) else 1.0


@pytest.fixture
def browser() -> None:
    if chromium() is None:
        message = "chromium is not installed: bash scripts/tools.sh ensure chromium"
        if os.environ.get("OUTBOX_RELAY_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


class _Page(HTMLParser):
    """Per family section: its classification, observations and chart band, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.families: dict[str, dict[str, Any]] = {}
        self._current: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        classes = attributes.get("class", "").split()
        if tag == "section" and "family" in classes:
            self._current = {"classes": classes, "observations": {}, "band": []}
            self.families[attributes["data-family"]] = self._current
        elif self._current is None:
            return
        elif tag == "li" and "observation" in classes:
            self._current["observations"][attributes["data-name"]] = attributes
        elif tag == "rect" and "band" in classes:
            self._current["band"].append(classes[1])
        elif tag == "a" and "runbook" in classes:
            self._current["runbook"] = attributes["href"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._current = None


def _classification(port: int, family: str) -> str | None:
    document = health(port)
    if document is None:
        return None
    check: str = document["checks"][f"{family}:classification"][0]["classification"]
    return check


async def test_the_status_page_in_chromium_shows_families_bounds_and_a_staged_stall(
    browser: None, stack: Stack, db: asyncpg.Connection
) -> None:
    port = PORT_BASE + 2
    runbook = "https://runbook.example/operations.html"
    with running(stack, port, "--runbook-url", runbook) as process:
        await asyncio.to_thread(wait_for, lambda: (health(port) or {}).get("status") == "pass")
        await asyncio.sleep(PHASE_S)
        # Stage: a worker died holding its lease (expired a minute ago by the database clock).
        expired_at = int(time.time() * 1000) - 60_000
        job = await insert_job(db, "leased", lease_expires_at_unix_ms=expired_at)
        await asyncio.to_thread(
            wait_for, lambda: _classification(port, "scoring_jobs") == "stalled"
        )
        await asyncio.sleep(PHASE_S)  # more evaluations of the stall in the history
        await db.execute("DELETE FROM scoring_job_state WHERE scoring_job_ref = $1", job)
        await asyncio.to_thread(
            wait_for, lambda: _classification(port, "scoring_jobs") == "within_bounds"
        )
        await asyncio.sleep(PHASE_S)
        document = health(port)
        page_policy = await asyncio.to_thread(header, port, "/", "Content-Security-Policy")
        rendered = await asyncio.to_thread(render, f"http://127.0.0.1:{port}/")
        assert process.poll() is None, stack.log(port)

    # Nothing but the page itself was asked for (the browser may try its favicon there too).
    assert rendered.requested[0] == f"http://127.0.0.1:{port}/"
    assert all(url.startswith(f"http://127.0.0.1:{port}/") for url in rendered.requested)
    # The server also tells any browser that the page needs nothing but itself.
    assert page_policy is not None
    assert page_policy.startswith("default-src 'none';")
    assert "script-src" not in page_policy
    assert rendered.png.startswith(b"\x89PNG\r\n\x1a\n")
    if os.environ.get(SCREENSHOT_ENV):
        await asyncio.to_thread(Path(os.environ[SCREENSHOT_ENV]).write_bytes, rendered.png)

    page = _Page()
    page.feed(rendered.dom)
    assert document is not None
    checks = document["checks"]
    families = {key.split(":")[0] for key in checks}
    assert (
        set(page.families)
        == families
        == {
            "outbox",
            "scoring_jobs",
            "completion_outbox",
            "relay",
        }
    )
    for family, shown in page.families.items():
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
    band = page.families["scoring_jobs"]["band"]
    assert "stalled" in band
    assert band[-1] == "within_bounds"
    assert band.index("stalled") < len(band) - 1 - band[::-1].index("within_bounds")
    assert "stalled" not in page.families["outbox"]["band"]
