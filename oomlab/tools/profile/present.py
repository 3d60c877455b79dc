"""The profile's result for people: tables for the terminal, and the memory timeline as a picture.

:func:`render` gives the operators that allocated the most, the peak (its
operator, line, culprit and kind) and what was live at it, by category and by
line. :func:`draw` stacks the live memory by category over time and marks the
peak, the budget and the failed request. Both read only the JSON result, so
they work on a result from another machine as well as on a fresh one.
"""

from __future__ import annotations

from pathlib import Path

from oomlab.tools.base import figure, pyplot, save_figure
from oomlab.tools.profile.analysis import TOOL, called_from, category_label, where
from oomlab.units import MIB, format_bytes, in_mib

__all__ = ["draw", "peak_window", "render"]

# What the chart stacks, bottom to top, with its label and colour.
DRAWN = (
    ("parameters", "parameters", "#2e7d32"),
    ("gradients", "gradients", "#1565c0"),
    ("optimizer_state", "optimizer state", "#f9a825"),
    ("inputs", "inputs (and tensors made from them)", "#6d4c41"),
    ("kept", "kept past its step", "#00838f"),
    ("activations", "activations (kept for backward)", "#c62828"),
    ("autograd_detail", "autograd detail (made by backward)", "#ef6c00"),
    ("temporaries", "temporaries", "#8e24aa"),
    ("unknown", "unknown", "#9e9e9e"),
)


# --------------------------------------------------------------------------- terminal


def render(result: dict) -> list:
    """Rich renderables for the terminal: the top operators, the peak, and what was live at it."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(result.get("headline", ""), style="bold")]
    if result.get("error"):
        out.append(Text(f"profile error: {result['error']}", style="red"))
    ops = Table(title="Operators that allocated the most", title_justify="left", header_style="bold")
    ops.add_column("operator")
    ops.add_column("calls", justify="right")
    ops.add_column("MiB", justify="right")
    ops.add_column("input shapes (largest call)", style="dim")
    for row in result.get("top_ops") or []:
        ops.add_row(row["op"], str(row["calls"]), in_mib(row["bytes"]), _shapes(row.get("input_shapes")))
    out.append(ops)

    peak = result.get("peak")
    if peak:
        out.append(_peak_text(result, peak))
        cats = Table(title="Live at the peak", title_justify="left", header_style="bold")
        cats.add_column("category")
        cats.add_column("MiB", justify="right")
        for category, nbytes in sorted(peak.get("by_category", {}).items(), key=lambda kv: -kv[1]):
            cats.add_row(category_label(category), in_mib(nbytes))
        out.append(cats)
        if peak.get("by_line"):
            lines = Table(title="Live at the peak, by the line that allocated it", title_justify="left", header_style="bold")
            lines.add_column("line")
            lines.add_column("MiB", justify="right")
            lines.add_column("operator")
            lines.add_column("code", style="dim")
            for row in peak["by_line"]:
                lines.add_row(where(row) or "(no line)", in_mib(row["bytes"]), row.get("op") or "", row.get("text") or "")
            out.append(lines)
    if result.get("kind") == "transient-peak" and result.get("advice"):
        out.append(Text(result["advice"], style="italic"))
    for note in result.get("notes") or []:
        out.append(Text(f"note: {note}", style="yellow"))
    return out


def _peak_text(result: dict, peak: dict):
    """The peak in a few labelled lines: size and time, operator, line, culprit, kind, failed request."""
    from rich.text import Text

    text = Text()
    text.append("Peak: ", style="bold")
    in_failed_step = " (in the failed step)" if peak.get("in_failed_step") else ""
    text.append(f"{format_bytes(peak['total_bytes'])} at {peak['time_ms']:,.1f} ms{in_failed_step}\n")
    text.append("operator: ", style="bold")
    text.append(f"{peak.get('op') or 'n/a'}" + (f"  ({peak['context']})" if peak.get("context") else "") + "\n")
    text.append("line: ", style="bold")
    text.append(f"{where(peak) or 'n/a'}  {peak.get('text') or ''}\n")
    if peak.get("caller"):
        caller = peak["caller"]
        text.append("called from: ", style="bold")
        text.append(f"{where(caller)}  {caller.get('text') or ''}\n")
    culprit = peak.get("culprit") or {}
    if culprit.get("line"):
        text.append("culprit: ", style="bold")
        live = f"({format_bytes(culprit['bytes'])} live at the peak)"
        text.append(f"{where(culprit)}  {culprit.get('text') or ''}  {live}\n")
    text.append("kind: ", style="bold")
    text.append(f"{result.get('kind', '')} ({peak.get('kind_basis', '')})")
    failure = result.get("failure") or {}
    if failure.get("request_bytes"):
        text.append("\nfailed request: ", style="bold")
        text.append(f"{format_bytes(failure['request_bytes'])} with {format_bytes(failure['live_bytes'])} live")
    return text


def _shapes(shapes) -> str:
    if not shapes:
        return ""
    return ", ".join(str(tuple(s)) if isinstance(s, list) else str(s) for s in shapes if s not in ([], None))


# --------------------------------------------------------------------------- pictures


def peak_window(result: dict) -> tuple[float, float] | None:
    """``(start, end)`` in ms of the step that holds the peak, when it is a small part of the run; else ``None``.

    A first step that loads kernels can take most of a run's time and squeeze
    the step that matters (the one that failed, or the highest) into a sliver.
    """
    timeline = result.get("timeline") or {}
    times = timeline.get("times_ms") or []
    peak = result.get("peak")
    if not times or not peak:
        return None
    ends = timeline.get("step_ends_ms") or []
    t = peak["time_ms"]
    start = max((e for e in ends if e < t), default=times[0])
    end = min((e for e in ends if e >= t), default=times[-1])
    failure = result.get("failure") or {}
    if failure.get("time_ms") is not None:
        end = max(end, failure["time_ms"])
    span = times[-1] - times[0]
    if span <= 0 or end - start > 0.5 * span:
        return None
    margin = 0.05 * (end - start)
    return start - margin, end + margin


LEGEND_COLUMNS, LEGEND_ROW_IN = 3, 0.22  # the legend under the panels: entries per row, and a row's height in inches


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``profile.png``: MiB by category over time, the peak marked with its operator and line.

    When the step that holds the peak is a small part of the run, a second
    panel shows that step alone. Nothing is drawn for a result without a timeline.
    """
    timeline = result.get("timeline") or {}
    times = timeline.get("times_ms") or []
    if not times:
        return []
    plt = pyplot()
    series = timeline.get("bytes") or {}
    drawn = [(key, label, color) for key, label, color in DRAWN if any(series.get(key) or [])]
    window = peak_window(result)
    if window:
        fig, (whole, zoom) = figure(plt, 7.6, 2, 1, gridspec_kw={"height_ratios": [1, 1.6]})
        axes = (whole, zoom)
    else:
        fig, whole = figure(plt, 4.8)
        zoom, axes = None, (whole,)
    for ax in axes:
        ax.stackplot(
            times,
            *[[b / MIB for b in series[key]] for key, _, _ in drawn],
            labels=[label for _, label, _ in drawn],
            colors=[color for _, _, color in drawn],
            alpha=0.85,
            step="post",
        )
        _marks(ax, result, timeline)
        ax.set_ylabel("MiB")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    whole.set_xlim(left=_first_memory_ms(times, [series[key] for key, _, _ in drawn]))
    title = f"Memory on {result.get('device', '')} over time by category ({result.get('kind', '')})"
    whole.set_title(title, fontsize=11, wrap=True)
    if zoom is not None:
        whole.set_title(f"{title}: the whole run", fontsize=11, wrap=True)
        whole.axvspan(*window, color="black", alpha=0.08, label="shown below")
        zoom.set_xlim(*window)
        which = "the failed step" if (result.get("peak") or {}).get("in_failed_step") else "the step with the peak"
        zoom.set_title(f"{which}, enlarged")
    _annotate_peak(axes[-1], result)
    axes[-1].set_xlabel("time since the first allocation (ms)")
    # The legend under the panels, across the figure: beside them it took a third of the width the curves need.
    handles, labels = whole.get_legend_handles_labels()
    rows = -(-len(labels) // LEGEND_COLUMNS)
    fig.legend(handles, labels, loc="lower center", ncol=LEGEND_COLUMNS, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, min(0.3, rows * LEGEND_ROW_IN / fig.get_figheight()), 1, 1))
    return [save_figure(fig, Path(out_dir) / f"{TOOL}.png")]


def _first_memory_ms(times: list[float], series: list[list[int]]) -> float:
    """Where the whole-run panel starts: just before memory first reaches 1% of its highest.

    The first allocation can come seconds before the run gets going (a model built on the CPU, a
    dataset read), and an axis from it would start with that long, empty stretch.
    """
    totals = [sum(column) for column in zip(*series, strict=True)] if series else []
    if not totals or max(totals) <= 0:
        return times[0]
    first = next(i for i, total in enumerate(totals) if total >= 0.01 * max(totals))
    return max(times[0], times[first] - 0.02 * (times[-1] - times[0]))


def _marks(ax, result: dict, timeline: dict) -> None:
    """Step ends, the budget, the failed request and the run's highest point."""
    for n, end in enumerate(timeline.get("step_ends_ms") or []):
        ax.axvline(end, color="black", alpha=0.35, linewidth=0.8, linestyle=":", label="optimizer step ends" if n == 0 else None)
    budget = result.get("budget_bytes")
    if budget:
        ax.axhline(budget / MIB, color="red", linestyle="--", linewidth=1.2, label=f"budget {format_bytes(budget)}")
    failure = result.get("failure") or {}
    if failure.get("request_bytes"):
        # The request that failed never shows in the timeline: draw it on top of what was live.
        x, live = failure["time_ms"], failure["live_bytes"] / MIB
        ax.vlines(x, live, live + failure["request_bytes"] / MIB, color="red", linewidth=3, label="failed request")
        ax.plot([x], [live + failure["request_bytes"] / MIB], marker="x", color="red", markersize=10)
    peak = result.get("peak")
    run_peak = result.get("run_peak") or {}
    if peak and run_peak.get("total_bytes", 0) > peak["total_bytes"]:
        ax.plot(
            [run_peak["time_ms"]],
            [run_peak["total_bytes"] / MIB],
            marker="v",
            color="grey",
            markersize=8,
            label="highest level of the run",
        )
    if peak:
        ax.plot([peak["time_ms"]], [peak["total_bytes"] / MIB], marker="v", color="black", markersize=9, zorder=5)


def _annotate_peak(ax, result: dict) -> None:
    """The peak's figures, operator, line and culprit in a box, with an arrow to it."""
    peak = result.get("peak")
    if not peak:
        return
    label = "peak of the failed step" if peak.get("in_failed_step") else "peak"
    text = f"{label} {format_bytes(peak['total_bytes'])}: {peak.get('op') or 'n/a'}"
    if peak.get("line"):
        text += f"\n{where(peak)}  {_short(peak.get('text'))}"
        if peak.get("caller"):
            text += f"\n{called_from(peak)[2:]}  {_short(peak['caller'].get('text'))}"
    culprit = peak.get("culprit") or {}
    if culprit.get("line") and culprit["line"] != peak.get("line"):
        text += f"\nmost of it from {where(culprit)}  {_short(culprit.get('text'))}"
    # The four largest categories; those under a MiB would only crowd the box.
    largest = sorted((peak.get("by_category") or {}).items(), key=lambda kv: -kv[1])[:4]
    parts = [f"{category_label(c)} {format_bytes(b)}" for c, b in largest if b >= MIB]
    if parts:
        text += "\n" + ", ".join(parts)
    ax.annotate(
        text,
        xy=(peak["time_ms"], peak["total_bytes"] / MIB),
        xytext=(0.02, 0.97),
        textcoords="axes fraction",
        va="top",
        fontsize=10,
        bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9},
        arrowprops={"arrowstyle": "->", "color": "black"},
    )


def _short(code: str | None, width: int = 60) -> str:
    """A line of code cut to ``width`` characters, for the picture's box."""
    code = code or ""
    return code if len(code) <= width else code[: width - 3] + "..."
