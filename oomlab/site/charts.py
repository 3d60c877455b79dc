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

from oomlab.units import format_bytes

__all__ = ["peaks_chart"]

WIDTH = 400  # viewBox units: drawn at up to 1.4 times this on a wide screen, at about 0.85 on a phone
LABEL_H, BAR_H, GAP = 30, 14, 10  # two lines of text above each bar
ALLOCATED, RESERVED, RED = "#3f51b5", "#c5cae9", "#c62828"  # indigo as the theme's accent; red for the budget, an OOM


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
