"""The comparison for people: the figures side by side, what grew and shrank, and one picture.

:func:`render` gives the two sides' figures with the change, the allocation
sites that grew and shrank most (B minus A), and the holders when both sides
were hunted. :func:`draw` paints ``compare.png``: one horizontal bar per site,
its growth in red and its shrinkage in green. Both read only the JSON result,
so they work on a ``compare.json`` from another machine as well.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from oomlab.tools.base import figure, pyplot, save_figure
from oomlab.tools.compare.analysis import TOOL, signed_bytes
from oomlab.tools.snapshot.analysis import site_text
from oomlab.units import MIB, format_bytes, in_mib

__all__ = ["draw", "render"]

GREW, SHRANK = "#d62728", "#2ca02c"


# --------------------------------------------------------------------------- terminal


def render(result: dict) -> list:
    """Rich renderables: the headline, each side's ending, the figures, the sites each way, the holders, the notes."""
    from rich.text import Text

    a, b = result["sides"]["a"], result["sides"]["b"]
    out: list = [Text(result.get("headline", ""), style="bold")]
    for letter, side in (("A", a), ("B", b)):
        out.append(Text(f"{letter}: {side['label']} ({side['source']}, {side['ended']}): {side['headline']}", style="dim"))
    out.append(_figures_table(result, a, b))
    for rows, left_out, title in (
        (result["grown"], result["grown_left_out"], "Grew most: live bytes by allocation site, B minus A"),
        (result["shrunk"], result["shrunk_left_out"], "Shrank most: live bytes by allocation site, B minus A"),
    ):
        if rows:
            out.append(_sites_table(rows, title, a, b))
            if left_out:
                out.append(Text(f"... and {left_out} more sites (--top shows more).", style="dim"))
    if not result["grown"] and not result["shrunk"]:
        out.append(Text(f"No allocation site changed ({result['unchanged_sites']} alike on both sides)."))
    if result.get("holders"):
        out.append(_holders_table(result["holders"], a, b))
    for note in result.get("notes", []):
        out.append(Text(note, style="dim"))
    return out


def _figures_table(result: dict, a: dict, b: dict):
    from rich.table import Table

    table = Table(title="Allocator figures", title_justify="left", header_style="bold")
    table.add_column("figure")
    table.add_column(f"A: {a['label']}", justify="right")
    table.add_column(f"B: {b['label']}", justify="right")
    table.add_column("change", justify="right")
    table.add_column("what it means", style="dim")
    for row in result["figures"]:
        if row["bytes"]:
            cells = format_bytes(row["a"]), format_bytes(row["b"]), signed_bytes(row["change"])
        else:
            change = "n/a" if row["change"] is None else f"{row['change']:+,}"
            cells = tuple("n/a" if v is None else f"{v:,}" for v in (row["a"], row["b"])) + (change,)
        table.add_row(row["name"], *cells, row["meaning"])
    return table


def _sites_table(rows: list, title: str, a: dict, b: dict):
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("site", overflow="fold")
    table.add_column("function", style="dim")
    table.add_column("code", style="cyan", overflow="fold")
    table.add_column(f"A MiB ({a['label']})", justify="right")
    table.add_column(f"B MiB ({b['label']})", justify="right")
    table.add_column("change", justify="right")
    table.add_column("matched by", style="dim")
    for r in rows:
        table.add_row(
            r["site"],
            r["function"] or "",
            r["code"],
            in_mib(r["bytes_a"]),
            in_mib(r["bytes_b"]),
            signed_bytes(r["growth"]),
            r["matched_by"],
            style=GREW if r["growth"] > 0 else "",
        )
    return table


def _holders_table(rows: list, a: dict, b: dict):
    from rich.table import Table

    table = Table(title="By holder (the hunt's), B minus A", title_justify="left", header_style="bold")
    table.add_column("holder", overflow="fold")
    table.add_column(f"A MiB ({a['label']})", justify="right")
    table.add_column(f"B MiB ({b['label']})", justify="right")
    table.add_column("change", justify="right")
    table.add_column("path to its largest tensor", overflow="fold")
    table.add_column("the hunt's note (A / B)", style="dim", overflow="fold")
    for r in rows:
        labels = " / ".join(label or "-" for label in (r["label_a"], r["label_b"])) if r["label_a"] or r["label_b"] else ""
        table.add_row(r["holder"], in_mib(r["bytes_a"]), in_mib(r["bytes_b"]), signed_bytes(r["growth"]), r["path"], labels)
    return table


# --------------------------------------------------------------------------- picture


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``compare.png``: growth by allocation site, most grown at the top and most shrunk at the bottom."""
    plt = pyplot()
    rows = result["grown"] + result["shrunk"][::-1]
    fig, ax = figure(plt, max(3.2, 1.6 + 0.36 * len(rows)))
    names = [textwrap.shorten(site_text({"label": r["site"], "code": r["code"]}), 70, placeholder="…") for r in rows]
    changes = [r["growth"] / MIB for r in rows]
    positions = range(len(rows))
    ax.barh(positions, changes, color=[GREW if c > 0 else SHRANK for c in changes], height=0.7)
    for y, r in zip(positions, rows, strict=True):
        ax.annotate(
            f" {signed_bytes(r['growth'])} ",
            (r["growth"] / MIB, y),
            ha="left" if r["growth"] > 0 else "right",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(list(positions))
    ax.set_yticklabels(names, fontsize=8 if len(rows) > 14 else 9)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("change in live memory, B minus A (MiB)")
    a, b = result["sides"]["a"], result["sides"]["b"]
    allocated = next(f for f in result["figures"] if f["figure"] == "allocated")
    title = (
        f"Live memory by allocation site: A {a['label']} ({format_bytes(allocated['a'])}, {a['ended']}) "
        f"→ B {b['label']} ({format_bytes(allocated['b'])}, {b['ended']})"
    )
    # Over the whole figure, not the axes: the site labels on the left leave the axes too narrow for it.
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=10, x=0.01, ha="left")
    if rows:
        from matplotlib.patches import Patch

        ax.legend(
            handles=[Patch(color=GREW, label="grew in B"), Patch(color=SHRANK, label="shrank in B")],
            loc="lower right",
            fontsize=9,
        )
        left, right = ax.get_xlim()
        pad = 0.25 * max(abs(left), abs(right))  # room for the labels beside the longest bars
        ax.set_xlim(min(left, 0) - (pad if min(changes) < 0 else 0), max(right, 0) + (pad if max(changes) > 0 else 0))
    else:
        ax.text(0.5, 0.5, "no allocation site changed", ha="center", va="center", transform=ax.transAxes)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / f"{TOOL}.png")]
