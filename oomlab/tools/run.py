"""Running the workflow's tools on a target: an exercise, or any ``script.py [args]``.

Each tool runs the target once in a fresh measuring process with its probe
(graders/tools/<name>.py) around the script, then reads what the probe wrote.
``diagnose`` runs the three in the workflow's order and says what to fix first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from oomlab.course import Course, find_root
from oomlab.errors import OomLabError
from oomlab.measure.harness import MACHINE_PROBLEMS, Measurement, measure
from oomlab.course.manifest import Exercise

TOOLS = ("snapshot", "hunt", "profile")
KIB = 1 << 10
UNITS = {"": 1, "b": 1, "k": KIB, "kb": KIB, "kib": KIB, "m": KIB**2, "mb": KIB**2, "mib": KIB**2, "g": KIB**3, "gb": KIB**3, "gib": KIB**3}


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"1.5g"``, ``"800MiB"`` or plain bytes; K, M and G are binary (1024) multiples."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise OomLabError(f"{text!r} is not a memory size.", "Write it like 2GiB, 1.5GiB, 800MiB or a number of bytes.")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


@dataclass(frozen=True)
class Target:
    """What a tool runs: the script, its arguments, and the budget and settings to run it under."""

    script: Path
    args: tuple[str, ...]
    budget_bytes: int | None
    alloc_conf: str
    time_limit_s: float
    label: str
    exercise: Exercise | None = None


def resolve(words: list[str], budget: str | None = None, time_limit_s: float | None = None) -> Target:
    """An exercise id (or number) runs that exercise's current file under its budget; a path runs that script."""
    if not words:
        raise OomLabError("No target given.", "Name an exercise (oomlab list) or a script: oomlab snapshot train.py --lr 3e-4")
    first, rest = words[0], tuple(words[1:])
    path = Path(first)
    if first.endswith(".py") or path.is_file():
        if not path.is_file():
            raise OomLabError(f"{first} does not exist.", "Give the path of a Python training script.")
        return Target(
            script=path.resolve(),
            args=rest,
            budget_bytes=parse_size(budget) if budget else None,
            alloc_conf="",
            time_limit_s=time_limit_s or 600,
            label=path.stem,
        )
    ex = Course().get(first)
    if rest:
        raise OomLabError(f"An exercise takes no arguments; got {' '.join(rest)}.", f"Run just: oomlab ... {ex.id}")
    return Target(
        script=ex.learner_path,
        args=(),
        budget_bytes=parse_size(budget) if budget else ex.budget_bytes,
        alloc_conf=ex.alloc_conf,
        time_limit_s=time_limit_s or 3 * ex.time_limit_s,  # the probes cost time too
        label=ex.id,
        exercise=ex,
    )


def default_out_dir(target: Target, tool: str) -> Path:
    try:
        base = find_root() / ".oomlab" / "runs"
    except OomLabError:  # a script outside the course folder: keep the results beside the user
        base = Path.cwd() / "oomlab-runs"
    return base / f"{target.label}-{tool}"


def run_tool(target: Target, tool: str, out_dir: Path | None = None, options: dict | None = None) -> tuple[Measurement, dict]:
    """Run ``target`` once with ``tool``'s probe; return the measurement and what the probe found."""
    out_dir = (out_dir or default_out_dir(target, tool)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*"):
        if old.is_file():
            old.unlink()  # results of an earlier run of the same tool would mislead
    opts = {"script": str(target.script), "budget_bytes": target.budget_bytes, **(options or {})}
    m = measure(
        target.script,
        budget_bytes=target.budget_bytes,
        alloc_conf=target.alloc_conf,
        time_limit_s=target.time_limit_s,
        args=target.args,
        tool={"name": tool, "out_dir": str(out_dir), "options": opts},
    )
    if m.status in MACHINE_PROBLEMS:
        from oomlab.grading.verdict import machine_error

        raise machine_error(m, target.exercise) if target.exercise else OomLabError(
            f"The script could not be measured here: {m.message}.",
            "Tools need an NVIDIA GPU and a CUDA build of torch; `oomlab doctor` says what is missing.",
        )
    result_path = out_dir / f"{tool}.json"
    if m.status in ("missing", "syntax", "timeout", "crashed") or not result_path.is_file():
        from oomlab.cli.render import script_failure_text

        raise OomLabError(
            f"{tool} could not analyze {target.script.name}: {script_failure_text(m)}"
            + (f" ({m.tool_error})" if m.tool_error else ""),
            "Fix the script so it runs (`oomlab run` or python shows why), then try again.",
        )
    result = json.loads(result_path.read_text(encoding="utf-8"))
    result.setdefault("budget_bytes", target.budget_bytes)
    result["out_dir"] = str(out_dir)
    result["run"] = {
        "status": m.status,
        "where": m.where,
        "message": (m.message.splitlines() or [""])[0][:300],
        "wall_s": m.wall_s,
        "peak_allocated": (m.stats or {}).get("peak_allocated"),
    }
    if (m.stats or {}).get("peak_allocated") == 0:
        from oomlab.cli.render import script_failure_text

        ended = "finished" if m.status == "ok" else f"stopped ({script_failure_text(m)})"
        raise OomLabError(
            f"{target.script.name} {ended} without allocating any GPU memory: there is nothing to analyze.",
            "Does it put its tensors on the GPU (device='cuda')? Does it exit, or fail, before training starts?",
        )
    return m, result


# What each finding means for the fix, in the workflow's order of priority.
ADVICE = {
    "fragmentation": "Fix the allocation order first: long-lived tensors sit in segments that short-lived ones were freed from. "
    "Allocate what lives long early and in one piece (a preallocated buffer filled slice by slice).",
    "graph-leak": "Drop the references first: tensors kept past their step hold their autograd graphs. "
    "Run evaluation under torch.no_grad() and keep .item() or .detach() of what you log.",
    "container-leak": "Stop the growth first: a container keeps device tensors from every step.",
    "cycle": "Break the reference cycle (or call gc.collect()): memory waits for the cycle collector.",
    "transient-peak": "Cut the peak first: one operation briefly holds several copies of a large tensor. "
    "Use the fused operation (for a loss, F.cross_entropy on class indices) or process it in chunks.",
}
PRIORITY = ("fragmentation", "graph-leak", "cycle", "container-leak", "transient-peak")


def summarize(results: dict[str, dict]) -> dict:
    """One verdict from the three tools' findings: what to fix first, and why."""
    kinds = {name: r.get("kind", "none") for name, r in results.items()}
    first = next((k for k in PRIORITY if k in kinds.values()), None)
    source = next((name for name, kind in kinds.items() if kind == first), None)
    return {
        "fix_first": first,
        "found_by": source,
        "headline": results[source]["headline"] if source else "No structural problem found: the memory goes to the work itself.",
        "advice": ADVICE.get(first, "Nothing structural to fix: the memory is spent on the work the job has to do."),
        "findings": {name: {"kind": kinds[name], "headline": r.get("headline", "")} for name, r in results.items()},
        "then": "Tune hyperparameters (batch size, sequence length, precision) only after the structural fixes.",
    }
