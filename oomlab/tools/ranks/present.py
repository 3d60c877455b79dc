"""The view across ranks for people: one row per rank, what differs, who failed first, and one picture.

:func:`render` gives the table (each rank's ending and why, its figures, its own finding), the
headline and the differences; :func:`focus` names the rank to read first: the first to fail,
else the one with the largest peak. :func:`draw` plots each rank's peaks side by side (``ranks.png``), where there
are figures (a job run with no GPU has none). Both read only ``ranks.json``.
"""

from __future__ import annotations

from pathlib import Path

from oomlab.tools.base import figure, pyplot, save_figure
from oomlab.tools.ranks.analysis import TOOL, held_at
from oomlab.units import MIB, format_bytes

__all__ = ["draw", "focus", "render"]

SHOWN = (("peak_allocated", "peak allocated"), ("peak_reserved", "peak reserved"), ("driver_peak", "driver"))


def measured(rows: list[dict]) -> list[tuple[str, str]]:
    """The figures of :data:`SHOWN` that some rank has (a job run without a GPU, or read from OOM reports, lacks some)."""
    return [(key, label) for key, label in SHOWN if any(isinstance(r.get(key), int) for r in rows)]


def focus(result: dict) -> int | None:
    """The rank to read first: the one that fell out of step, where the first to fail only waited for it; the first to
    fail; else the one with the largest peak reserved; else rank 0."""
    for key in ("out_of_step", "first_failure"):
        if result.get(key) is not None:
            return result[key]
    ranks = result.get("ranks") or []
    if not ranks:
        return None
    return max(ranks, key=lambda r: (r.get("peak_reserved") or 0, -r["rank"]))["rank"]


def finding(row: dict) -> str:
    """A rank's finding in a cell of the table: what it names and how much, where it names a holder (its whole
    sentence is the rank's own report, and the rank read first is shown in full above the table); else its headline."""
    if row.get("culprit"):
        size = f", {format_bytes(row['culprit_bytes'])}" if row.get("culprit_bytes") else ""
        kind = "held, not growing" if row.get("kind") == "held" else row.get("kind") or "found"
        return f"{row['culprit']}{size}{held_at(row)} ({kind})"
    return row.get("headline") or row.get("error") or "no report"


def render(result: dict) -> list:
    from rich.table import Table
    from rich.text import Text

    shown = measured(result["ranks"])
    # Every collective each rank issued, torch's own included: ranks out of step differ here at a glance.
    counted = any(isinstance(r.get("issued"), int) for r in result["ranks"])
    table = Table(title=f"{result['world_size']} ranks · {result.get('of') or 'run'}", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("ended")
    for _, label in shown:
        table.add_column(label, justify="right")
    if counted:
        table.add_column("collectives", justify="right")
    table.add_column("finding", overflow="fold")
    for row in result["ranks"]:
        style = "red" if row["rank"] == result.get("first_failure") else None
        issued = [str(row["issued"]) if isinstance(row.get("issued"), int) else "-"] if counted else []
        table.add_row(
            str(row["rank"]),
            row["why"] if row["why"] != "failed first" else f"{row['ending']} (first)",
            *(format_bytes(row.get(key)) for key, _ in shown),
            *issued,
            finding(row),
            style=style,
        )
    out: list = [table, Text(result["headline"], style="bold")]
    for difference in result["differences"]:
        out.append(Text(f"  differs: {difference['text']}"))
    for hint in result.get("hints") or []:
        out.append(Text(hint, style="yellow"))
    return out


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``ranks.png``: each rank's peaks side by side; nothing when no rank has a figure."""
    rows = result["ranks"]
    shown = measured(rows)
    if not shown:
        return []
    plt = pyplot()
    fig, ax = figure(plt, 3.6)
    width = 0.8 / len(shown)
    for i, (key, label) in enumerate(shown):
        xs = [r["rank"] + (i - (len(shown) - 1) / 2) * width for r in rows]
        ax.bar(xs, [(r.get(key) or 0) / MIB for r in rows], width=width, label=label)
    ax.set_xticks([r["rank"] for r in rows], [f"rank {r['rank']}" for r in rows])
    ax.set_ylabel("MiB")
    ax.set_title(result["headline"][:140], fontsize=9, loc="left")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / f"{TOOL}.png")]
