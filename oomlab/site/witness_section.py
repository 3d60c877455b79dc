"""The witness on the measurements page: what the driver and the kernel saw of every run, and what watching cost.

From ``verify.json`` (each run's ``witness``: :func:`oomlab.grading.truth.witness_figures`)
and ``speed.json``'s ``witness`` row (:mod:`oomlab.bench.witness`). The figures
the witness's tolerances rest on are stated here, beside the tolerances
themselves (:mod:`oomlab.grading.checks`), so a reader can see the margin.
"""

from __future__ import annotations

from oomlab.grading.checks import CONTEXT_SLACK_MIB, SAMPLING_SLACK, WEIGHTS_RTOL
from oomlab.measure.witness import INTERVAL_S
from oomlab.units import format_bytes

__all__ = ["witness_section"]

WITNESS_CHECKS = {"driver", "cpu_time", "host_memory", "sandbox"}


def _runs(report: dict) -> list[tuple[str, dict, dict]]:
    """(exercise id, run, its reference's run) for every run of the report."""
    out = []
    for row in report.get("exercises", []):
        ref = row["solution"]
        for run in (
            row["solution"],
            row["buggy"],
            *row.get("wrong_fixes", []),
            *row.get("alternatives", []),
            *row.get("cheats", []),
        ):
            out.append((row["id"], run, ref))
    return out


def witness_section(report: dict | None, speed: dict | None) -> list[str]:
    md = ["## The witness {#the-witness}", ""]
    runs = [(ex, r, ref) for ex, r, ref in _runs(report or {}) if r.get("witness")]
    if not runs:
        return md + ["Not measured yet: `oomlab dev verify` on a CUDA GPU records what the witness saw of every run.", ""]
    samples = sorted(r["witness"]["samples"] for _, r, _ in runs if r["witness"].get("samples"))
    reading = sorted(r["witness"]["sample_ms_mean"] for _, r, _ in runs if r["witness"].get("sample_ms_mean") is not None)
    md += [
        "Each run above was watched by a supervisor that runs none of the script's code: it read the driver's figure "
        f"for the run every {INTERVAL_S * 1000:g} ms "
        + (
            f"(a median of {samples[len(samples) // 2]:,} readings a run, each taking {reading[len(reading) // 2]:.2f} ms) "
            if samples and reading
            else ""
        )
        + "and counted its CPU time and host memory through the kernel. What it saw of the runs that must pass, the "
        "reference fixes and the accepted alternatives, is what its tolerances are set from:",
        "",
    ]
    passing = [(ex, r, ref) for ex, r, ref in runs if r["kind"] in ("solution", "alternative") and r["verdict"] == "pass"]
    drift = [
        r["witness"]["context_at_end"] - ref["witness"]["context_at_end"]
        for _, r, ref in passing
        if r["witness"].get("context_at_end") is not None and (ref.get("witness") or {}).get("context_at_end") is not None
    ]
    distances = [r["witness"]["weights_distance"] for _, r, _ in passing if r["witness"].get("weights_distance") is not None]
    contexts = [r["witness"]["context_at_end"] for _, r, _ in passing if r["witness"].get("context_at_end") is not None]
    md += ["| What the witness compares | Over the runs that pass | Allowed |", "|---|---|---|"]
    if contexts:
        md.append(
            f"| The CUDA context at the end of a run (the driver's figure less reserved) | {format_bytes(min(contexts))} to "
            f"{format_bytes(max(contexts))}; at most {format_bytes(max(abs(d) for d in drift) if drift else 0)} from its "
            f"reference's | {CONTEXT_SLACK_MIB} MiB more than the reference's |"
        )
    md.append(
        "| The driver's peak against the allocator's peak reserved plus the context | as far as a sample misses "
        f"| {CONTEXT_SLACK_MIB} MiB above; below, {CONTEXT_SLACK_MIB} MiB and {SAMPLING_SLACK:.0%} of the peak |"
    )
    if distances:
        md.append(
            f"| The final weights, tensor by tensor (relative distance) | at most {max(distances):.1e} | {WEIGHTS_RTOL:g} |"
        )
    md += [""]
    caught = [(ex, r) for ex, r, _ in runs if r["kind"] == "cheat" and WITNESS_CHECKS & set(r.get("failed_checks") or [])]
    cheats = [r for _, r, _ in runs if r["kind"] == "cheat"]
    if cheats:
        md += [
            f"Of the {len(cheats)} cheats above, {len(caught)} failed a check only the witness or the sandbox can make "
            "(`driver`, `cpu_time`, `host_memory`, `sandbox`); the rest failed their exercise's own checks first.",
            "",
        ]
    md += _cost(speed)
    return md


def _cost(speed: dict | None) -> list[str]:
    row = (speed or {}).get("witness")
    if not row:
        return ["What watching costs is not timed yet: `oomlab dev bench --witness RUNS` times it.", ""]
    md = [
        f"What watching costs, from `speed.json` ({str(row.get('created', '?'))[:10]}): each reference fix run "
        f"{row['repeat']} times with the driver read and {row['repeat']} times without, forked from a warm server.",
        "",
        "| Exercise | Script, driver read | Script, not read | Readings | One reading | The supervisor's CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for ex_id, r in row["exercises"].items():
        w, wo = r["with"], r["without"]
        md.append(
            f"| {ex_id} | {w['script_wall_s']:.2f} s | {wo['script_wall_s']:.2f} s ({r['script_wall_overhead']:+.1%}) "
            f"| {w['samples']:,.0f} | {w['sample_ms_mean']:.2f} ms | {w['supervisor_cpu_s']:.2f} s |"
        )
    return md + [""]
