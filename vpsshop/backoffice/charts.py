"""Bar charts drawn on the server as SVG: no script, no build step, nothing inline but attributes
(the pages' Content-Security-Policy allows no inline style or script).

Each bar carries its exact value (``data-value``, in the series' unit: micros for money, a count
otherwise) and a ``<title>`` a pointer or a screen reader shows; the pages put the same figures in a
table beside the chart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from html import escape

from markupsafe import Markup

WIDTH = 640
HEIGHT = 200
TOP = 14
BOTTOM = 34
LEFT = 8
BAR_HEIGHT = HEIGHT - TOP - BOTTOM


def bar_chart(chart_id: str, title: str, bars: Sequence[tuple[str, int]], show: Callable[[int], str] = str) -> Markup:
    """One bar per ``(label, value)``, heights in proportion to the largest value (values are never negative).

    :param show: how a value reads in the bar's title and the axis note (e.g. micros as USD).
    """
    top = max((value for _, value in bars), default=0)
    slot = (WIDTH - 2 * LEFT) / max(len(bars), 1)
    width = max(slot * 0.7, 1.0)
    parts = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-labelledby="{escape(chart_id)}-title" data-max="{top}">',
        f'<title id="{escape(chart_id)}-title">{escape(title)}</title>',
        f'<line x1="{LEFT}" y1="{TOP + BAR_HEIGHT}" x2="{WIDTH - LEFT}" y2="{TOP + BAR_HEIGHT}" stroke="#6b7785"/>',
        f'<text x="{LEFT}" y="{TOP - 3}" font-size="11" fill="#3d4752">largest: {escape(show(top))}</text>',
    ]
    every = max(1, len(bars) // 7)  # labels under at most about 7 bars, so they never overlap
    for n, (label, value) in enumerate(bars):
        height = BAR_HEIGHT * value / top if top else 0.0
        x = LEFT + n * slot + (slot - width) / 2
        y = TOP + BAR_HEIGHT - height
        parts.append(
            f'<rect class="bar" x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" height="{height:.2f}" '
            f'fill="#1f5fa8" data-label="{escape(label)}" data-value="{value}">'
            f"<title>{escape(label)}: {escape(show(value))}</title></rect>"
        )
        if n % every == 0:
            parts.append(
                f'<text x="{x + width / 2:.2f}" y="{HEIGHT - BOTTOM + 16}" font-size="11" text-anchor="middle" '
                f'fill="#3d4752">{escape(label[-5:] if len(label) == 10 else label[:12])}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))
