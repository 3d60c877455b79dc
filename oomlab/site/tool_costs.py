"""What the tools cost outside the course, from ``speed.json``: the OOM hook in a training loop, the snapshot tool on a big snapshot.

Both rows are written by ``oomlab dev bench`` (``--oom-hook STEPS`` and
``--big-snapshot EVENTS``); the measurements page shows them under its speed
section. Each function returns Markdown lines, none when the row is missing.
"""

from __future__ import annotations

from oomlab.units import format_bytes

__all__ = ["big_snapshot_section", "oom_hook_section"]

LOOPS = {  # the loops of oomlab.bench.oom_hook, as a reader knows them
    "transformer": "a small transformer language model (the GPU sets the pace)",
    "mlp": "a small MLP (the host sets the pace)",
}


def oom_hook_section(row: dict | None, measured_on: str) -> list[str]:
    """The OOM hook's cost per training step, history on and off, and what writing the report took."""
    if not row:
        return []
    md = [
        "",
        "### What the OOM hook costs {#oom-hook-cost}",
        "",
        f"`with oom_report(...)` around two real training loops, {row['steps']} optimizer steps each, run "
        f"{row['repeat']} times in turn with each variant on {measured_on}: the loop alone, inside the hook without "
        f"history (`record_history=False`), and inside the hook as shipped (history with Python stacks, at most "
        f"{row['max_entries']:,} entries). Each step ends with `torch.cuda.synchronize()`; the figures are medians.",
        "",
        "| Loop | Step alone | History off | History on | Host memory the history took | GPU memory it took |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, loop in row["loops"].items():
        host = loop["history_on"].get("host_growth_bytes")
        md.append(
            f"| {LOOPS.get(name, name)} | {_step(loop['plain'])} "
            f"| {_step(loop['history_off'])}, {loop['overhead']['history_off']:+.1%} "
            f"| {_step(loop['history_on'])}, {loop['overhead']['history_on']:+.1%} "
            f"| {'' if host is None else format_bytes(host)} | {format_bytes(loop['history_gpu_bytes']['peak_reserved'])} |"
        )
    md += [
        "",
        "Each cell is the median step and, after p90, the step that 90% of steps beat: a change smaller than the "
        "spread between them is no cost that these runs can tell apart from chance.",
    ]
    at_oom = row.get("at_oom") or {}
    if at_oom:
        propagated = (
            "and the same `OutOfMemoryError` reached the caller"
            if at_oom.get("oom_propagated")
            else ("**and the error that reached the caller was not the OOM**")
        )
        md += [
            "",
            f"At the OOM, after a full run of the transformer with history on, writing the report took "
            f"{at_oom['report_s']:.2f} s ({format_bytes(at_oom['report_bytes'])} in {len(at_oom['files'])} files, of "
            f"which {format_bytes(at_oom.get('snapshot_bytes') or 0)} the snapshot), {propagated}.",
        ]
    return md


def _step(variant: dict) -> str:
    return f"{variant['median_step_ms']:.2f} ms (p90 {variant['p90_step_ms']:.2f})"


def big_snapshot_section(row: dict | None, measured_on: str) -> list[str]:
    """The snapshot tool's time and peak memory, phase by phase, on one big snapshot."""
    if not row:
        return []
    made = (
        f"recorded on {measured_on} by a workload that allocates from a Python call {row['depth']} frames deep"
        if row.get("source") == "cuda"
        else f"built to torch's format, with stacks {row['depth']} frames deep"
    )
    phases = (("load_s", "load (unpickle)"), ("analyze_s", "analyze"), ("render_s", "report"), ("draw_s", "pictures"))
    return [
        "",
        "### The snapshot tool on a big snapshot {#big-snapshot}",
        "",
        f"A snapshot of {row['events']:,} history events and {row['segments']:,} segments "
        f"({format_bytes(row['pickle_bytes'])} pickled), {made}, read the way `oomlab snapshot FILE.pickle` reads "
        "it, in a process of its own:",
        "",
        "| " + " | ".join(name for _, name in phases) + " | Peak memory of the process | Result |",
        "|" + "---:|" * (len(phases) + 2),
        "| "
        + " | ".join(f"{row[key]:.1f} s" for key, _ in phases)
        + f" | {format_bytes(row['peak_rss_bytes'])} | {format_bytes(row['result_json_bytes'])} of JSON |",
        *_before_reading(row),
    ]


def _before_reading(row: dict) -> list[str]:
    """How much of the peak the process had before it read the snapshot, where the row says."""
    before, peak = (row.get("rss_after") or {}).get("imports"), row["peak_rss_bytes"]
    if not before or peak <= before:
        return []
    return [
        "",
        f"Of the peak, {format_bytes(before)} is the process before it read anything (the interpreter and the libraries "
        f"it imports), so reading, analysing and drawing the snapshot took {format_bytes(peak - before)}.",
    ]
