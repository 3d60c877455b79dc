"""The course site's pictures, drawn by the workflow's own tools from real GPU runs.

``oomlab dev figures`` runs each exercise's tool (the step it teaches) on its
seeded bug and on the reference fix, and copies the pictures, the findings and
any allocator snapshot (for PyTorch's own viewer) into ``course/figures/``, with
``figures.json`` listing them. Nothing in there is drawn or typed by hand, and
no path of the machine that drew it is in there.
"""

from __future__ import annotations

import datetime
import json
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from oomlab.course.state import StateDir, write_atomic
from oomlab.grading.truth import Variant
from oomlab.measure import warm
from oomlab.steps import step
from oomlab.tools import presenter
from oomlab.tools.run import exercise_target, run_tool
from oomlab.units import MIB, format_bytes

# A longer run records a larger history (a day of the inference worker's traffic: about 80 MiB).
# Pictures show such a run as well; a download that size is not worth its weight in the repository.
SNAPSHOT_LIMIT_BYTES = 5 * MIB


def regenerate(course, out: Path, note: Callable[[str], None] = lambda _: None, jobs: int = 1) -> list[Path]:
    """Run every exercise's tool on its bug and its fix, ``jobs`` at a time, and copy what they drew into ``out``.

    Each run is a fresh process under its exercise's budget, as a learner's
    would be (never forked from a warm server, whose frames would show in the
    snapshots), so runs side by side change no figure.
    """
    out.mkdir(parents=True, exist_ok=True)
    index = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "figures": {}}
    runs = []
    for ex in course.exercises:
        bug = Variant(ex, "bug", "bug", frozenset({ex.symptom}), lambda bug, sol: bug).script()
        runs += [(ex, "bug", bug, ex.learner_path), (ex, "fix", ex.solution_path, ex.solution_path)]

    def run(item) -> tuple:
        ex, variant, script, shown = item
        tool = step(ex.step)
        note(f"{tool.name} on {ex.id} ({variant})…")
        target = exercise_target(ex, script=script, shown_as=shown)
        return run_tool(target, tool.name, StateDir(course.root).figure_run(ex.id, variant), tool.figure_options)

    with warm.fresh_only(), ThreadPoolExecutor(max(1, jobs)) as pool:
        measured = list(pool.map(run, runs))
    written = []
    for (ex, variant, _, _), (m, result) in zip(runs, measured, strict=True):
        tool = step(ex.step)
        index.setdefault("gpu", m.gpu)
        index.setdefault("torch", m.torch)
        files = []
        for picture in presenter(tool.name).draw(result, Path(result["out_dir"])):
            dest = out / f"{ex.id}-{variant}-{picture.name}"
            shutil.copyfile(picture, dest)
            files.append(dest.name)
            written.append(dest)
        snapshot = Path(result["out_dir"]) / "snapshot.pickle"
        kept, left_out = None, None
        if snapshot.is_file():  # readers can open it in PyTorch's own viewer
            kept, left_out = keep_snapshot(snapshot, out / f"{ex.id}-{variant}-snapshot.pickle")
            if kept:
                written.append(out / kept)
        index["figures"][f"{ex.id}-{variant}"] = {
            "exercise": ex.id,
            "variant": variant,
            "tool": tool.name,
            "kind": result.get("kind"),
            "headline": result.get("headline"),
            "wall_s": m.wall_s,
            "files": files,
            "snapshot": kept,
            "snapshot_left_out": left_out,
        }
    write_atomic(out / "figures.json", json.dumps(index, indent=2) + "\n")
    return [*written, out / "figures.json"]


def keep_snapshot(snapshot: Path, dest: Path) -> tuple[str | None, str | None]:
    """Copy the snapshot to ``dest`` if it is small enough to ship: ``(file name, None)``, or ``(None, why not)``."""
    size = snapshot.stat().st_size
    if size > SNAPSHOT_LIMIT_BYTES:
        dest.unlink(missing_ok=True)  # a copy from an earlier, shorter run would no longer match the pictures
        return None, f"{format_bytes(size)}, over the {format_bytes(SNAPSHOT_LIMIT_BYTES)} a download may take"
    shutil.copyfile(snapshot, dest)
    return dest.name, None
