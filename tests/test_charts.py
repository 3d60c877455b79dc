"""The pictures drawn at build time from the committed measurements: every bar is a figure of the report."""

from __future__ import annotations

import re

from oomlab.site.charts import WIDTH, peaks_chart
from oomlab.units import MIB

BUG = {"peak_allocated": 1_000 * MIB, "peak_reserved": 2_000 * MIB, "oom": True}
FIX = {"peak_allocated": 900 * MIB, "peak_reserved": 1_000 * MIB, "oom": False}


def widths(svg: str) -> dict[str, float]:
    return {title: float(w) for w, title in re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*><title>(.*?)</title>', svg)}


def test_bars_are_drawn_to_one_scale_with_the_budget():
    svg = peaks_chart([("bug", BUG), ("fix", FIX)], 2_048 * MIB)
    w = widths(svg)
    assert abs(w["bug: peak reserved 2,000.0 MiB"] - 2 * w["fix: peak reserved 1,000.0 MiB"]) < 0.15  # drawn to 0.1 unit
    assert abs(w["fix: peak allocated 900.0 MiB"] / w["bug: peak allocated 1,000.0 MiB"] - 0.9) < 1e-3
    budget_x = float(re.search(r'<line x1="([\d.]+)"', svg)[1])
    assert budget_x < WIDTH and abs((budget_x - 1) / w["bug: peak reserved 2,000.0 MiB"] - 2_048 / 2_000) < 1e-3
    assert "budget 2,048.0 MiB" in svg


def test_a_run_that_ran_out_of_memory_says_so_in_the_picture_and_in_words():
    svg = peaks_chart([("bug", BUG), ("fix", FIX)], 2_048 * MIB)
    assert "· out of memory" in svg and svg.count("ran out of memory") == 1  # the label; the words for a screen reader
    assert 'aria-label="Peak memory of each run against the budget of 2,048.0 MiB. bug: 1,000.0 MiB allocated' in svg


def test_a_run_without_peaks_is_left_out_and_no_runs_draw_nothing():
    svg = peaks_chart([("bug", BUG), ("crashed", {"peak_allocated": None, "peak_reserved": None})], 2_048 * MIB)
    assert "crashed" not in svg
    assert peaks_chart([("crashed", {})], 2_048 * MIB) == ""
