"""Hand-written SVG charts: no script, no network, crisp in print. Every chart is a ``<figure>`` holding one
``<svg>`` with labelled axes and units, a legend, and ``<title>`` tooltips on its marks.

Colours are Okabe & Ito's colour-blind-safe palette. Long series are averaged into at most ``MAX_MARKS``
buckets, so a 100k-step run draws as fast as a 100-step one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

OKABE_ITO = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#999999"]
MAX_MARKS = 400
MAX_MARKERS = 150  # step boundaries drawn on a time axis, at most
WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 44


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def nice_ticks(hi: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values from 0 to at least ``hi``; whole numbers only when ``integer`` (a step axis has
    no step 6.5)."""
    if hi <= 0 or not math.isfinite(hi):
        return [0.0, 1.0]
    raw = max(hi / count, 1.0) if integer else hi / count
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    n = math.ceil(hi / step - 1e-9)
    return [i * step for i in range(n + 1)]


def bucket(values: Sequence[float], limit: int = MAX_MARKS) -> tuple[list[float], int]:
    """Means of consecutive buckets (at most ``limit`` of them), and the bucket size."""
    n = len(values)
    if n <= limit:
        return list(values), 1
    size = math.ceil(n / limit)
    return [sum(values[i : i + size]) / len(values[i : i + size]) for i in range(0, n, size)], size


def _frame(
    name: str, title: str, body: str, x_label: str, y_label: str, legend: list[tuple[str, str]]
) -> str:
    keys = "".join(
        f'<span class="key"><i style="background:{c}"></i>{escape(label)}</span>' for label, c in legend
    )
    return (
        f'<figure class="plot" data-plot="{escape(name)}">'
        f"<figcaption>{escape(title)}</figcaption>"
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}" '
        f"><title>{escape(title)}</title>{body}"
        f'<text class="axis-label" x="{LEFT + (WIDTH - LEFT - RIGHT) / 2}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text class="axis-label" transform="translate(14 {TOP + (HEIGHT - TOP - BOTTOM) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text></svg>'
        + (f'<div class="legend">{keys}</div>' if legend else "")
        + "</figure>"
    )


def _y_axis(hi: float, unit_fmt: str = "") -> tuple[str, float]:
    ticks = nice_ticks(hi)
    top = ticks[-1] or 1.0
    plot_h = HEIGHT - TOP - BOTTOM
    parts = []
    for t in ticks:
        y = TOP + plot_h * (1 - t / top)
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}{unit_fmt}</text>'
        )
    return "".join(parts), top


def _x_ticks(lo: float, hi: float, integer: bool = False) -> str:
    span = hi - lo or 1.0
    ticks = nice_ticks(span, integer=integer)
    plot_w = WIDTH - LEFT - RIGHT
    out = []
    for t in ticks:
        if t > span * 1.0001:
            break
        x = LEFT + plot_w * t / span
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{_fmt(lo + t)}</text>'
        )
    return "".join(out)


def stacked_bars(
    name: str,
    title: str,
    series: Mapping[str, Sequence[float]],
    x_label: str,
    y_label: str,
    first_x: float = 0,
) -> str:
    """One bar per step (or per bucket of steps), stacked by category."""
    names = [k for k, v in series.items() if any(v)]
    if not names:
        return ""
    columns = {k: bucket(series[k])[0] for k in names}
    size = bucket(series[names[0]])[1]
    n = len(columns[names[0]])
    totals = [sum(columns[k][i] for k in names) for i in range(n)]
    axis, top = _y_axis(max(totals))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = plot_w / n
    parts = [axis]
    for i in range(n):
        y = float(TOP + plot_h)
        label = (
            f"steps {first_x + i * size:g}–{first_x + (i + 1) * size - 1:g}"
            if size > 1
            else f"step {first_x + i:g}"
        )
        for j, k in enumerate(names):
            h = plot_h * columns[k][i] / top
            y -= h
            parts.append(
                f'<rect x="{LEFT + i * bar_w:.2f}" y="{y:.2f}" width="{max(bar_w - (1 if n < 150 else 0), 0.5):.2f}" '
                f'height="{h:.2f}" fill="{OKABE_ITO[j % 8]}"><title>{escape(label)}: {escape(k)} '
                f"{_fmt(columns[k][i])}</title></rect>"
            )
    parts.append(_x_ticks(first_x, first_x + n * size, integer=True))
    legend = [(k, OKABE_ITO[j % 8]) for j, k in enumerate(names)]
    return _frame(name, title, "".join(parts), x_label, y_label, legend)


def lines(
    name: str,
    title: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    x_label: str,
    y_label: str,
    markers: Sequence[float] = (),
    y_max: float | None = None,
    marker_label: str = "step boundary",
    integer_x: bool = False,
) -> str:
    """Lines over a shared x axis; ``markers`` draws thin vertical lines (step boundaries)."""
    drawn = {k: (list(xs), list(ys)) for k, (xs, ys) in series.items() if len(xs) and len(xs) == len(ys)}
    if not drawn:
        return ""
    lo = min(min(xs) for xs, _ in drawn.values())
    hi = max(max(xs) for xs, _ in drawn.values())
    span = hi - lo or 1.0
    axis, top = _y_axis(y_max if y_max is not None else max(max(ys) for _, ys in drawn.values()))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = [axis]
    shown = [m for m in markers if lo <= m <= hi]
    if len(shown) > MAX_MARKERS:
        shown = []  # denser than the eye can tell apart: they would only grey the plot
    for m in shown:
        x = LEFT + plot_w * (m - lo) / span
        parts.append(f'<line class="marker" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}"/>')
    legend = []
    for j, (k, (xs, ys)) in enumerate(drawn.items()):
        xb, _ = bucket(xs)
        yb, _ = bucket(ys)
        points = " ".join(
            f"{LEFT + plot_w * (x - lo) / span:.1f},{TOP + plot_h * (1 - min(y, top) / top):.1f}"
            for x, y in zip(xb, yb, strict=True)
        )
        color = OKABE_ITO[j % 8]
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{points}">'
            f"<title>{escape(k)}: mean {_fmt(sum(ys) / len(ys))}</title></polyline>"
        )
        legend.append((k, color))
    if shown:
        legend.append((marker_label, "#bbb"))
    parts.append(_x_ticks(lo, hi, integer=integer_x))
    return _frame(name, title, "".join(parts), x_label, y_label, legend)


def hbars(
    name: str,
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    x_label: str,
    errors: Sequence[float | None] | None = None,
    colors: Sequence[str] | None = None,
    reference: float | None = None,
    reference_label: str = "",
) -> str:
    """Horizontal bars with optional ± error whiskers and a dashed reference line (a baseline)."""
    if not values:
        return ""
    n = len(values)
    row = 22
    height = TOP + BOTTOM + row * n
    left = 150
    plot_w = WIDTH - left - RIGHT - 40
    hi = max(
        [*values, reference or 0.0]
        + [v + (e or 0) for v, e in zip(values, errors or [None] * n, strict=True)]
    )
    ticks = nice_ticks(hi)
    top = ticks[-1] or 1.0
    parts = []
    for t in ticks:
        x = left + plot_w * t / top
        parts.append(
            f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + row * n}"/>'
            f'<text class="tick" x="{x:.1f}" y="{TOP + row * n + 16}" text-anchor="middle">{_fmt(t)}</text>'
        )
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = TOP + i * row
        color = colors[i] if colors else OKABE_ITO[0]
        w = plot_w * v / top
        parts.append(
            f'<text class="tick" x="{left - 8}" y="{y + row * 0.65:.1f}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{w:.1f}" height="{row - 6}" fill="{color}">'
            f"<title>{escape(label)}: {_fmt(v)}</title></rect>"
            f'<text class="value" x="{left + w + 4:.1f}" y="{y + row * 0.65:.1f}">{_fmt(v)}</text>'
        )
        e = errors[i] if errors else None
        if e:
            x0, x1 = left + plot_w * (v - e) / top, left + plot_w * (v + e) / top
            ym = y + row / 2
            parts.append(
                f'<path class="whisker" d="M{x0:.1f} {ym:.1f}H{x1:.1f}M{x0:.1f} {ym - 5:.1f}V{ym + 5:.1f}'
                f'M{x1:.1f} {ym - 5:.1f}V{ym + 5:.1f}"/>'
            )
    if reference is not None:
        x = left + plot_w * reference / top
        parts.append(
            f'<line class="reference" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 4}" y2="{TOP + row * n}"/>'
        )
    body = "".join(parts)
    legend = [(reference_label, "#333")] if reference is not None and reference_label else []
    keys = "".join(
        f'<span class="key"><i style="background:{c}"></i>{escape(lab)}</span>' for lab, c in legend
    )
    return (
        f'<figure class="plot" data-plot="{escape(name)}"><figcaption>{escape(title)}</figcaption>'
        f'<svg viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{escape(title)}" '
        f"><title>{escape(title)}</title>{body}"
        f'<text class="axis-label" x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle">{escape(x_label)}</text>'
        f"</svg>" + (f'<div class="legend">{keys}</div>' if keys else "") + "</figure>"
    )
