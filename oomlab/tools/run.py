"""Running the workflow's tools on a target: an exercise, or any ``script.py [args]``.

Each tool runs the target once in a fresh measuring process with its probe
(``oomlab/tools/<name>/probe.py``) around the script, then reads what the probe
wrote. ``diagnose`` runs every step's tool and :func:`oomlab.steps.fix_first`
says what to fix first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from oomlab.course import Course, find_root
from oomlab.course.manifest import Exercise
from oomlab.course.state import StateDir
from oomlab.errors import OomLabError
from oomlab.measure.harness import MACHINE_PROBLEMS, Measurement, measure
from oomlab.measure.machine import machine_error
from oomlab.oom import first_line
from oomlab.units import parse_size

__all__ = ["Target", "budget_option", "default_out_dir", "resolve", "run_tool"]


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
    root: Path | None = None  # the course folder, or the script's folder: paths in shared files are relative to it
    shown_as: dict = field(default_factory=dict, hash=False)  # absolute path -> the name shared files show


def budget_option(text: str | None) -> int | None:
    """``--budget`` as bytes; None when not given."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as err:
        raise OomLabError(f"--budget: {err}.", "Write it like 2GiB, 1.5GiB, 800MiB or a whole number of bytes.") from None


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
            budget_bytes=budget_option(budget),
            alloc_conf="",
            time_limit_s=time_limit_s or 600,
            label=path.stem,
            root=path.resolve().parent,
        )
    ex = Course().get(first)
    if rest:
        raise OomLabError(f"An exercise takes no arguments; got {' '.join(rest)}.", f"Run just: oomlab ... {ex.id}")
    return exercise_target(ex, budget_option(budget), time_limit_s)


def exercise_target(
    ex: Exercise,
    budget_bytes: int | None = None,
    time_limit_s: float | None = None,
    script: Path | None = None,
    shown: Path | None = None,
) -> Target:
    """The learner's file of ``ex`` (or ``script``, shown in shared files as ``shown``) under the exercise's settings."""
    script = Path(script or ex.learner_path).resolve()
    shown = Path(shown or script)
    return Target(
        script=script,
        args=(),
        budget_bytes=budget_bytes or ex.budget_bytes,
        alloc_conf=ex.alloc_conf,
        time_limit_s=time_limit_s or 3 * ex.time_limit_s,  # the probes cost time too
        label=ex.id,
        exercise=ex,
        root=ex.root,
        shown_as={str(script): shown.relative_to(ex.root).as_posix() if shown.is_relative_to(ex.root) else shown.name},
    )


def default_out_dir(target: Target, tool: str) -> Path:
    """``.oomlab/runs/LABEL-TOOL`` of the course, or of the current folder for a script outside any course."""
    try:
        root = find_root()
    except OomLabError:
        root = Path.cwd()
    return StateDir(root).run(f"{target.label}-{tool}")


def run_tool(target: Target, tool: str, out_dir: Path | None = None, options: dict | None = None) -> tuple[Measurement, dict]:
    """Run ``target`` once with ``tool``'s probe; return the measurement and what the probe found."""
    out_dir = (out_dir or default_out_dir(target, tool)).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*"):
        if old.is_file():
            old.unlink()  # results of an earlier run of the same tool would mislead
    opts = {
        "script": str(target.script),
        "budget_bytes": target.budget_bytes,
        "root": str(target.root or target.script.parent),
        "labels": dict(target.shown_as),
        **(options or {}),
    }
    m = measure(
        target.script,
        budget_bytes=target.budget_bytes,
        alloc_conf=target.alloc_conf,
        time_limit_s=target.time_limit_s,
        args=target.args,
        tool={"name": tool, "out_dir": str(out_dir), "options": opts},
    )
    if m.status in MACHINE_PROBLEMS:
        if target.exercise:
            raise machine_error(m, target.exercise)
        raise OomLabError(
            f"The script could not be measured here: {m.message}.",
            "Tools need an NVIDIA GPU and a CUDA build of torch; `oomlab doctor` says what is missing.",
        )
    result_path = out_dir / f"{tool}.json"
    if m.status in ("missing", "syntax", "timeout", "crashed") or not result_path.is_file():
        raise OomLabError(
            f"{tool} could not analyze {target.script.name}: {m.ending()}" + (f" ({m.tool_error})" if m.tool_error else ""),
            "Fix the script so it runs (`oomlab run` or python shows why), then try again.",
        )
    result = json.loads(result_path.read_text(encoding="utf-8"))
    result.setdefault("budget_bytes", target.budget_bytes)
    result["out_dir"] = str(out_dir)
    result["run"] = {
        "status": m.status,
        "where": m.where,
        "message": first_line(m.message),
        "wall_s": m.wall_s,
        "peak_allocated": (m.stats or {}).get("peak_allocated"),
    }
    if (m.stats or {}).get("peak_allocated") == 0:
        ended = "finished" if m.status == "ok" else f"stopped ({m.ending()})"
        raise OomLabError(
            f"{target.script.name} {ended} without allocating any GPU memory: there is nothing to analyze.",
            "Does it put its tensors on the GPU (device='cuda')? Does it exit, or fail, before training starts?",
        )
    return m, result
