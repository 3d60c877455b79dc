"""Segments and blocks as pictures: split, merge, a pinned segment, and what expandable segments change.

Each picture is a short program, one line at a time, and the segments the
caching allocator holds after each line, drawn to scale as inline SVG at build
time. The colours are those of ``oomlab snapshot``'s segment map (blue a live
block, red free space in a segment that a live block pins, grey free space that
can go back to the driver), so the pictures teach how to read the real ones.

What each line does follows the allocator's source, ``c10/cuda/CUDACachingAllocator.cpp``:
a request under 10 MiB gets a 20 MiB segment and one of 10 MiB or more a
segment of its own (``get_allocation_size``); the rest of a block is split off
when more than 1 MiB remains, or at least 512 bytes with expandable segments
(``should_split``); a freed block merges with free neighbours of its own segment
only (``free_block``, ``try_merge_blocks``); ``empty_cache`` hands back whole free
segments (``release_blocks``), and with expandable segments the free pages of
any segment (``unmap_block``), which grows by mapping 20 MiB pages at its end
(``find_expandable_block``, ``map_block``).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from html import escape

from oomlab.site.palette import GREY, INDIGO, RED

__all__ = ["DIAGRAMS", "expandable_svg", "split_merge_svg"]

WIDTH = 400  # viewBox units, as the charts: drawn at up to 1.4 times this
MIB_W = 9.0  # units per MiB: a 20 MiB segment is 180 wide, two of them fit side by side
BAR_H, LINE, GAP = 22, 15, 12
NOTE_WRAP = 72  # characters of a note's line at 10 units: the width of the picture
LIVE, PINNED, RELEASABLE = INDIGO, RED, GREY


@dataclass(frozen=True)
class Block:
    mib: int
    name: str = ""  # the tensor in it; empty for free space
    mapped: bool = True  # False: address space of an expandable segment with no memory behind it

    @property
    def live(self) -> bool:
        return bool(self.name)


@dataclass(frozen=True)
class Step:
    code: str  # the line of Python
    segments: tuple[tuple[Block, ...], ...]  # what the allocator holds after it
    note: str  # what happened, in the allocator's words


def _free(mib: int) -> Block:
    return Block(mib)


def _unmapped(mib: int) -> Block:
    return Block(mib, mapped=False)


SPLIT_MERGE = (
    Step(
        "x = 8 MiB tensor",
        ((Block(8, "x"), _free(12)),),
        "No cached block fits: cudaMalloc a 20 MiB segment (a request under 10 MiB gets 20 MiB) and split it.",
    ),
    Step(
        "y = 6 MiB tensor",
        ((Block(8, "x"), Block(6, "y"), _free(6)),),
        "Best fit: the free 12 MiB block, split again. No new memory from the driver.",
    ),
    Step(
        "del x",
        ((_free(8), Block(6, "y"), _free(6)),),
        "x's block goes back to the cache, not to the driver. It cannot merge with the 6 MiB free block: y sits "
        "between them. 14 MiB is free, but a 9 MiB request fits in neither block and costs a new segment; "
        "empty_cache() cannot release this one while y pins it.",
    ),
    Step(
        "del y",
        ((_free(20),),),
        "y's block merges with both free neighbours: the segment is whole again, and empty_cache() can hand it back.",
    ),
)

EXPANDABLE = (
    Step(
        "a = 12 MiB activation (defaults)",
        ((Block(12, "a"),),),
        "10 MiB or more: a segment of its own, exactly 12 MiB.",
    ),
    Step(
        "del a; b = 14 MiB activation",
        ((_free(12),), (Block(14, "b"),)),
        "The cached 12 MiB block is too small, and segments never merge: a second segment. 26 MiB reserved for a "
        "14 MiB tensor; under a cap, that is the OOM of ragged batches.",
    ),
    Step(
        "a = 12 MiB activation (expandable_segments:True)",
        ((Block(12, "a"), _free(8), _unmapped(20)),),
        "One segment per stream and pool, a long range of addresses: a 20 MiB page is mapped and split.",
    ),
    Step(
        "del a; b = 14 MiB activation",
        ((Block(14, "b"), _free(6), _unmapped(20)),),
        "a's block merges back into the free 20 MiB, and b fits there: 20 MiB reserved. A larger request "
        "maps more pages at the end of the same segment, so the freed space stays usable.",
    ),
)


def _segment(x: float, y: float, blocks: tuple[Block, ...]) -> tuple[list[str], float]:
    """One segment's blocks at ``(x, y)``, drawn to scale; its SVG and its width."""
    pinned = any(b.live for b in blocks)
    parts: list[str] = []
    left = x
    for b in blocks:
        w = b.mib * MIB_W
        if not b.mapped:
            parts.append(
                f'<rect x="{left:.1f}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="none" stroke="{GREY}" '
                'stroke-dasharray="3 3"/>'
            )
            label, ink = "not mapped", GREY
        else:
            fill = LIVE if b.live else PINNED if pinned else RELEASABLE
            parts.append(f'<rect x="{left:.1f}" y="{y}" width="{w:.1f}" height="{BAR_H}" fill="{fill}" stroke="white"/>')
            label, ink = (f"{b.name} {b.mib} MiB" if b.live else f"free {b.mib}"), "white"
        if w >= 6 * len(label):
            parts.append(
                f'<text x="{left + w / 2:.1f}" y="{y + BAR_H / 2 + 4}" text-anchor="middle" fill="{ink}">{escape(label)}</text>'
            )
        left += w
    mapped_w = sum(b.mib for b in blocks if b.mapped) * MIB_W  # an expandable segment maps from its start
    parts.append(f'<rect x="{x}" y="{y}" width="{mapped_w:.1f}" height="{BAR_H}" fill="none" stroke="currentColor"/>')
    return parts, left - x


def _steps_svg(steps: tuple[Step, ...], title: str) -> str:
    parts: list[str] = []
    y = 1.0
    words = [title + "."]
    for s in steps:
        parts.append(
            f'<text x="1" y="{y + 11:.0f}" font-family="monospace" font-weight="bold" fill="currentColor">{escape(s.code)}</text>'
        )
        y += LINE + 4
        x = 1.0
        for blocks in s.segments:
            drawn, width = _segment(x, y, blocks)
            parts += drawn
            x += width + 8
        y += BAR_H + 4
        for line in textwrap.wrap(s.note, NOTE_WRAP):
            y += LINE - 2
            parts.append(f'<text x="1" y="{y:.0f}" fill="currentColor" font-size="10">{escape(line)}</text>')
        y += GAP
        shown = "; ".join(
            " then ".join(
                f"{b.name} {b.mib} MiB" if b.live else f"{b.mib} MiB {'free' if b.mapped else 'not mapped'}" for b in blocks
            )
            for blocks in s.segments
        )
        words.append(f"{s.code}: segments {shown}. {s.note}")
    return "\n".join(
        [
            f'<svg class="oomlab-diagram" viewBox="0 0 {WIDTH} {y:.0f}" width="100%" style="max-width: {1.4 * WIDTH:.0f}px" '
            f'role="img" aria-label="{escape(" ".join(words))}" xmlns="http://www.w3.org/2000/svg" '
            'font-family="sans-serif" font-size="11">',
            *parts,
            "</svg>",
        ]
    )


def split_merge_svg() -> str:
    """One 20 MiB segment through split, a pinned free block, and merge."""
    return _steps_svg(SPLIT_MERGE, "Split, pin and merge in one segment, with the default settings")


def expandable_svg() -> str:
    """A request that grows, with one segment per request and with one expandable segment."""
    return _steps_svg(EXPANDABLE, "A growing request, with the default segments and with expandable segments")


DIAGRAMS = {"split-and-merge": split_merge_svg, "expandable-segments": expandable_svg}
