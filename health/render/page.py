"""The status page: one self-contained HTML document.

No script, nothing fetched from anywhere (styles inline, the charts inline SVG from
health/render/chart.py), so it reads the same from any host and in a browser with
JavaScript off. Every value that reaches it is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from contracts.health import FamilyResult, HealthReport
from contracts.policy import Policy
from health.families import bound_of, measurements
from health.families.base import Measurement
from health.history import History, Point
from health.render.chart import BACKLOG, OLDEST, RATE, Span, family_chart, rate_chart, span_of
from health.render.words import amount, in_words, iso_time, label


def status_page(
    report: HealthReport | None,
    *,
    live: bool,
    ready: bool,
    policy: Policy | None = None,
    history: History | None = None,
    runbook_url: str = "",
) -> str:
    """The status page: the relay's publish rate, then per family its classification,
    observations against their bounds, reasons in words, a runbook link and a chart of the
    history; every value escaped."""
    span = span_of(history, report.evaluated_at_unix_ms if report is not None else None)
    publishing = _publishing_section(history, span) if history is not None else ""
    families = [
        _family_section(
            result,
            policy,
            history.points(result.family) if history is not None else (),
            span,
            runbook_url,
        )
        for result in (report.families if report is not None else ())
    ]
    overall = report.classification.value if report is not None else "no evaluation yet"
    evaluated = iso_time(report.evaluated_at_unix_ms) if report is not None else "&ndash;"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>outbox-relay health</title>
<style>{_STYLE}</style></head><body>
<h1>outbox-relay health</h1>
<p class="summary">overall: <strong class="{html.escape(overall)}">{html.escape(overall)}</strong>
&middot; live: {"yes" if live else "no"} &middot; ready: {"yes" if ready else "no"}
&middot; evaluated: {evaluated}</p>
{publishing}{"".join(families) or f"<p>{_EMPTY[report is None]}</p>"}
<p class="links"><a href="/health">/health</a> &middot; <a href="/metrics">/metrics</a> &middot;
<a href="/readyz">/readyz</a> &middot; <a href="/livez">/livez</a></p>
</body></html>
"""


_EMPTY = {True: "no evaluation has completed yet", False: "every family is disabled in the policy"}
_STYLE = f"""
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 80em; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.1em; margin: 0 0 .3em; }}
section {{ border: 1px solid #ccc; border-left-width: .5em; padding: .5em 1em; margin: .8em 0; }}
section.within_bounds {{ border-left-color: #3a3; }} section.stalled {{ border-left-color: #c33; }}
section.unknown {{ border-left-color: #d9a400; }} section.publishing {{ border-left-color: {RATE}; }}
.classification {{ font-weight: normal; padding: 0 .4em; border-radius: .2em; }}
.within_bounds .classification, strong.within_bounds {{ background: #d8f5d8; }}
.stalled .classification, strong.stalled {{ background: #f8d0d0; }}
.unknown .classification, strong.unknown {{ background: #f5ecc8; }}
ul {{ margin: .3em 0; padding-left: 1.2em; }} .meta, .legend {{ color: #555; font-size: .85em; }}
.meta, .legend {{ margin: .2em 0; }} .reasons {{ color: #900; }}
.observation.over {{ color: #b00; }}
.body {{ display: flex; flex-wrap: wrap; gap: .5em 2em; align-items: flex-start; }}
.observations {{ flex: 1 1 18em; min-width: 0; }}
.history {{ flex: 1 1 24em; min-width: 0; max-width: 30em; }}
svg.chart {{ display: block; width: 100%; height: auto; }}
@media (max-width: 40em) {{
  body {{ margin: .8em; }} section {{ padding: .5em .6em; }}
}}
.legend .backlog {{ color: {BACKLOG}; }} .legend .oldest {{ color: {OLDEST}; }}
.legend .rate {{ color: {RATE}; }}
"""


def _family_section(
    result: FamilyResult,
    policy: Policy | None,
    points: Sequence[Point],
    span: Span,
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
<div class="history">{family_chart(points, span)}</div></div>
</section>
"""


def _observation(result: FamilyResult, policy: Policy | None, m: Measurement) -> str:
    bound = bound_of(policy, result, m)
    over = bound is not None and m.value is not None and m.value > bound
    attributes = (
        f'data-name="{html.escape(m.name)}" data-value="{m.value if m.value is not None else ""}"'
    )
    text = f"{html.escape(label(m))} <strong>{html.escape(amount(m.value, m.unit))}</strong>"
    if bound is not None:
        attributes += f' data-bound-name="{html.escape(str(m.bound))}" data-bound="{bound}"'
        text += f" / max {html.escape(amount(bound, m.unit))}"
    return f'<li class="observation{" over" if over else ""}" {attributes}>{text}</li>'


def _publishing_section(history: History, span: Span) -> str:
    """The relay's publish rate: events per second between evaluations, from its
    published-events counter; only a process that runs the relay has one."""
    if not history.publishing:
        return """<section class="publishing" id="publishing"><h2>publishing</h2>
<p class="meta">this process runs no relay: each relay shows its publish rate on its own
status page, and counts it in <code>outbox_relay_published_events_total</code> on its /metrics</p>
</section>
"""
    rates = history.rates()
    now = f"{_per_second(rates[-1].per_second)} events/s" if rates else "none yet"
    peak = max((rate.per_second for rate in rates), default=None)
    return f"""<section class="publishing" id="publishing"><h2>publishing</h2>
<p class="meta">events the relay in this process published per second, between evaluations
(<code>outbox_relay_published_events_total</code>)</p>
<div class="body"><ul class="observations">
<li>rate now <strong>{now}</strong></li>
<li>peak <strong>{_per_second(peak) + " events/s" if peak is not None else "none yet"}</strong></li>
<li>published since this process started <strong>{history.published()}</strong></li></ul>
<div class="history">{rate_chart(history, span)}</div></div>
</section>
"""


def _per_second(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"
