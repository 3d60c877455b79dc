"""The segment diagrams of the allocator page (oomlab/site/segments_diagram.py): drawn to scale and true to the rules they cite."""

from __future__ import annotations

import re

import pytest

from oomlab.site import segments_diagram as sd

LARGE_SEGMENT_MIB, PAGE_MIB = 20, 20  # kLargeBuffer: a request under 10 MiB gets a 20 MiB segment; expandable pages


def mapped(blocks) -> int:
    return sum(b.mib for b in blocks if b.mapped)


def test_split_and_merge_keeps_one_20_mib_segment_and_merges_only_when_no_live_block_is_between():
    for step in sd.SPLIT_MERGE:
        (segment,) = step.segments
        assert mapped(segment) == LARGE_SEGMENT_MIB, step.code
        for a, b in zip(segment, segment[1:], strict=False):
            assert a.live or b.live, f"{step.code}: two free blocks side by side would have merged"
    last = sd.SPLIT_MERGE[-1].segments[0]
    assert len(last) == 1 and not last[0].live, "after the last del the segment is whole again"


def test_every_tensor_a_line_creates_is_drawn_with_the_size_the_line_names():
    for steps in (sd.SPLIT_MERGE, sd.EXPANDABLE):
        for step in steps:
            named = dict(re.findall(r"(\w+) = (\d+) MiB", step.code))
            drawn = {b.name: b.mib for segment in step.segments for b in segment if b.live}
            for name, mib in named.items():
                assert drawn.get(name) == int(mib), f"{step.code}: {name} drawn as {drawn.get(name)} MiB"
            for name in re.findall(r"del (\w+)", step.code):
                assert name not in drawn, f"{step.code}: {name} is still drawn"


def test_the_default_segments_are_exact_for_large_requests_and_expandable_ones_map_whole_pages():
    default_steps = [s for s in sd.EXPANDABLE if "expandable" not in s.code][:2]
    assert [len(s.segments) for s in default_steps] == [1, 2], "a request of 10 MiB or more gets a segment of its own"
    for s in default_steps:
        assert all(mapped(seg) in (12, 14) for seg in s.segments), s.code
    for s in sd.EXPANDABLE[2:]:
        (segment,) = s.segments
        assert mapped(segment) % PAGE_MIB == 0, f"{s.code}: an expandable segment maps whole 20 MiB pages"
        assert not segment[-1].mapped, "an expandable segment's addresses go on past what is mapped"


@pytest.mark.parametrize("draw", [sd.split_merge_svg, sd.expandable_svg])
def test_each_diagram_is_svg_that_says_in_words_what_it_draws(draw):
    svg = draw()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    label = re.search(r'aria-label="([^"]+)"', svg)[1]
    steps = sd.SPLIT_MERGE if draw is sd.split_merge_svg else sd.EXPANDABLE
    for step in steps:
        assert step.code in label
    width = float(re.search(r'viewBox="0 0 (\d+)', svg)[1])
    rights = [float(x) + float(w) for x, w in re.findall(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"', svg)]
    assert max(rights) <= width, "a segment is drawn past the picture's edge"
