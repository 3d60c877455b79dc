"""The course site's pictures, drawn by the workflow's own tools from real GPU runs.

``oomlab dev figures`` runs each exercise's tool (the step it teaches) on its
seeded bug and on the reference fix, and copies the pictures, the findings and
any allocator snapshot (for PyTorch's own viewer) into ``course/figures/``, with
``figures.json`` listing them. It also sets the bug and the fix side by side
with ``oomlab compare`` (``compares`` in ``figures.json``, ``ID-compare.png``):
what the fix changed, by line and by holder. Nothing in there is drawn or typed
by hand, and no path of the machine that drew it is in there.

``figures.json`` holds data, not prose to be read back: a page renders the words
itself, sizes with :func:`oomlab.units.format_bytes`. Besides ``created``, ``gpu``
and ``torch``:

- ``figures``, one entry per exercise and side (``ID-bug``, ``ID-fix``): the
  ``exercise``, the ``variant``, the ``tool`` (the exercise's step), its ``kind``
  and ``headline`` (its finding, as it printed it), ``failure`` (the profile
  tool's, where the run failed in a profiled step: ``live_bytes``, what was live
  at the last allocation that succeeded, ``request_bytes``, what the failed one
  asked for, and ``time_ms``; None otherwise), the run's ``wall_s``, the
  pictures' ``files``, and ``snapshot`` (the pickle kept for PyTorch's viewer, or
  None, with ``snapshot_left_out`` saying why);
- ``compares``, one entry per exercise: what
  :func:`oomlab.tools.compare.analysis.shareable` keeps of the comparison, with
  its ``exercise`` and its picture's ``files``.
"""

from __future__ import annotations

import dataclasses
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
from oomlab.tools.compare import analysis as compare_analysis
from oomlab.tools.compare import present as compare_present
from oomlab.tools.compare.sides import side_from_run
from oomlab.tools.run import exercise_target, run_tool
from oomlab.units import MIB, format_bytes

# A longer run records a larger history (a day of the inference worker's traffic: about 80 MiB).
# Pictures show such a run as well; a download that size is not worth its weight in the repository.
SNAPSHOT_LIMIT_BYTES = 5 * MIB
COMPARED_BY = ("snapshot", "hunt")  # the runs `oomlab compare` reads of each side
COMPARE_TOP = 5  # sites listed each way on a page


def regenerate(
    course, out: Path, note: Callable[[str], None] = lambda _: None, jobs: int = 1, only: list[str] | None = None
) -> list[Path]:
    """Run every exercise's tools on its bug and its fix, ``jobs`` at a time, and copy what they drew into ``out``.

    ``only``: run these exercises' tools alone, and keep the other exercises' entries of the ``figures.json``
    already in ``out`` (an exercise added or edited need not redraw the whole course's pictures).

    Each exercise's own tool draws its pictures; the snapshot and the hunt of
    both sides (the tool's own run where it is one of them) feed the comparison.
    Each run is a fresh process under its exercise's budget, as a learner's
    would be (never forked from a warm server, whose frames would show in the
    snapshots), so runs side by side change no figure.
    """
    out.mkdir(parents=True, exist_ok=True)
    index = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "figures": {}, "compares": {}}
    # An estimate exercise runs nothing on the GPU: it has no tool to draw (make promote names it all the same).
    chosen = [ex for ex in ([course.get(i) for i in only] if only else course.exercises) if not ex.is_estimate]
    runs = []
    for ex in chosen:
        bug = Variant(ex, "bug", "bug", frozenset({ex.symptom}), lambda bug, sol, ex: bug).script()
        for variant, script, shown in (("bug", bug, ex.learner_path), ("fix", ex.solution_path, ex.solution_path)):
            target = exercise_target(ex, script=script, shown_as=shown)
            for name in dict.fromkeys((step(ex.step).name, *COMPARED_BY)):
                runs.append((ex, variant, name, target))

    def run(item) -> tuple:
        ex, variant, name, target = item
        note(f"{name} on {ex.id} ({variant})…")
        options = step(name).figure_options if name == step(ex.step).name else step(name).options
        return run_tool(target, name, StateDir(course.root).figure_run(ex.id, variant) / name, options)

    with warm.fresh_only(), ThreadPoolExecutor(max(1, jobs)) as pool:
        measured = {(ex.id, variant, name): done for (ex, variant, name, _), done in zip(runs, pool.map(run, runs), strict=True)}
    targets = {(ex.id, variant): target for ex, variant, _, target in runs}
    written: list[Path] = []
    for ex in chosen:
        for variant in ("bug", "fix"):
            m, _ = measured[(ex.id, variant, step(ex.step).name)]
            index.setdefault("gpu", m.gpu)
            index.setdefault("torch", m.torch)
            index["figures"][f"{ex.id}-{variant}"] = tool_figures(ex, variant, measured, out, written)
        index["compares"][ex.id] = comparison(
            ex, measured, targets, StateDir(course.root).figure_run(ex.id, "compare"), out, written
        )
    if only:
        index = kept_beside(index, out / "figures.json", [ex.id for ex in course.exercises])
    write_atomic(out / "figures.json", json.dumps(index, indent=2) + "\n")
    return [*written, out / "figures.json"]


def kept_beside(index: dict, earlier_path: Path, course_ids: list[str]) -> dict:
    """``index`` (some exercises drawn now) with the entries of the ``figures.json`` at ``earlier_path`` of the
    course's other exercises, in course order; an exercise the course no longer has is left out."""
    earlier = json.loads(earlier_path.read_text(encoding="utf-8")) if earlier_path.is_file() else {}
    merged = dict(index)
    order = {ex: i for i, ex in enumerate(course_ids)}
    for key in ("figures", "compares"):
        entries = {**{k: v for k, v in earlier.get(key, {}).items() if v.get("exercise") in order}, **index[key]}
        merged[key] = dict(sorted(entries.items(), key=lambda kv: (order[kv[1]["exercise"]], kv[0])))
    return merged


def tool_figures(ex, variant: str, measured: dict, out: Path, written: list[Path]) -> dict:
    """The exercise's own tool on one side: its pictures (and, for the snapshot, the snapshot itself) copied into ``out``."""
    tool = step(ex.step)
    m, result = measured[(ex.id, variant, tool.name)]
    files = []
    for picture in presenter(tool.name).draw(result, Path(result["out_dir"])):
        dest = out / f"{ex.id}-{variant}-{picture.name}"
        shutil.copyfile(picture, dest)
        files.append(dest.name)
        written.append(dest)
    kept, left_out = None, None
    snapshot = Path(result["out_dir"]) / "snapshot.pickle"
    if tool.name == "snapshot" and snapshot.is_file():  # readers can open it in PyTorch's own viewer
        kept, left_out = keep_snapshot(snapshot, out / f"{ex.id}-{variant}-snapshot.pickle")
        if kept:
            written.append(out / kept)
    return {
        "exercise": ex.id,
        "variant": variant,
        "tool": tool.name,
        "kind": result.get("kind"),
        "headline": result.get("headline"),  # the finding as the tool printed it, quoted on the page
        # The figures a page reads are the tool's own data, never read back out of the headline's words.
        "failure": result.get("failure"),
        "wall_s": m.wall_s,
        "files": files,
        "snapshot": kept,
        "snapshot_left_out": left_out,
    }


def comparison(ex, measured: dict, targets: dict, folder: Path, out: Path, written: list[Path]) -> dict:
    """``oomlab compare`` of the exercise's bug (A) and fix (B), from their snapshot and hunt runs; its picture into ``out``."""
    bug, fix = (
        side_from_run(
            dataclasses.replace(targets[(ex.id, variant)], label=label),
            *(measured[(ex.id, variant, name)][1] for name in COMPARED_BY),
        )
        for variant, label in (("bug", ex.id), ("fix", f"{ex.id}-fix"))
    )
    compared = compare_analysis.compare(bug, fix, COMPARE_TOP)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for picture in compare_present.draw(compared, folder):
        dest = out / f"{ex.id}-{picture.name}"
        shutil.copyfile(picture, dest)
        files.append(dest.name)
        written.append(dest)
    # What of the result may leave this machine is the compare tool's to say: no list of its keys is kept here.
    return {"exercise": ex.id, **compare_analysis.shareable(compared, holders=COMPARE_TOP), "files": files}


def keep_snapshot(snapshot: Path, dest: Path) -> tuple[str | None, str | None]:
    """Copy the snapshot to ``dest`` if it is small enough to ship: ``(file name, None)``, or ``(None, why not)``."""
    size = snapshot.stat().st_size
    if size > SNAPSHOT_LIMIT_BYTES:
        dest.unlink(missing_ok=True)  # a copy from an earlier, shorter run would no longer match the pictures
        return None, f"{format_bytes(size)}, over the {format_bytes(SNAPSHOT_LIMIT_BYTES)} a download may take"
    shutil.copyfile(snapshot, dest)
    return dest.name, None
