"""Running the workflow's tools on a target: an exercise, or any ``script.py [args]``.

Each tool runs the target once in a fresh measuring process with its probe
(``oomlab/tools/<name>/probe.py``) around the script, then reads what the probe
wrote. ``diagnose`` runs every step's tool and :func:`oomlab.steps.fix_first`
says what to fix first.
"""

from __future__ import annotations

import difflib
import errno
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from oomlab.course import Course, find_root
from oomlab.course.manifest import Exercise
from oomlab.course.state import NAME, StateDir, make_folder, remove_empty_folders, require_readable, shown, write_error
from oomlab.errors import OomLabError
from oomlab.measure.harness import MACHINE_PROBLEMS, Measurement, measure
from oomlab.measure.machine import machine_error, refuse_without_a_driver
from oomlab.oom import first_line
from oomlab.steps import step
from oomlab.tools.base import run_summary
from oomlab.units import parse_size

__all__ = [
    "Target",
    "budget_option",
    "default_out_dir",
    "launcher_ranks",
    "path_kind",
    "resolve",
    "run_tool",
    "time_limit_option",
]

# The options of torchrun (torch.distributed.run) that a job on this one machine keeps: the rest place it on
# several machines or restart it, and a tool measures one run of the script.
RANKS_OPTIONS = ("--nproc-per-node", "--nproc_per_node")
ONE_MACHINE_OPTIONS = ("--standalone",)
ONE_NODE = ("--nnodes",)


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
    ranks: int = 0  # a torchrun job of this many ranks on this machine (oomlab.tools.ranks); 0: one process


def budget_option(text: str | None) -> int | None:
    """``--budget`` as bytes; None when not given (an empty ``--budget ''`` is an error, not "not given")."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as err:
        raise OomLabError(
            f"--budget: {shown(err, 200)}.", "Write it like 2GiB, 1.5GiB, 800MiB or a whole number of bytes."
        ) from None


def time_limit_option(seconds: float | None) -> float | None:
    """``--time-limit`` in seconds; None when not given. Zero, negative, infinite or NaN is refused."""
    if seconds is None:
        return None
    if not math.isfinite(seconds) or seconds <= 0:
        raise OomLabError(
            f"--time-limit: {seconds:g} is not a positive number of seconds.",
            "Give the seconds a run may take, such as --time-limit 600, or leave it out for the default.",
        )
    return seconds


def path_kind(path: Path) -> str:
    """``"file"``, ``"folder"`` or ``"missing"``; a path that cannot even be looked at is a clear error."""
    try:
        if path.is_dir():
            return "folder"
        return "file" if path.exists() else "missing"
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise OomLabError(
                f"{shown(path)} is too long to be a file name or an exercise id.",
                "Give an exercise id (oomlab list) or the path of a training script.",
            ) from None
        raise OomLabError(
            f"Cannot look at {shown(path)}: {err.strerror or err}.", "Check the path and its permissions."
        ) from None


def close_files(path: Path, pattern: str = "*.py") -> str:
    """For a mistyped file name: "Did you mean ...?", from the files beside it that match ``pattern``; else ""."""
    try:
        names = sorted(p.name for p in path.parent.glob(pattern) if p.is_file())
    except OSError:
        return ""
    close = difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)
    if not close:
        return ""
    shown_as = [str(path.parent / name) if str(path.parent) != "." else name for name in close]
    return f"Did you mean {' or '.join(shown_as)}? "


def files_in(folder: Path, pattern: str = "*.py", limit: int = 5) -> str:
    """The first few files in ``folder`` that match ``pattern``, for a message; "" when none or unreadable."""
    try:
        names = sorted(str(p) for p in folder.glob(pattern) if p.is_file())
    except OSError:
        return ""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def is_pickle(path: Path) -> bool:
    """A snapshot's name, or a pickle's first byte (protocol 2 and later): what no Python script starts with."""
    if path.suffix.lower() in (".pickle", ".pkl"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x80"
    except OSError:
        return False  # unreadable: the run says so


def _is_launcher(words: list[str]) -> int:
    """How many words name torch's launcher: ``torchrun`` (1), ``python -m torch.distributed.run`` (3), else 0."""
    if words and Path(words[0]).name == "torchrun":
        return 1
    if len(words) >= 3 and Path(words[0]).name.startswith("python") and words[1:3] == ["-m", "torch.distributed.run"]:
        return 3
    return 0


def launcher_ranks(words: list[str]) -> tuple[int, list[str]]:
    """``torchrun --nproc-per-node 2 train.py --lr 3e-4`` -> ``(2, ["train.py", "--lr", "3e-4"])``; ``(0, words)`` otherwise.

    Only what a job on this machine needs is taken: the number of ranks, ``--standalone``,
    and ``--nnodes 1``. An option that places the job on other machines, or any other, is refused
    with what to write instead: a tool runs the job once, here, and must not guess.
    """
    skip = _is_launcher(words)
    if not skip:
        return 0, words
    rest, ranks = list(words[skip:]), 1
    while rest and rest[0].startswith("-"):
        option, _, value = rest.pop(0).partition("=")
        if option in ONE_MACHINE_OPTIONS and not value:
            continue
        if option in RANKS_OPTIONS + ONE_NODE:
            if not value:
                if not rest:
                    raise OomLabError(f"{option} needs a value.", "Write it like --nproc-per-node 2, before the script.")
                value = rest.pop(0)
            if option in ONE_NODE:
                if value not in ("1", "1:1"):
                    raise OomLabError(
                        f"--nnodes {shown(value)}: oomlab runs a torchrun job on this machine only.",
                        "Run it with --nnodes 1 (or leave it out), and as many ranks as this machine takes.",
                    )
                continue
            if not value.isdigit() or not 1 <= int(value) <= 64:
                raise OomLabError(
                    f"--nproc-per-node {shown(value)}: give the number of ranks, from 1 to 64.",
                    "Write it like --nproc-per-node 2 (`oomlab doctor` says how many GPUs this machine has).",
                )
            ranks = int(value)
            continue
        raise OomLabError(
            f"torchrun's option {shown(option)} is not one oomlab takes: it runs the job once, on this machine.",
            "Keep --nproc-per-node N (and --standalone); put the script's own options after the script.",
        )
    if not rest:
        raise OomLabError("torchrun names no script.", "Write it like: oomlab hunt torchrun --nproc-per-node 2 train.py")
    return ranks, rest


def resolve(words: list[str], budget: str | None = None, time_limit_s: float | None = None) -> Target:
    """An exercise id (or number) runs that exercise's current file under its budget; a path runs that script.

    ``torchrun --nproc-per-node N script.py [args]`` (or ``python -m torch.distributed.run``)
    runs the script as a torchrun job of N ranks (:func:`launcher_ranks`), each under ``budget``.
    What the first word is (a folder, a script, a file that is missing, an exercise id) is
    settled before any course folder is looked for, so that the message names the real problem.
    """
    if not words:
        raise OomLabError("No target given.", "Name an exercise (oomlab list) or a script: oomlab snapshot train.py --lr 3e-4")
    ranks, words = launcher_ranks(list(words))
    first, rest = words[0], tuple(words[1:])
    budget_bytes = budget_option(budget)
    time_limit_s = time_limit_option(time_limit_s)
    path = Path(first)
    kind = path_kind(path)
    if kind == "folder":
        scripts = files_in(path)
        raise OomLabError(
            f"{shown(first)} is a folder, not a training script.",
            f"Give a script in it ({scripts})." if scripts else "Give the path of a Python training script, or an exercise id.",
        )
    if kind == "file" and is_pickle(path):
        raise OomLabError(
            f"{shown(first)} is a pickle (an allocator snapshot?), not a training script: this command runs a script.",
            f"`oomlab snapshot {shown(first)}` analyzes a snapshot, and `oomlab compare A B` sets two side by side.",
        )
    if kind == "file":
        return Target(
            script=path.resolve(),
            args=rest,
            budget_bytes=budget_bytes,
            alloc_conf="",
            time_limit_s=time_limit_s or 600,
            label=f"{path.stem}-ranks{ranks}" if ranks else path.stem,
            root=path.resolve().parent,
            ranks=ranks,
        )
    if first.endswith(".py") or "/" in first or os.sep in first or ranks:
        raise OomLabError(f"{shown(first)} does not exist.", f"{close_files(path)}Give the path of a Python training script.")
    try:
        root = find_root()
    except OomLabError:
        raise OomLabError(
            f"{shown(first)!r} is neither a file here nor an exercise: there is no OOM Lab course folder at or above "
            f"{shown(Path.cwd())} to look it up in.",
            f"{close_files(path.with_suffix('.py'))}Give the path of a training script, or run inside a course "
            "folder (`oomlab init my-course` makes one).",
        ) from None
    ex = Course(root, strict=False).get(first)
    if rest:
        raise OomLabError(f"An exercise takes no arguments; got {shown(' '.join(rest))}.", f"Run just: oomlab ... {ex.id}")
    return exercise_target(ex, budget_bytes, time_limit_s)


def exercise_target(
    ex: Exercise,
    budget_bytes: int | None = None,
    time_limit_s: float | None = None,
    script: Path | None = None,
    shown_as: Path | None = None,
) -> Target:
    """The learner's file of ``ex`` (or ``script``, named in shared files as ``shown_as``) under the exercise's settings."""
    if ex.is_estimate:
        raise OomLabError(
            f"{ex.id} is sized before anything runs: its {ex.file} computes estimate(config) and runs nothing on the GPU, "
            "so the tools have no run to look at.",
            f"`oomlab run {ex.id}` shows your estimate beside the CPU's count of the example configs; "
            f"`oomlab check {ex.id}` grades it.",
        )
    script = Path(script or ex.learner_path).resolve()
    display = Path(shown_as or script)
    return Target(
        script=script,
        args=(),
        budget_bytes=budget_bytes or ex.budget_bytes,
        alloc_conf=ex.alloc_conf,
        time_limit_s=time_limit_s or 3 * ex.time_limit_s,  # the probes cost time too
        label=ex.id,
        exercise=ex,
        root=ex.root,
        shown_as={str(script): display.relative_to(ex.root).as_posix() if display.is_relative_to(ex.root) else display.name},
    )


def default_out_dir(label: str, tool: str) -> Path:
    """``.oomlab/runs/LABEL-TOOL`` of the course, or of the current folder for a script outside any course."""
    try:
        root = find_root()
    except OomLabError:
        root = Path.cwd()
    return StateDir(root).run(f"{label}-{tool}")


def run_tool(target: Target, tool: str, out_dir: Path | None = None, options: dict | None = None) -> tuple[Measurement, dict]:
    """Run ``target`` once with ``tool``'s probe; return the measurement and what the probe found.

    The folder is made for the run and removed again when the run leaves nothing in it.
    A torchrun job runs with :func:`run_tool_on_ranks` instead.
    """
    if target.ranks:
        raise ValueError(f"{target.label} is a torchrun job: run_tool_on_ranks runs it")
    out_dir = Path(out_dir or default_out_dir(target.label, tool))
    made = make_folder(out_dir)
    try:
        return _run_tool(target, tool, out_dir.resolve(), options)
    finally:
        remove_empty_folders(made)


def _clear_earlier_results(out_dir: Path, tool: str) -> None:
    """Results of an earlier run of the same tool would mislead: remove them, and check that the folder takes files.

    In oomlab's own folder (under ``.oomlab/``) every file goes; in a folder the user named, only the tool's
    result file, so that nothing of the user's is ever deleted.
    """
    own = NAME in out_dir.parts
    probe = out_dir / f".oomlab-write-test-{os.getpid()}"
    try:
        for old in out_dir.glob("*") if own else [out_dir / f"{tool}.json"]:
            if old.is_file():
                old.unlink()
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise write_error(out_dir, err, "write the results into") from None


def _probe_options(target: Target, options: dict | None) -> dict:
    return {
        "script": str(target.script),
        "budget_bytes": target.budget_bytes,
        "root": str(target.root or target.script.parent),
        "labels": dict(target.shown_as),
        **(options or {}),
    }


def _refuse_a_machine_problem(m: Measurement, target: Target) -> None:
    if m.status not in MACHINE_PROBLEMS:
        return
    if target.exercise:
        raise machine_error(m, target.exercise)
    raise OomLabError(
        f"The script could not be measured here: {m.message}.",
        "Tools need an NVIDIA GPU and a CUDA build of torch; `oomlab doctor` says what is missing.",
    )


def _run_tool(target: Target, tool: str, out_dir: Path, options: dict | None) -> tuple[Measurement, dict]:
    require_readable(target.script, "the script")
    _clear_earlier_results(out_dir, tool)
    refuse_without_a_driver(target.script, f"measuring {target.script.name}")  # bad arguments are named first
    m = measure(
        target.script,
        budget_bytes=target.budget_bytes,
        alloc_conf=target.alloc_conf,
        time_limit_s=target.time_limit_s,
        args=target.args,
        tool={"name": tool, "probe": step(tool).probe, "out_dir": str(out_dir), "options": _probe_options(target, options)},
        course_root=target.exercise.root if target.exercise else None,  # a script outside a course runs fresh
        settings_free=target.exercise is None or target.exercise.learner_settings,
    )
    _refuse_a_machine_problem(m, target)
    result_path = out_dir / f"{tool}.json"
    if m.status in ("missing", "syntax", "timeout", "crashed") or not result_path.is_file():
        if m.status == "missing" and target.exercise:
            todo = f"`oomlab reset {target.exercise.id}` puts the exercise's original back, then try again."
        elif target.exercise:
            todo = f"Fix the script so it runs (`oomlab run {target.exercise.id}` shows why), then try again."
        else:
            todo = f"Fix the script so it runs (`python {target.script.name}` shows why), then try again."
        raise OomLabError(
            f"{tool} could not analyze {target.script.name}: {m.ending()}" + (f" ({m.tool_error})" if m.tool_error else ""),
            todo,
        )
    result = json.loads(result_path.read_text(encoding="utf-8"))
    result.setdefault("budget_bytes", target.budget_bytes)
    result["out_dir"] = str(out_dir)
    result["run"] = run_summary(m)
    if (m.stats or {}).get("peak_allocated") == 0:
        ended = "finished" if m.status == "ok" else f"stopped ({m.ending()})"
        raise OomLabError(
            f"{target.script.name} {ended} without allocating any GPU memory: there is nothing to analyze.",
            "Does it put its tensors on the GPU (device='cuda')? Does it exit, or fail, before training starts?",
        )
    return m, result


def run_tool_on_ranks(
    target: Target, tool: str, out_dir: Path | None = None, options: dict | None = None, *, require_cuda: bool = True
) -> dict:
    """Run ``tool`` on every rank of the torchrun job ``target``; the view across the ranks, each rank's report in it.

    Each rank's report is ``OUT/rank<R>/<tool>.json``; the view is ``OUT/ranks.json``
    (:mod:`oomlab.tools.ranks`). ``require_cuda=False`` runs the job with no GPU (the tests, with gloo).
    """
    from oomlab.tools.ranks import run_ranks

    out_dir = Path(out_dir or default_out_dir(target.label, tool))
    made = make_folder(out_dir)
    try:
        require_readable(target.script, "the script")
        for folder in [out_dir, *sorted(out_dir.glob("rank[0-9]*"))]:
            _clear_earlier_results(folder, tool)
        if require_cuda:
            refuse_without_a_driver(target.script, f"measuring {target.script.name}")
        result = run_ranks(
            target, tool, step(tool).probe, out_dir.resolve(), _probe_options(target, options), require_cuda=require_cuda
        )
    finally:
        remove_empty_folders(made)
    for row in result["ranks"]:
        _refuse_a_machine_problem(Measurement(script=str(target.script), status=row["status"], message=row["message"]), target)
    if not result["reports"]:  # no rank's probe could report: what the job's end says is all there is
        hints = " ".join(f"{hint[0].upper()}{hint[1:]}." for hint in result.get("hints") or [])
        # The launcher's last words, past its rules of ===== and -----: why it stopped when no rank could start.
        launcher = [line for line in result["job"].get("launcher", "").splitlines() if line.strip(" =-")]
        said = f" (torchrun said: {first_line(launcher[-1])})" if launcher else ""
        raise OomLabError(
            f"{tool} could not analyze the torchrun job of {target.script.name}: no rank's probe wrote its report. "
            f"{result['headline'][0].upper()}{result['headline'][1:]}{said}",
            (hints + " " if hints else "")
            + f"Run it as `torchrun --nproc-per-node {target.ranks} {target.script.name}` to see each rank's output, "
            f"fix it, then try again. Each rank's end is in {Path(result['out_dir']) / 'ranks.json'}.",
        )
    return result
