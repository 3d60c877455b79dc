"""The hunt's result for people: the holders as a table, and one picture.

:func:`render` lists what holds the device memory (each storage counted once,
the culprit first), the verdict and the path to the culprit's largest tensor,
what was in flight when the script stopped, how much of the allocated memory
the holders explain and what stays unexplained, and what to do. :func:`draw` plots allocated memory after each optimizer step with the
culprit's share of the end, or, when no step ran, the largest holders. Both
read only the JSON result, so they work on a result from another machine.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from oomlab.tools.base import figure, pyplot, save_figure
from oomlab.tools.hunt.analysis import IN_FLIGHT, TOOL, advice
from oomlab.tools.hunt.state import STATE
from oomlab.units import MIB, format_bytes, in_mib

__all__ = ["draw", "render"]


# --------------------------------------------------------------------------- terminal


def render(result: dict) -> list:
    """The holders as a table, the headline, what the holders leave unexplained, and what it means."""
    from rich.text import Text

    out: list = []
    if result.get("error"):
        out.append(Text(f"hunt failed: {result['error']}", style="bold red"))
    out.append(_holders_table(result))
    out.append(Text(result.get("headline", ""), style="bold"))
    if result.get("culprit_path"):
        out.append(Text(f"Held at: {result['culprit_path']}", style="bold red"))
    flight = _in_flight(result)
    if flight:
        out.append(Text(flight, style="dim"))
    accounted = _accounting(result)
    if accounted:
        out.append(Text(accounted))
    packed = (result.get("walk") or {}).get("packed_saved")
    if packed:
        out.append(
            Text(
                f"{packed} values saved for backward were packed by saved_tensors_hooks (activation checkpointing or "
                "offloading) and were not read: reading them would run those hooks. Their bytes are not in the figures.",
                style="yellow",
            )
        )
    out.append(Text(result.get("advice") or advice(result.get("kind", "")), style="italic"))
    return out


def _holders_table(result: dict):
    """One row per holder, largest first: the culprit in red, state and the call in flight dimmed."""
    from rich.table import Table

    table = Table(title="What holds device memory (each storage counted once)", title_justify="left")
    table.add_column("holder (what / where)", overflow="fold")
    table.add_column("MiB", justify="right")
    table.add_column("tensors", justify="right")
    table.add_column("graphs", justify="right")
    table.add_column("largest contributor", overflow="fold")
    table.add_column("note", overflow="fold")
    holders = list(result.get("holders", []))
    holders.sort(key=lambda h: not str(h.get("label", "")).startswith("culprit"))  # the culprit first, the rest by size
    for h in holders:
        note = [h.get("label", "")]
        if h.get("graph_bytes"):
            note.append(f"{format_bytes(h['graph_bytes'])} saved by graphs")
        if h.get("state_bytes") and h.get("label") != STATE:
            note.append(f"{format_bytes(h['state_bytes'])} {STATE}")
        if (h.get("grew_bytes") or 0) > 0:
            note.append(f"grew {format_bytes(h['grew_bytes'])} since step {result.get('baseline_step')}")
        if str(h.get("label", "")).startswith("culprit"):
            style = "bold red"
        else:
            style = "dim" if h.get("label") in (STATE, IN_FLIGHT) else ""
        table.add_row(
            h.get("what") or h["name"],
            in_mib(h["bytes"]),
            f"{h.get('tensors', 0)}" + (f" + {h['saved_tensors']} saved" if h.get("saved_tensors") else ""),
            str(h.get("graphs", 0)),
            h.get("largest_path", ""),
            "; ".join(n for n in note if n),
            style=style,
        )
    return table


def _in_flight(result: dict) -> str:
    """What the call that was running held, said as the step's own: "" when it held nothing."""
    held = [h for h in result.get("holders", []) if h.get("label") == IN_FLIGHT]
    total = sum(h["bytes"] - h.get("state_bytes", 0) for h in held)
    if total < MIB:
        return ""
    return (
        f"In flight: {format_bytes(total)} belongs to the call that was running when the script stopped "
        f"({'; '.join(h.get('what') or h['name'] for h in held[:3])}). That is the step's own work, "
        "alive until the step ends, not memory kept from earlier steps."
    )


def _accounting(result: dict) -> str:
    """How much of the allocated memory the holders explain, and what stays unexplained; "" off a GPU."""
    allocated, explained = result.get("allocated_bytes"), result.get("explained_bytes") or 0
    if not allocated:
        return ""
    line = (
        f"The holders explain {format_bytes(explained)} of the {format_bytes(allocated)} allocated "
        f"({100 * explained / allocated:.0f}%)"
    )
    unnamed = [row for row in result.get("unexplained", []) if row["bytes"] > MIB]
    for row in unnamed[:3]:
        line += f"; {format_bytes(row['bytes'])} in {row['storages']} storage(s) is held by {row['owner']}"
    rest = allocated - explained - sum(row["bytes"] for row in result.get("unexplained", []))
    if rest > MIB:
        line += (
            f"; {format_bytes(rest)} is held by no Python object at all (temporaries inside the failing operation, "
            "gradients a backward pass was computing, or C++-only owners)"
        )
    reserved = result.get("reserved_bytes")
    if reserved and reserved - allocated > MIB:
        line += f"; another {format_bytes(reserved - allocated)} is reserved by the allocator but allocated to nothing"
    return line + "."


# --------------------------------------------------------------------------- picture


def draw(result: dict, out_dir: Path) -> list[Path]:
    """``hunt.png``: allocated MiB after each optimizer step (culprit in the title), else the top holders."""
    plt = pyplot()
    fig, ax = figure(plt, 4.6)
    if result.get("steps"):
        title = _draw_steps(ax, result)
    else:
        title = _draw_holders(ax, result)
    ax.set_title("\n".join([title] + textwrap.wrap(result.get("headline", ""), 120)), fontsize=10, loc="left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return [save_figure(fig, Path(out_dir) / f"{TOOL}.png")]


def _draw_steps(ax, result: dict) -> str:
    """Allocated memory after each step, then when the script stopped, with the culprit's share in red."""
    steps = result["steps"]
    allocated, culprit_bytes = result.get("allocated_bytes"), result.get("culprit_bytes") or 0
    xs = list(range(1, len(steps) + 1))
    ax.plot(xs, [s / MIB for s in steps], marker="o" if len(steps) <= 60 else None, label="allocated after the step")
    if allocated is not None:
        end = len(steps) + 1
        ax.scatter([end], [allocated / MIB], color="black", zorder=3, label="allocated when the script stopped")
        if culprit_bytes:
            # The culprit's share of the final figure, as a red bar ending at it.
            ax.bar(
                [end],
                [culprit_bytes / MIB],
                bottom=[(allocated - culprit_bytes) / MIB],
                width=0.4,
                color="tab:red",
                alpha=0.7,
                label=f"held by the culprit ({format_bytes(culprit_bytes)})",
            )
    ax.set_xlabel("optimizer step (the last point: when the script stopped)")
    ax.set_ylabel("allocated (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    return "Allocated device memory after each optimizer step"


def _draw_holders(ax, result: dict) -> str:
    """The ten largest holders as stacked bars (direct, saved by graphs, state) against allocated and reserved."""
    top = list(result.get("holders", []))[:10][::-1]
    names = [textwrap.shorten(h.get("what") or h["name"], 60) for h in top]
    direct = [h.get("direct_bytes", 0) / MIB for h in top]
    graph = [h.get("graph_bytes", 0) / MIB for h in top]
    state = [h.get("state_bytes", 0) / MIB for h in top]
    ax.barh(names, direct, label="tensors held directly")
    ax.barh(names, graph, left=direct, label="saved by autograd graphs")
    ax.barh(names, state, left=[d + g for d, g in zip(direct, graph, strict=True)], label=STATE, color="lightgrey")
    for key, style in (("allocated", "-"), ("reserved", "--")):
        value = result.get(f"{key}_bytes")
        if value:
            ax.axvline(value / MIB, color="black", linestyle=style, linewidth=1, label=f"{key} ({format_bytes(value)})")
    ax.set_xlabel("held (MiB)")
    ax.legend(loc="lower right")
    return "What holds device memory when the script stopped (each storage counted once)"
