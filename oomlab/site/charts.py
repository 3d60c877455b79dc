"""Pictures drawn from the committed measurements at build time, as inline SVG.

Inline SVG needs no file, no script and no font from anywhere: the site stays
offline, and a picture can never disagree with the report it is drawn from,
because both are the same numbers read at the same build.

:func:`peaks_chart` draws one exercise's runs from ``verify.json`` against its
budget: for each run, its peak reserved memory (the allocator's cache, light)
behind its peak allocated memory (live tensors, dark), and whether it ran out of
memory. Bug, fix, wrong fixes and accepted alternatives side by side show what
the fix changed: allocated memory for a reference kept alive or a peak,
reserved memory for fragmentation.
"""

from __future__ import annotations

from html import escape

from oomlab.site.palette import AMBER, BROWN, GREY, INDIGO, INDIGO_LIGHT, PURPLE, RED, TEAL
from oomlab.units import format_bytes

__all__ = ["peaks_chart", "stacked_bars", "uptime_chart"]

WIDTH = 400  # viewBox units: drawn at up to 1.4 times this on a wide screen, at about 0.85 on a phone
LABEL_H, BAR_H, GAP = 30, 14, 10  # two lines of text above each bar
ALLOCATED, RESERVED = INDIGO, INDIGO_LIGHT


def peaks_chart(runs: list[tuple[str, dict]], budget_bytes: int) -> str:
    """An SVG of each ``(label, run)``'s peak allocated and reserved bytes, on one scale with the budget line.

    Runs without both peaks are left out; with none left, the result is empty.
    """
    rows = [(label, r) for label, r in runs if r.get("peak_allocated") is not None and r.get("peak_reserved") is not None]
    if not rows:
        return ""
    top = max([budget_bytes, *(r["peak_reserved"] for _, r in rows)]) * 1.04
    scale = (WIDTH - 2) / top
    row_h = LABEL_H + BAR_H + GAP
    height = 22 + row_h * len(rows)
    x_budget = 1 + budget_bytes * scale
    parts = [
        f'<svg class="oomlab-chart" viewBox="0 0 {WIDTH} {height}" width="100%" style="max-width: {1.4 * WIDTH:.0f}px" role="img" '
        f'aria-label="{escape(_summary(rows, budget_bytes))}" xmlns="http://www.w3.org/2000/svg" '
        'font-family="sans-serif" font-size="11">',
        f'<line x1="{x_budget:.1f}" y1="14" x2="{x_budget:.1f}" y2="{height}" stroke="{RED}" stroke-dasharray="4 3"/>',
        f'<text x="{min(x_budget, WIDTH - 4):.1f}" y="11" text-anchor="end" fill="{RED}">'
        f"budget {escape(format_bytes(budget_bytes))}</text>",
    ]
    for i, (label, r) in enumerate(rows):
        y = 22 + i * row_h
        allocated, reserved = r["peak_allocated"], r["peak_reserved"]
        ran_out = " · out of memory" if r.get("oom") else ""
        parts += [
            f'<text x="1" y="{y + 11}" fill="currentColor" font-weight="bold">{escape(label)}</text>',
            f'<text x="1" y="{y + 25}" fill="currentColor">{escape(format_bytes(allocated))} allocated, '
            f"{escape(format_bytes(reserved))} reserved"
            + (f'<tspan fill="{RED}" font-weight="bold">{escape(ran_out)}</tspan>' if ran_out else "")
            + "</text>",
            f'<rect x="1" y="{y + LABEL_H}" width="{reserved * scale:.1f}" height="{BAR_H}" fill="{RESERVED}">'
            f"<title>{escape(label)}: peak reserved {escape(format_bytes(reserved))}</title></rect>",
            f'<rect x="1" y="{y + LABEL_H + 3}" width="{allocated * scale:.1f}" height="{BAR_H - 6}" fill="{ALLOCATED}">'
            f"<title>{escape(label)}: peak allocated {escape(format_bytes(allocated))}</title></rect>",
        ]
    return "\n".join([*parts, "</svg>"])


def _summary(rows: list[tuple[str, dict]], budget_bytes: int) -> str:
    """What the picture shows, in words, for a screen reader."""
    each = "; ".join(
        f"{label}: {format_bytes(r['peak_allocated'])} allocated, {format_bytes(r['peak_reserved'])} reserved"
        + (", ran out of memory" if r.get("oom") else "")
        for label, r in rows
    )
    return f"Peak memory of each run against the budget of {format_bytes(budget_bytes)}. {each}."


def _svg_open(height: float, summary: str) -> str:
    return (
        f'<svg class="oomlab-chart" viewBox="0 0 {WIDTH} {height:.0f}" width="100%" style="max-width: {1.4 * WIDTH:.0f}px" '
        f'role="img" aria-label="{escape(summary)}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" font-size="11">'
    )


def _legend(entries: list[tuple[str, str]], y: float) -> tuple[list[str], float]:
    """Colour swatches with their names, two to a line; the SVG and the height used."""
    parts, col_w = [], WIDTH / 2
    for i, (name, color) in enumerate(entries):
        x, row_y = (i % 2) * col_w + 1, y + (i // 2) * 16
        parts += [
            f'<rect x="{x:.0f}" y="{row_y:.0f}" width="10" height="10" fill="{color}"/>',
            f'<text x="{x + 14:.0f}" y="{row_y + 9:.0f}" fill="currentColor">{escape(name)}</text>',
        ]
    return parts, 16 * ((len(entries) + 1) // 2) + 4


STACK_COLORS = [INDIGO, INDIGO_LIGHT, TEAL, AMBER, GREY, PURPLE, BROWN]  # red is kept for budgets and OOMs


def stacked_bars(rows: list[tuple[str, list[tuple[str, int]]]], what: str) -> str:
    """An SVG of one horizontal bar per ``(label, [(part, bytes), ...])``, its parts stacked, on one scale.

    Every row names the same parts in the same order (a part may be 0); each part keeps its colour in every
    row and in the legend. ``what`` says what the bars are, for a screen reader. Empty without rows.
    """
    rows = [(label, [(p, max(int(b), 0)) for p, b in parts]) for label, parts in rows]
    if not rows:
        return ""
    names = [p for p, _ in rows[0][1]]
    colors = {name: STACK_COLORS[i % len(STACK_COLORS)] for i, name in enumerate(names)}
    legend, legend_h = _legend([(n, colors[n]) for n in names], 2)
    top = max(sum(b for _, b in parts) for _, parts in rows) * 1.02 or 1
    scale = (WIDTH - 2) / top
    row_h = 16 + BAR_H + GAP
    height = legend_h + row_h * len(rows) + 4
    summary = f"{what}. " + "; ".join(
        f"{label}: " + ", ".join(f"{p} {format_bytes(b)}" for p, b in parts if b) for label, parts in rows
    )
    out = [_svg_open(height, summary), *legend]
    for i, (label, parts) in enumerate(rows):
        y = legend_h + i * row_h
        out.append(
            f'<text x="1" y="{y + 11}" fill="currentColor"><tspan font-weight="bold">{escape(label)}</tspan> '
            f"{escape(format_bytes(sum(b for _, b in parts)))}</text>"
        )
        x = 1.0
        for part, b in parts:
            if b:
                out.append(
                    f'<rect x="{x:.1f}" y="{y + 16}" width="{b * scale:.1f}" height="{BAR_H}" fill="{colors[part]}">'
                    f"<title>{escape(label)}: {escape(part)} {escape(format_bytes(b))}</title></rect>"
                )
                x += b * scale
    return "\n".join([*out, "</svg>"])


def _polyline(points: list[tuple[float, float]], color: str, dash: str = "") -> str:
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"{dash}/>'


def _y_values(left: float, top: float, bottom: float, cap: int) -> list[str]:
    """The memory scale of a panel: the cap at its top and half of it on a faint line, labelled inside on a halo."""
    middle = (top + bottom) / 2
    halo = 'stroke="white" stroke-width="3" paint-order="stroke" fill="currentColor"'
    return [
        f'<line x1="{left}" y1="{middle:.1f}" x2="{WIDTH - 1}" y2="{middle:.1f}" stroke="{GREY}" stroke-width="0.5" '
        'stroke-dasharray="2 3"/>',
        f'<text x="{left + 2}" y="{top + 11:.0f}" {halo}>cap {escape(format_bytes(cap))}</text>',
        f'<text x="{left + 2}" y="{middle - 3:.0f}" {halo}>{escape(format_bytes(cap // 2))}</text>',
    ]


def uptime_chart(runs: list[tuple[str, dict]]) -> str:
    """An SVG panel per ``(label, worker_uptime result)``: reserved, allocated and non-releasable bytes over requests.

    Each panel has the cap (dashed), the cache-flush retries counted by the last sample, the request at which the
    restart policy first said to recycle the worker (amber), and the out-of-memory error that ended it, if one did
    (red). The panels share the memory scale; each request axis ends at that run's last sample, so that a run
    cut short by an OOM is drawn as wide as one that served every request, its end labelled.
    """
    runs = [(label, r) for label, r in runs if r.get("samples")]
    if not runs:
        return ""
    cap = max(r["cap_bytes"] for _, r in runs)
    panel_h, plot_h, left = 146, 90, 1
    legend, legend_h = _legend([("reserved", INDIGO_LIGHT), ("allocated", INDIGO), ("non-releasable", AMBER), ("cap", RED)], 2)
    height = legend_h + panel_h * len(runs)
    summary = "Allocator metrics of a worker over the requests it served. " + "; ".join(
        f"{label}: served {r['served']} of {r['requests']} requests"
        + (f", out of memory at request {r['oom_at_request']}" if r.get("oom_at_request") else "")
        + (f", restart advised at request {r['first_restart']['request']}" if r.get("first_restart") else "")
        for label, r in runs
    )
    out = [_svg_open(height, summary), *legend]
    for i, (label, r) in enumerate(runs):
        y0 = legend_h + i * panel_h + 34  # the plot's top, under the label and the notes
        last = max(s["request"] for s in r["samples"])
        bottom = y0 + plot_h

        def x_of(request: float, last: float = last) -> float:
            return left + (WIDTH - 2 - left) * request / last

        def y_of(n: float | None, bottom: float = bottom) -> float:
            return bottom - plot_h * (n or 0) / cap

        samples = r["samples"]
        reserved = [(x_of(s["request"]), y_of(s["reserved_bytes"])) for s in samples]
        area = " ".join(f"{x:.1f},{y:.1f}" for x, y in [(reserved[0][0], bottom), *reserved, (reserved[-1][0], bottom)])
        out += [
            f'<text x="1" y="{y0 - 22}" fill="currentColor" font-weight="bold">{escape(label)}</text>',
            f'<polygon points="{area}" fill="{INDIGO_LIGHT}"/>',
            _polyline([(x_of(s["request"]), y_of(s["allocated_bytes"])) for s in samples], INDIGO),
            _polyline([(x_of(s["request"]), y_of(s["non_releasable_bytes"])) for s in samples], AMBER),
            f'<line x1="{left}" y1="{y0:.1f}" x2="{WIDTH - 1}" y2="{y0:.1f}" stroke="{RED}" stroke-dasharray="4 3"/>',
            f'<line x1="{left}" y1="{bottom:.1f}" x2="{WIDTH - 1}" y2="{bottom:.1f}" stroke="currentColor" stroke-width="0.5"/>',
            f'<text x="{WIDTH - 1}" y="{bottom + 12:.0f}" text-anchor="end" fill="currentColor">{last:,} requests</text>',
            f'<text x="{left}" y="{bottom + 12:.0f}" fill="currentColor">0</text>',
            *_y_values(left, y0, bottom, cap),
        ]
        notes = []
        retries = samples[-1].get("alloc_retries_total")
        if retries:
            notes.append((f"{retries:,.0f} retries", "currentColor"))
        if r.get("first_restart"):
            at = r["first_restart"]["request"]
            out.append(
                f'<line x1="{x_of(at):.1f}" y1="{y0:.1f}" x2="{x_of(at):.1f}" y2="{bottom:.1f}" stroke="{AMBER}" stroke-dasharray="2 2"/>'
            )
            notes.append((f"restart advised at {at:,} ({r['first_restart']['rule']})", AMBER))
        if r.get("oom_at_request"):
            at = r["oom_at_request"]
            out.append(
                f'<line x1="{x_of(at):.1f}" y1="{y0:.1f}" x2="{x_of(at):.1f}" y2="{bottom:.1f}" stroke="{RED}" stroke-width="2"/>'
            )
            notes.append((f"out of memory at {at:,}", RED))
        spans = " · ".join(f'<tspan fill="{color}">{escape(text)}</tspan>' for text, color in notes)
        if spans:
            out.append(f'<text x="1" y="{y0 - 8}" fill="currentColor">{spans}</text>')
    return "\n".join([*out, "</svg>"])
