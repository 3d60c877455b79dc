"""The snapshot tool's result for people: tables for the terminal, and two pictures.

:func:`render` gives the figures that say whether memory is live or stranded,
the segments live blocks pin, and who owns the live bytes. :func:`draw` paints
the segment map (each segment a bar, its blocks coloured by state, free space
that a live block pins in red) and the allocated and reserved memory over the
recorded history. Both read only the JSON result, so they work on a result
from another machine as well as on a fresh one.
"""

from __future__ import annotations

from pathlib import Path

from oomlab.tools.base import figure, pyplot, save_figure
from oomlab.tools.snapshot.analysis import FREE, LIVE, MIXED, PENDING, site_text
from oomlab.units import MIB, format_bytes, in_mib

__all__ = ["draw", "render"]

MAX_DRAWN_SEGMENTS = 60
COLOURS = {LIVE: "#1f77b4", PENDING: "#ff7f0e", FREE: "#d0d0d0", "stranded": "#d62728", MIXED: "#9467bd"}


# --------------------------------------------------------------------------- terminal


def render(result: dict) -> list:
    """Rich renderables for the terminal: the figures, the pinned segments, the top owners."""
    from rich.table import Table
    from rich.text import Text

    out: list = [Text(result.get("headline", ""), style="bold")]
    if result.get("error"):
        return out
    totals, oom = result["totals"], result["oom"]
    figures = Table(title="Allocator snapshot", title_justify="left", header_style="bold")
    figures.add_column("figure")
    figures.add_column("value", justify="right")
    figures.add_column("what it means", style="dim")
    figures.add_row("reserved", format_bytes(totals["reserved"]), f"held from the GPU in {totals['segments']} segments")
    figures.add_row("allocated", format_bytes(totals["allocated"]), "in live blocks (tensors)")
    if totals["pending_free"]:
        figures.add_row("pending free", format_bytes(totals["pending_free"]), "freed, waiting for another stream")
    figures.add_row("non-releasable", format_bytes(totals["non_releasable"]), "free, but in segments a live block pins")
    figures.add_row("releasable", format_bytes(totals["releasable"]), "whole free segments empty_cache() could return")
    figures.add_row("largest free block", format_bytes(totals["largest_free_block"]), "the biggest request the cache could serve")
    if oom.get("failed_request") is not None:
        fits = "a free block could have held it" if oom["fits_in_a_free_block"] else "no free block could hold it"
        figures.add_row("failed request", format_bytes(oom["failed_request"]), fits)
        if oom.get("failed_at") and oom["failed_at"].get("file"):
            figures.add_row("failed at", oom["failed_at"]["label"], oom["failed_at"].get("code") or "")
    driver = result.get("driver")
    if driver and driver.get("available"):
        figures.add_row("driver (NVML)", format_bytes(driver["used"]), "what the driver counts for this process")
        if driver["outside"] >= 0:
            figures.add_row(
                "outside the allocator", format_bytes(driver["outside"]), "driver less reserved: no allocator figure counts it"
            )
    out.append(figures)
    if driver:
        out.append(Text(driver["summary"], style="dim"))

    if result.get("pinned_groups"):
        pinned = Table(title="Segments pinned by live blocks", title_justify="left", header_style="bold")
        for name, justify in (
            ("segments", "right"),
            ("segment", "right"),
            ("pinned by", "right"),
            ("allocated at", "left"),
            ("stranded", "right"),
        ):
            pinned.add_column(name, justify=justify)
        for g in result["pinned_groups"][:10]:
            more = f" (+{g['live_blocks'] - 1} more)" if g["live_blocks"] > 1 else ""
            pinned.add_row(
                str(g["count"]),
                format_bytes(g["segment_size"]),
                format_bytes(g["pinner_size"]) + more,
                site_text(g["site"]),
                format_bytes(g["free_bytes"]),
            )
        out.append(pinned)

    if result.get("owners"):
        owners = Table(title="Live memory by allocation site", title_justify="left", header_style="bold")
        owners.add_column("site")
        owners.add_column("MiB", justify="right")
        owners.add_column("blocks", justify="right")
        owners.add_column("code", style="cyan")
        for o in result["owners"][:10]:
            owners.add_row(o["site"], in_mib(o["bytes"]), str(o["blocks"]), o.get("code") or "")
        out.append(owners)
    for note in result.get("notes", []):
        out.append(Text(note, style="dim"))
    if result.get("snapshot_file") and result.get("out_dir"):
        pickle_path = Path(result["out_dir"]) / result["snapshot_file"]
        out.append(
            Text(
                f"Snapshot: {pickle_path}. PyTorch's viewer (https://pytorch.org/memory_viz, needs the internet) opens it; "
                f"offline, `oomlab snapshot {pickle_path}` reads it again and "
                f"`python -m torch.cuda._memory_viz stats {pickle_path}` prints its totals.",
                style="dim",
            )
        )
    return out


# --------------------------------------------------------------------------- pictures


def draw(result: dict, out_dir: Path) -> list[Path]:
    """Write ``segments.png`` (the segment map) and ``timeline.png`` (memory over the run); none for an error."""
    if result.get("error"):
        return []
    out_dir = Path(out_dir)
    plt = pyplot()
    return [_draw_segments(plt, result, out_dir / "segments.png"), _draw_timeline(plt, result, out_dir / "timeline.png")]


def _draw_segments(plt, result: dict, path: Path) -> Path:
    """One bar per segment, largest first, its blocks laid out by offset and coloured by state."""
    from matplotlib.patches import Patch

    listed = sorted(result["segments"], key=lambda s: (s["total"], s["free"]), reverse=True)
    total_count = result["totals"]["segments"]
    shown = listed[:MAX_DRAWN_SEGMENTS]
    left_out = total_count - len(shown)
    fig, ax = figure(plt, max(3.2, 1.5 + 0.22 * len(shown)))
    rows, widths, lefts, colours = [], [], [], []
    for row, seg in enumerate(shown):
        for offset, size, state in seg["layout"]:
            rows.append(row)
            widths.append(size / MIB)
            lefts.append(offset / MIB)
            colours.append(COLOURS["stranded"] if state == FREE and seg["pinned"] else COLOURS[state])
    if rows:  # one call for every block: matplotlib's cost is per call, and a segment can hold hundreds of runs
        ax.barh(rows, widths, left=lefts, height=0.8, color=colours, edgecolor="white", linewidth=0.4)
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels([f"{s['pool']} {s['total'] / MIB:,.0f} MiB" for s in shown], fontsize=7 if len(shown) > 30 else 9)
    ax.invert_yaxis()
    ax.set_xlabel("offset in segment (MiB)")
    ax.set_ylabel("segment (pool, size)")
    where = "at the OOM" if result["oom"].get("failed_request") is not None else "at the end of the run"
    title = f"Allocator segments {where}: {len(shown)} of {total_count}, largest first"
    if left_out:
        title += f" ({left_out} smaller left out)"
    totals = result["totals"]
    ax.set_title(
        f"{title}\nreserved {format_bytes(totals['reserved'])}, live {format_bytes(totals['allocated'])}, "
        f"free but pinned {format_bytes(totals['pinned_free'])}, "
        f"largest free block {format_bytes(totals['largest_free_block'])}",
        fontsize=11,
    )
    if not shown:
        ax.text(0.5, 0.5, "no segments: the allocator held no memory", ha="center", va="center", transform=ax.transAxes)
    legend = [
        Patch(color=COLOURS[LIVE], label="live block"),
        Patch(color=COLOURS[PENDING], label="pending free (other stream)"),
        Patch(color=COLOURS["stranded"], label="free, pinned by a live block"),
        Patch(color=COLOURS[FREE], label="free, releasable"),
    ]
    if any(state == MIXED for seg in shown for _, _, state in seg["layout"]):
        legend.append(Patch(color=COLOURS[MIXED], label="rest of a segment in more pieces than drawn"))
    ax.legend(handles=legend, loc="lower right", fontsize=9, framealpha=0.9)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def _draw_timeline(plt, result: dict, path: Path) -> Path:
    """Allocated and reserved MiB per recorded event; the gap between them is the allocator's cache."""
    tl = result["timeline"]
    fig, ax = figure(plt, 4.4)
    x = tl["index"]
    reserved = [v / MIB for v in tl["reserved"]]
    allocated = [v / MIB for v in tl["allocated"]]
    ax.step(x, reserved, where="post", label="reserved", color="#ff7f0e")
    ax.step(x, allocated, where="post", label="allocated", color="#1f77b4")
    if x:
        ax.fill_between(
            x, allocated, reserved, step="post", color="#ff7f0e", alpha=0.15, linewidth=0, label="cached: reserved, not allocated"
        )
    budget = result.get("budget_bytes")
    if budget:
        ax.axhline(budget / MIB, color="black", linestyle="--", linewidth=1, label=f"budget {format_bytes(budget)}")
    request = result["oom"].get("failed_request")
    for i, oom_at in enumerate(tl["oom_indices"]):
        # One legend entry, on the last OOM: the one whose request the result describes.
        label = f"OOM (asked for {format_bytes(request)})" if i == len(tl["oom_indices"]) - 1 and request else None
        ax.axvline(oom_at, color="#d62728", linewidth=1.5, label=label)
    ax.set_xlabel("allocator event (position in the recorded history)")
    ax.set_ylabel("MiB")
    title = "Allocated and reserved memory over the run"
    if tl["starts_mid_run"]:
        title += f" (history starts mid-run: last {tl['events']} events)"
    ax.set_title(title, fontsize=12)
    if tl["events"] == 0:
        ax.text(0.5, 0.5, "no allocation history was recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    # Under the axes, not on them: a run's memory climbs from the left, where a legend inside would cover it.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=9, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)
