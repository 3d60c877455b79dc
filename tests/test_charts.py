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


# --------------------------------------------------------------------------- the probes' pictures


def test_stacked_parts_keep_their_share_and_colour_in_every_row():
    from oomlab.site.charts import stacked_bars

    rows = [("before", [("weights", 100 * MIB), ("saved", 0)]), ("after", [("weights", 100 * MIB), ("saved", 300 * MIB)])]
    svg = stacked_bars(rows, "a step")
    w = widths(svg)
    assert abs(w["after: saved 300.0 MiB"] / w["after: weights 100.0 MiB"] - 3) < 1e-2
    assert abs(w["before: weights 100.0 MiB"] - w["after: weights 100.0 MiB"]) < 0.1
    assert "before: saved" not in svg  # a part of 0 draws nothing
    bars = {name: color for color, name in re.findall(r'fill="(#\w+)"><title>\w+: (\w+)', svg)}
    legend = {name: color for color, name in re.findall(r'width="10" height="10" fill="(#\w+)"/>\s*<text [^>]*>(\w+)<', svg)}
    assert legend == bars and len(set(legend.values())) == 2
    assert "after: weights 100.0 MiB, saved 300.0 MiB" in svg  # the words for a screen reader
    assert stacked_bars([], "nothing") == ""


def worker(oom_at=None, restart=None) -> dict:
    samples = [
        {"request": r, "reserved_bytes": 1_000 * MIB, "allocated_bytes": 500 * MIB, "non_releasable_bytes": 200 * MIB}
        for r in (25, 50, 75, 100)
    ]
    served = (oom_at - 1) if oom_at else 100
    return {
        "cap_bytes": 2_000 * MIB,
        "requests": 100,
        "served": served,
        "oom_at_request": oom_at,
        "first_restart": restart,
        "samples": samples,
    }


def test_the_uptime_chart_marks_the_advised_restart_and_the_oom_only_where_they_happened():
    from oomlab.site.charts import uptime_chart

    svg = uptime_chart(
        [("defaults", worker(oom_at=90, restart={"request": 25, "rule": "fragmentation"})), ("expandable", worker())]
    )
    assert svg.count("out of memory at 90") == 1 and svg.count("restart advised at 25 (fragmentation)") == 1
    assert 'expandable: served 100 of 100 requests"' in svg  # the last words for a screen reader
    # reserved is half the cap: in each panel the area's top sits halfway between the cap line and the axis
    caps = [float(y) for y in re.findall(r'y1="([\d.]+)" x2="[\d.]+" y2="[\d.]+" stroke="#c62828" stroke-dasharray="4 3"', svg)]
    areas = [[float(y) for y in re.findall(r",([\d.]+)", points)] for points in re.findall(r'<polygon points="([^"]+)"', svg)]
    assert len(caps) == len(areas) == 2
    for cap_y, ys in zip(caps, areas, strict=True):
        bottom, top = ys[0], ys[1]
        assert abs((bottom - top) / (bottom - cap_y) - 0.5) < 0.01
    assert uptime_chart([("empty", {"samples": []})]) == ""


def test_the_uptime_chart_gives_its_memory_scale_in_each_panel():
    """A reader reads a level off the chart: the cap and half of it are labelled with their sizes, where they are drawn."""
    from oomlab.site.charts import uptime_chart

    svg = uptime_chart([("defaults", worker()), ("expandable", worker())])
    assert svg.count(">cap 2,000.0 MiB</text>") == 2 and svg.count(">1,000.0 MiB</text>") == 2
    cap_line = float(re.search(r'y1="([\d.]+)" x2="[\d.]+" y2="[\d.]+" stroke="#c62828" stroke-dasharray="4 3"', svg)[1])
    cap_label = float(re.search(r'y="([\d.]+)"[^>]*>cap 2,000.0 MiB<', svg)[1])
    assert 0 < cap_label - cap_line < 14, "the cap's label is not at the cap's line"


def test_every_chart_marker_draws_its_probe_or_says_it_has_not_run():
    from oomlab.site import fact_charts

    assert fact_charts.chart("worker-uptime", None) is None
    assert "<svg" in fact_charts.chart("worker-uptime", {"facts": {"worker_uptime": {"defaults": worker()}}})
