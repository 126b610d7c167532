"""Presenting a report: measurements, the IETF health+json document, a table, an HTML page.

The page is one self-contained document: no script, nothing fetched from anywhere (styles
inline, the chart inline SVG drawn here), so it reads the same from any host and in a
browser with JavaScript off. Every value that reaches it is escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import re
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from contracts.health import Classification, FamilyResult, HealthReport
from contracts.policy import Policy
from health.families import REGISTRY
from health.families.base import Measurement
from health.history import WINDOW_MS, History, Point

SERVICE_ID = "outbox-relay"
_JSON = msgspec.json.Encoder()


def measurements(result: FamilyResult) -> list[Measurement]:
    """The values a family's result shows, in a stable order; none without evidence."""
    if result.evidence is None:
        return []
    return REGISTRY[result.family].measure(result.evidence)


def bound_of(policy: Policy | None, result: FamilyResult, m: Measurement) -> int | None:
    """The policy's bound on one measurement, or None when it has none."""
    section = policy.family(result.family) if policy is not None else None
    if section is None or m.bound is None:
        return None
    value: int = getattr(section, m.bound)
    return value


def _iso(unix_ms: int) -> str:
    moment = dt.datetime.fromtimestamp(unix_ms / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def report_status(report: HealthReport | None) -> str:
    """IETF status: fail when a gating family is not within bounds, warn for a non-gating one."""
    if report is None or report.readiness is not Classification.WITHIN_BOUNDS:
        return "fail"
    if report.classification is not Classification.WITHIN_BOUNDS:
        return "warn"
    return "pass"


def _check_status(result: FamilyResult) -> str:
    if result.classification is Classification.WITHIN_BOUNDS:
        return "pass"
    return "fail" if result.gates_readiness else "warn"


def health_document(
    report: HealthReport | None, *, release: str, policy: Policy | None = None
) -> dict[str, Any]:
    """The ``application/health+json`` document (draft-inadarei-api-health-check).

    With ``policy``, a measurement held to a bound carries it as ``bound`` and ``boundName``
    (the policy field), so a reader sees the observation next to its limit.
    """
    document: dict[str, Any] = {
        "status": report_status(report),
        "version": release.split(".", 1)[0],
        "releaseId": release,
        "serviceId": SERVICE_ID,
        "description": "transactional outbox relay and scoring-queue health",
    }
    if report is None:
        document["output"] = "no evaluation has completed yet"
        document["checks"] = {}
        return document
    document["classification"] = report.classification.value
    document["readiness"] = report.readiness.value
    if report.classification is not Classification.WITHIN_BOUNDS:
        document["output"] = "; ".join(
            f"{r.family.value}: {r.classification.value}"
            for r in report.families
            if r.classification is not Classification.WITHIN_BOUNDS
        )
    checks: dict[str, list[dict[str, Any]]] = {}
    for result in report.families:
        family = result.family.value
        observed = result.evidence.observed_at_unix_ms if result.evidence else None
        time = _iso(observed if observed and observed > 0 else report.evaluated_at_unix_ms)
        common = {
            "componentId": family,
            "componentType": "component",
            "status": _check_status(result),
            "time": time,
        }
        checks[f"{family}:classification"] = [
            {
                **common,
                "observedValue": result.classification.value,
                "classification": result.classification.value,
                "reasons": list(result.reasons),
                "gatesReadiness": result.gates_readiness,
                **({"output": "; ".join(result.reasons)} if result.reasons else {}),
            }
        ]
        for m in measurements(result):
            check = {**common, "observedValue": m.value, "observedUnit": m.unit}
            bound = bound_of(policy, result, m)
            if bound is not None:
                check |= {"bound": bound, "boundName": m.bound}
            checks[f"{family}:{m.name}"] = [check]
    document["checks"] = checks
    return document


def encode_json(document: object) -> bytes:
    """Compact JSON bytes."""
    return _JSON.encode(document)


_ANSI = {
    Classification.WITHIN_BOUNDS: "\x1b[32m",
    Classification.STALLED: "\x1b[1;31m",
    Classification.UNKNOWN: "\x1b[33m",
}
_ANSI_RESET = "\x1b[0m"


STATUS_WIDTH = 80
"""The width ``status`` lays its table out to when nobody says otherwise (not a terminal)."""
_MIN_WIDTH = 40
# FAMILY, CLASSIFICATION and GATES, each with the space after it: where measurements start.
_FAMILY, _CLASSIFICATION, _GATES = 18, 14, 5
_MEASUREMENTS_AT = _FAMILY + 1 + _CLASSIFICATION + 1 + _GATES + 1
_BELOW = "    "
"""The indent of measurements laid out below their family's line, when none fits beside it."""
_GAP = 2


def status_table(
    report: HealthReport,
    policy: Policy | None = None,
    *,
    colour: bool = False,
    width: int = STATUS_WIDTH,
) -> str:
    """A plain-text table of every family for ``outbox-relay status``, ``width`` columns wide.

    Each family's measurements stand in as many aligned columns as fit beside it; when one
    would not fit there, every family's go below its line instead. A measurement is never
    split, and reasons wrap between words. With ``policy`` a bounded value shows its bound
    (``expired_lease_count=1/max 0``); with ``colour`` the classification is coloured with
    ANSI codes (for a terminal only).
    """
    width = max(width, _MIN_WIDTH)
    shown = {
        result.family: (
            [_shown_with_bound(policy, result, m) for m in measurements(result)]
            if result.evidence is not None
            else []
        )
        or ["-"]
        for result in report.families
    }
    widest = max((len(cell) for cells in shown.values() for cell in cells), default=0)
    beside = widest <= width - _MEASUREMENTS_AT
    header = f"{'FAMILY':<{_FAMILY}} {'CLASSIFICATION':<{_CLASSIFICATION}} {'GATES'}"
    lines = [f"{header:<{_MEASUREMENTS_AT}}MEASUREMENTS" if beside else header]
    for result in report.families:
        gates = "yes" if result.gates_readiness else "no"
        classification = f"{result.classification.value:<{_CLASSIFICATION}}"
        if colour:
            classification = _ANSI[result.classification] + classification + _ANSI_RESET
        head = f"{result.family.value:<{_FAMILY}} {classification} {gates:<{_GATES}} "
        cells = shown[result.family]
        if beside:
            rows = _columns(cells, width - _MEASUREMENTS_AT)
            lines.append(head + rows[0])
            lines.extend(" " * _MEASUREMENTS_AT + row for row in rows[1:])
            indent = " " * (_FAMILY + 1)
        else:
            lines.append(head.rstrip())
            lines.extend(_BELOW + row for row in _columns(cells, width - len(_BELOW)))
            indent = _BELOW
        for reason in result.reasons:
            lines.extend(
                textwrap.wrap(
                    reason,
                    width,
                    initial_indent=f"{indent}reason: ",
                    subsequent_indent=indent + " " * len("reason: "),
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
    if not report.families:
        lines.append("(every family is disabled in the policy)")
    lines.extend(
        textwrap.wrap(
            f"overall: {report.classification.value}; readiness: {report.readiness.value}; "
            f"evaluated {_iso(report.evaluated_at_unix_ms)}",
            width,
            subsequent_indent="  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    )
    return "\n".join(lines) + "\n"


def _columns(cells: Sequence[str], room: int) -> list[str]:
    """``cells`` in reading order, in as many columns of equal width as fit in ``room``
    (always at least one), as lines without trailing spaces."""
    cell = max(len(text) for text in cells)
    count = max(1, (room + _GAP) // (cell + _GAP))
    return [
        (" " * _GAP).join(text.ljust(cell) for text in cells[at : at + count]).rstrip()
        for at in range(0, len(cells), count)
    ]


def _shown_with_bound(policy: Policy | None, result: FamilyResult, m: Measurement) -> str:
    bound = bound_of(policy, result, m)
    shown = f"{m.name}={_show(m)}"
    if bound is None:
        return shown
    return f"{shown}/max {bound}ms" if m.unit == "ms" else f"{shown}/max {bound}"


def _show(m: Measurement) -> str:
    if m.value is None:
        return "-"
    return f"{m.value}ms" if m.unit == "ms" else str(m.value)


# -- the status page ---------------------------------------------------------------------------
def label(m: Measurement) -> str:
    """A measurement's name in words: ``expired_lease_count`` in leases → "expired leases"."""
    if m.name.endswith("_count"):
        words = m.name.removesuffix("_count").split("_")
        if m.unit.startswith(words[-1]):
            words[-1] = m.unit
        else:
            words.append(m.unit)
        return " ".join(words)
    return m.name.replace("_", " ")


def duration(ms: int) -> str:
    """Milliseconds as people read them: 850 ms, 12.5 s, 4.2 min, 3.1 h."""
    if abs(ms) < 1000:
        return f"{ms} ms"
    if abs(ms) < 120_000:
        return f"{ms / 1000:.1f} s"
    if abs(ms) < 7_200_000:
        return f"{ms / 60_000:.1f} min"
    return f"{ms / 3_600_000:.1f} h"


def _amount(value: int | None, unit: str) -> str:
    if value is None:
        return "none"
    return duration(value) if unit == "ms" else str(value)


_FIELD = re.compile(r"\b[a-z]+(?:_[a-z]+)+\b")


def in_words(reason: str) -> str:
    """A reason as a sentence: field names as words, ``>`` as "exceeds"."""

    def words(match: re.Match[str]) -> str:
        name = match.group(0)
        for suffix in ("_unix_ms", "_ms", "_count"):
            name = name.removesuffix(suffix)
        return name.replace("_", " ")

    return _FIELD.sub(words, reason).replace(" > ", " exceeds ")


def status_page(
    report: HealthReport | None,
    *,
    live: bool,
    ready: bool,
    policy: Policy | None = None,
    history: History | None = None,
    runbook_url: str = "",
) -> str:
    """The status page: per family its classification, observations against their bounds,
    reasons in words, a runbook link and a chart of the history; every value escaped."""
    sections = []
    if report is not None:
        for result in report.families:
            points = history.points(result.family) if history is not None else ()
            sections.append(
                _family_section(result, policy, points, report.evaluated_at_unix_ms, runbook_url)
            )
    overall = report.classification.value if report is not None else "no evaluation yet"
    evaluated = _iso(report.evaluated_at_unix_ms) if report is not None else "&ndash;"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>outbox-relay health</title>
<style>{_STYLE}</style></head><body>
<h1>outbox-relay health</h1>
<p class="summary">overall: <strong class="{html.escape(overall)}">{html.escape(overall)}</strong>
&middot; live: {"yes" if live else "no"} &middot; ready: {"yes" if ready else "no"}
&middot; evaluated: {evaluated}</p>
{"".join(sections) or f"<p>{_EMPTY[report is None]}</p>"}
<p class="links"><a href="/health">/health</a> &middot; <a href="/metrics">/metrics</a> &middot;
<a href="/readyz">/readyz</a> &middot; <a href="/livez">/livez</a></p>
</body></html>
"""


_EMPTY = {True: "no evaluation has completed yet", False: "every family is disabled in the policy"}
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 64em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin: 0 0 .3em; }
section.family { border: 1px solid #ccc; border-left-width: .5em; padding: .5em 1em; margin: .8em 0; }
section.within_bounds { border-left-color: #3a3; } section.stalled { border-left-color: #c33; }
section.unknown { border-left-color: #d9a400; }
.classification { font-weight: normal; padding: 0 .4em; border-radius: .2em; }
.within_bounds .classification, strong.within_bounds { background: #d8f5d8; }
.stalled .classification, strong.stalled { background: #f8d0d0; }
.unknown .classification, strong.unknown { background: #f5ecc8; }
ul { margin: .3em 0; padding-left: 1.2em; } .meta, .legend { color: #555; font-size: .85em; }
.meta, .legend { margin: .2em 0; } .reasons { color: #900; }
.observation.over { color: #b00; }
.body { display: flex; flex-wrap: wrap; gap: .5em 2em; align-items: flex-start; }
.observations { flex: 1 1 20em; } .history { margin-left: auto; } svg { display: block; } .legend .backlog { color: #1f5fbf; }
.legend .oldest { color: #c06000; }
"""


def _family_section(
    result: FamilyResult,
    policy: Policy | None,
    points: Sequence[Point],
    now_unix_ms: int,
    runbook_url: str,
) -> str:
    family = html.escape(result.family.value)
    classification = html.escape(result.classification.value)
    observations = (
        "".join(_observation(result, policy, m) for m in measurements(result))
        if result.evidence is not None
        else "<li>no evidence: the probe did not answer</li>"
    )
    reasons = "".join(f'<li class="reason">{html.escape(in_words(r))}</li>' for r in result.reasons)
    runbook = html.escape(f"{runbook_url}#family-{result.family.value}", quote=True)
    return f"""<section class="family {classification}" id="family-{family}" data-family="{family}">
<h2>{family} <span class="classification">{classification}</span></h2>
<p class="meta">gates readiness: {"yes" if result.gates_readiness else "no"} &middot;
<a class="runbook" href="{runbook}">runbook: {family}</a></p>
{f'<ul class="reasons">{reasons}</ul>' if reasons else ""}
<div class="body"><ul class="observations">{observations}</ul>
<div class="history" style="width: {_WIDTH}px">{_chart(points, now_unix_ms)}</div></div>
</section>
"""


def _observation(result: FamilyResult, policy: Policy | None, m: Measurement) -> str:
    bound = bound_of(policy, result, m)
    over = bound is not None and m.value is not None and m.value > bound
    attributes = (
        f'data-name="{html.escape(m.name)}" data-value="{m.value if m.value is not None else ""}"'
    )
    text = f"{html.escape(label(m))} <strong>{html.escape(_amount(m.value, m.unit))}</strong>"
    if bound is not None:
        attributes += f' data-bound-name="{html.escape(str(m.bound))}" data-bound="{bound}"'
        text += f" / max {html.escape(_amount(bound, m.unit))}"
    return f'<li class="observation{" over" if over else ""}" {attributes}>{text}</li>'


_WIDTH, _PLOT, _BAND = 420, 56, 12
_BAND_COLOURS = {
    Classification.WITHIN_BOUNDS: "#5b5",
    Classification.STALLED: "#d33",
    Classification.UNKNOWN: "#e0b000",
}


def _chart(points: Sequence[Point], now_unix_ms: int) -> str:
    """The last 15 minutes as inline SVG: backlog and oldest age lines over a band coloured
    by classification. Each line is scaled to its own peak, which the legend states."""
    if not points:
        return '<p class="legend">no history yet</p>'
    start = now_unix_ms - WINDOW_MS

    def x(at: int) -> float:
        return round(_WIDTH * max(0, at - start) / WINDOW_MS, 1)

    band = []
    for point, following in zip(points, [*points[1:], None], strict=True):
        left = x(point.at_unix_ms)
        right = x(following.at_unix_ms) if following is not None else _WIDTH
        value = html.escape(point.classification.value)
        band.append(
            f'<rect class="band {value}" x="{left}" y="{_PLOT + 4}" '
            f'width="{max(right - left, 1.0)}" height="{_BAND}" '
            f'fill="{_BAND_COLOURS[point.classification]}"><title>{value}</title></rect>'
        )
    backlog = [(p.at_unix_ms, p.backlog) for p in points]
    oldest = [(p.at_unix_ms, p.oldest_ms) for p in points]
    backlog_peak = max((v for _, v in backlog if v is not None), default=None)
    oldest_peak = max((v for _, v in oldest if v is not None), default=None)
    lines = _polylines("backlog", "#1f5fbf", "", backlog, backlog_peak, x)
    lines += _polylines("oldest", "#c06000", ' stroke-dasharray="4 2"', oldest, oldest_peak, x)
    legend = []
    if backlog_peak is not None:
        legend.append(f'<span class="backlog">&#9472; backlog (peak {backlog_peak})</span>')
    if oldest_peak is not None:
        legend.append(
            f'<span class="oldest">&#9476; oldest age (peak {duration(oldest_peak)})</span>'
        )
    legend.append("band: classification &middot; last 15 min, now at the right")
    height = _PLOT + _BAND + 8
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" '
        f'height="{height}" viewBox="0 0 {_WIDTH} {height}" role="img" '
        f'aria-label="last 15 minutes">'
        f'<rect x="0" y="0" width="{_WIDTH}" height="{height}" fill="#f7f7f7"/>'
        f"{''.join(band)}{lines}</svg>"
        f'<p class="legend">{" &middot; ".join(legend)}</p>'
    )


def _polylines(
    name: str,
    colour: str,
    dash: str,
    series: Sequence[tuple[int, int | None]],
    peak: int | None,
    x: Callable[[int], float],
) -> str:
    """One polyline per unbroken run of values (a missing value breaks the line)."""
    if peak is None:
        return ""
    runs: list[list[str]] = [[]]
    for at, value in series:
        if value is None:
            runs.append([])
            continue
        y = _PLOT - (_PLOT - 2) * value / peak if peak > 0 else _PLOT
        runs[-1].append(f"{x(at)},{round(y, 1)}")
    return "".join(
        f'<polyline class="{name}" fill="none" stroke="{colour}" stroke-width="1.5"{dash} '
        f'points="{" ".join(run)}"/>'
        for run in runs
        if run
    )
