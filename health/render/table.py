"""The plain-text table ``outbox-relay status`` prints."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from contracts.health import Classification, FamilyResult, HealthReport
from contracts.policy import Policy
from health.families import bound_of, measurements
from health.families.base import Measurement
from health.render.words import iso_time

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
    split, nor a reason (one longer than the width is the only line that is). With
    ``policy`` a bounded value shows its bound
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
            # Whole, never wrapped: docs/operations.md is searched by the reason as printed.
            line = f"{indent}reason: {reason}"
            lines.append(line if len(line) <= width else f"{_BELOW}reason: {reason}")
    if not report.families:
        lines.append("(every family is disabled in the policy)")
    lines.extend(
        textwrap.wrap(
            f"overall: {report.classification.value}; readiness: {report.readiness.value}; "
            f"evaluated {iso_time(report.evaluated_at_unix_ms)}",
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
