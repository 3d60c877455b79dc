"""The workflow as a picture: the steps of :data:`oomlab.steps.STEPS`, each with its question and its remedy.

Drawn as inline SVG at build time from the same registry the CLI and the exercise
pages read, so a step renamed or added there is drawn here at the next build. One
column, so that it reads on a phone as on a desktop: the error, then each step
asking its question, with what to do when the answer is yes, and the step after
it when the answer is no, and hyperparameters last.
"""

from __future__ import annotations

import textwrap
from html import escape

from oomlab.site.palette import INDIGO, INDIGO_EDGE, INDIGO_PALE
from oomlab.steps import STEPS

__all__ = ["workflow_svg"]

WIDTH, PAD, LINE, ARROW = 360, 10, 16, 30
WRAP = 52  # characters of a line at 12 units in a box WIDTH wide
ACCENT, INK, BOX, EDGE = INDIGO, "currentColor", INDIGO_PALE, INDIGO_EDGE
START = "CUDA out of memory: read the error first (allocated vs reserved)"
LAST = "Then hyperparameters: batch size with gradient accumulation, sequence length"


def _box(y: float, lines: list[tuple[str, str]], fill: str = BOX) -> tuple[list[str], float]:
    """A box at ``y`` holding ``lines`` of (text, style); its SVG and its height."""
    height = PAD * 2 + LINE * len(lines) - 4
    parts = [f'<rect x="1" y="{y:.0f}" width="{WIDTH - 2}" height="{height:.0f}" rx="6" fill="{fill}" stroke="{EDGE}"/>']
    for i, (text, style) in enumerate(lines):
        attrs = {"bold": f'font-weight="bold" fill="{INK}"', "accent": f'fill="{ACCENT}"', "": f'fill="{INK}"'}[style]
        parts.append(f'<text x="{PAD}" y="{y + PAD + 9 + i * LINE:.0f}" {attrs}>{escape(text)}</text>')
    return parts, height


def _arrow(y: float, label: str) -> list[str]:
    """A downward arrow from ``y`` with ``label`` beside it."""
    x = 28
    return [
        f'<line x1="{x}" y1="{y:.0f}" x2="{x}" y2="{y + ARROW - 6:.0f}" stroke="{EDGE}" stroke-width="2"/>',
        f'<path d="M{x - 5},{y + ARROW - 8:.0f} L{x + 5},{y + ARROW - 8:.0f} L{x},{y + ARROW - 1:.0f} z" fill="{EDGE}"/>',
        f'<text x="{x + 10}" y="{y + ARROW / 2 + 4:.0f}" fill="{INK}" font-style="italic">{escape(label)}</text>',
    ]


def _wrapped(text: str, style: str) -> list[tuple[str, str]]:
    return [(line, style) for line in textwrap.wrap(text, WRAP)]


def workflow_svg() -> str:
    """The whole workflow, top to bottom."""
    parts: list[str] = []
    y = 1.0
    blocks = [_wrapped(START, "bold")]
    for s in STEPS:
        blocks.append(
            [(s.heading, "bold"), *_wrapped(s.question, ""), *_wrapped(f"If so: {s.remedy}. (oomlab {s.name})", "accent")]
        )
    blocks.append(_wrapped(LAST, "bold"))
    for i, lines in enumerate(blocks):
        box, height = _box(y, lines, fill="none" if i in (0, len(blocks) - 1) else BOX)
        parts += box
        y += height
        if i < len(blocks) - 1:
            parts += _arrow(y, "" if i == 0 else "if not")
            y += ARROW
    words = " ".join([START + "."] + [f"{s.heading}: {s.question} If so: {s.remedy}. If not:" for s in STEPS] + [LAST + "."])
    return "\n".join(
        [
            f'<svg class="oomlab-diagram" viewBox="0 0 {WIDTH} {y + 1:.0f}" width="100%" style="max-width: {1.5 * WIDTH:.0f}px" '
            f'role="img" aria-label="{escape(words)}" xmlns="http://www.w3.org/2000/svg" font-family="sans-serif" '
            'font-size="12">',
            *parts,
            "</svg>",
        ]
    )
