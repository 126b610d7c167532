"""Headless Chromium with JavaScript and the network off, driven over its DevTools pipe.

``--dump-dom`` and ``--screenshot`` read the page by running script in it, so with script
disabled (``--blink-settings=scriptEnabled=false``) they print nothing. The DevTools
protocol reads the DOM and takes the screenshot without the page's script engine, so here
script is switched off for the page (``Emulation.setScriptExecutionDisabled``) before it
loads. The network is cut twice: every host name resolves to nothing except 127.0.0.1,
and every non-loopback request goes to a proxy on a closed local port. Every request the
page makes is recorded (``Network.requestWillBeSent``), so a test can show that the page
asked for nothing but itself.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

CHROMIUM = "chromium"
_UNROUTABLE_PROXY = "127.0.0.1:9"  # discard port: nothing listens, every fetch fails


@dataclass(frozen=True)
class Box:
    """Where an element was laid out, in CSS pixels from the page's top left."""

    left: float
    top: float
    width: float
    height: float

    @property
    def right(self) -> float:
        """The box's right edge."""
        return self.left + self.width

    @property
    def bottom(self) -> float:
        """The box's bottom edge."""
        return self.top + self.height


@dataclass(frozen=True)
class Rendered:
    """What the browser made of one page."""

    dom: str
    png: bytes
    requested: tuple[str, ...]
    """Every URL the page requested, in order."""
    viewport_width: float
    """The width the page was laid out in."""
    content_width: float
    """The width of what the page laid out: wider than the viewport means it scrolls sideways."""
    boxes: dict[str, tuple[Box, ...]]
    """The boxes of the elements each CSS selector asked for matched, in document order."""


def chromium() -> str | None:
    """The Chromium binary on PATH, or None."""
    return shutil.which(CHROMIUM)


class _Pipe:
    """The DevTools protocol over ``--remote-debugging-pipe``: NUL-terminated JSON."""

    def __init__(self, process: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self._process = process
        self._out = to_browser
        self._in = from_browser
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            self.events.append(reply)

    def wait_event(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(method)
            self.events.append(self._read())

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self._process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message


def render(
    url: str, *, width: int = 1000, timeout: float = 120.0, selectors: tuple[str, ...] = ()
) -> Rendered:
    """Load ``url`` with script and network off in a window ``width`` CSS pixels wide; its
    DOM, a full-page PNG, its requests and the boxes of the elements ``selectors`` match."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed (scripts/tools.sh ensure chromium)")
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    # Chromium's helper processes may still be writing the profile as it goes away.
    with tempfile.TemporaryDirectory(
        prefix="status-page-chromium-", ignore_cleanup_errors=True
    ) as profile:
        # Chromium reads commands on fd 3 and answers on fd 4: the shell puts the pipes there.
        redirect = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w}'
        process = subprocess.Popen(
            [
                "bash",
                "-c",
                redirect,
                binary,
                "--headless",
                "--no-sandbox",  # tests may run as root, where the sandbox refuses to start
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--proxy-server={_UNROUTABLE_PROXY}",
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
                "--remote-debugging-pipe",
                f"--window-size={width},800",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(to_browser_r, from_browser_w),
            start_new_session=True,  # its own process group: its helpers end with it
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        pipe = _Pipe(process, to_browser_w, from_browser_r)
        try:
            return _drive(pipe, url, width, timeout, selectors)
        finally:
            _close(process, pipe)
            os.close(to_browser_w)
            os.close(from_browser_r)


def _close(process: subprocess.Popen[bytes], pipe: _Pipe) -> None:
    """Ask the browser to close, then end its process group if it has not."""
    try:
        pipe.call("Browser.close")
        process.wait(timeout=30)
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _drive(
    pipe: _Pipe, url: str, width: int, timeout: float, selectors: tuple[str, ...]
) -> Rendered:
    deadline = time.monotonic() + timeout
    while True:
        targets = pipe.call("Target.getTargets")["targetInfos"]
        pages = [t for t in targets if t["type"] == "page"]
        if pages:
            break
        if time.monotonic() > deadline:
            raise TimeoutError("chromium opened no page")
        time.sleep(0.1)
    session = pipe.call("Target.attachToTarget", targetId=pages[0]["targetId"], flatten=True)[
        "sessionId"
    ]
    pipe.call("Emulation.setScriptExecutionDisabled", session, value=True)
    # The layout width exactly, whatever the window around it takes up.
    pipe.call(
        "Emulation.setDeviceMetricsOverride",
        session,
        width=width,
        height=800,
        deviceScaleFactor=1,
        mobile=False,
    )
    pipe.call("Network.enable", session)
    pipe.call("Page.enable", session)
    pipe.events.clear()
    pipe.call("Page.navigate", session, url=url)
    pipe.wait_event("Page.loadEventFired", max(1.0, deadline - time.monotonic()))
    root = pipe.call("DOM.getDocument", session, depth=-1)["root"]
    dom = pipe.call("DOM.getOuterHTML", session, nodeId=root["nodeId"])["outerHTML"]
    layout = pipe.call("Page.getLayoutMetrics", session)
    metrics = layout["cssContentSize"]
    boxes = {
        selector: tuple(
            _box(pipe, session, node)
            for node in pipe.call(
                "DOM.querySelectorAll", session, nodeId=root["nodeId"], selector=selector
            )["nodeIds"]
        )
        for selector in selectors
    }
    shot = pipe.call(
        "Page.captureScreenshot",
        session,
        format="png",
        captureBeyondViewport=True,
        clip={
            "x": 0,
            "y": 0,
            "width": max(width, metrics["width"]),
            "height": metrics["height"],
            "scale": 1,
        },
    )["data"]
    requested = tuple(
        e["params"]["request"]["url"]
        for e in pipe.events
        if e.get("method") == "Network.requestWillBeSent"
    )
    return Rendered(
        dom=dom,
        png=base64.b64decode(shot),
        requested=requested,
        viewport_width=layout["cssLayoutViewport"]["clientWidth"],
        content_width=metrics["width"],
        boxes=boxes,
    )


def _box(pipe: _Pipe, session: str, node: int) -> Box:
    # The border quad: x, y of its four corners, clockwise from the top left.
    quad = pipe.call("DOM.getBoxModel", session, nodeId=node)["model"]["border"]
    xs, ys = quad[0::2], quad[1::2]
    return Box(min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys))
