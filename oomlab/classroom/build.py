"""``oomlab nbgrader build DIR``: an nbgrader course folder made from the exercise folders.

What it writes (:mod:`oomlab.classroom.layout` says where each lives):

- ``oomlab_config.py``: the course id, cell timeouts sized for GPU runs, a deleted
  graded cell put back, the preprocessor that grades only the exercise cell, and the
  kernel that imports nothing handed in with a submission;
  ``nbgrader_config.py``, the instructor's own, is written once, loading it;
- ``oomlab-course/``: the exercises and reference fixes, pinned, to grade against;
- ``source/MODULE/ID.ipynb``: one assignment per module, one notebook per exercise.

A rebuild (after an upgrade of oomlab) writes the same files again, and removes
those it no longer makes, but only where each is still as the last build wrote
it: a file an instructor edited stops the rebuild before anything is written, and
a folder that is not such a course is never written into. nbgrader's own files
(``gradebook.db``, ``release/``, ``submitted/``, ...) are never touched.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import nbformat

from oomlab import __version__
from oomlab.classroom.layout import BUILT, CONFIG, LOAD_OURS, OURS, PINNED
from oomlab.classroom.notebook import build_notebook
from oomlab.course import Course
from oomlab.course.manifest import Exercise
from oomlab.course.modules import MODULE_LIST
from oomlab.course.originals import shipped_source
from oomlab.course.shipped import shipped_root
from oomlab.course.state import NAME as STATE
from oomlab.course.state import read_error, shown, write_atomic
from oomlab.errors import OomLabError
from oomlab.grading import estimates
from oomlab.grading.truth import validate_exercise

__all__ = ["Built", "assignments", "build_course", "config_text", "instructor_config", "time_limit_s"]

COURSE_ID = "oomlab"
EXCHANGE = "exchange"  # nbgrader's exchange, beside the course (nbgrader_config.py)
# Starting a measuring process (importing torch on a cold disk can take a minute) on top of the script's own limit.
START_S = 60


@dataclass(frozen=True)
class Built:
    root: Path
    assignments: dict[str, list[str]]  # assignment (module) -> exercise ids, in teaching order
    written: int
    removed: int


def assignments(course: Course) -> dict[str, list[Exercise]]:
    """One assignment per module that has exercises, named after it, in teaching order."""
    chosen = {m.name: [e for e in course.exercises if e.module == m] for m in course.modules}
    return {name: exercises for name, exercises in chosen.items() if exercises}


def instructor_config() -> str:
    """``nbgrader_config.py`` as the first build writes it: it loads ours, and the rest is the instructor's."""
    return f"""# nbgrader's configuration for this course: yours to edit. nbgrader reads it from the folder it runs in and
# from nowhere else, so run every nbgrader command here.
c = get_config()  # noqa: F821

# The settings OOM Lab's grading needs, which `oomlab nbgrader build` rewrites on every build. Keep this line;
# a setting of yours below it wins over the same setting there.
{LOAD_OURS}  # noqa: F821

# Where release_assignment puts assignments and collect finds submissions: the folder {EXCHANGE}/ beside this
# file, which the build made readable by all and writable by you alone. Left unset, nbgrader would create
# /usr/local/share/nbgrader/exchange writable by every user of the machine. Students name the same folder
# (nbgrader fetch_assignment ... --Exchange.root=PATH); for students on other accounts, let them write to
# its inbound/ folder, or set a shared exchange here on purpose.
import os  # noqa: E402

c.Exchange.root = os.path.join(os.path.dirname(os.path.abspath(globals().get("__file__", "nbgrader_config.py"))), "{EXCHANGE}")

# zip_collect: which student and notebook a file handed in by other means is. Files named STUDENT--NOTEBOOK.ipynb,
# as they are or in zips, under downloaded/ASSIGNMENT/archive/, go to submitted/STUDENT/ASSIGNMENT/NOTEBOOK.ipynb.
# Without a pattern nbgrader collects nothing; change it to the names your learning platform gives downloads.
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[^/]+?)--(?P<file_id>[^/]+\\.ipynb)$"
"""


def time_limit_s(ex: Exercise) -> float:
    """How long the measuring cell of ``ex`` may run, before processes start: a script's run, or an estimate's grading."""
    return estimates.TIME_LIMIT_S if ex.is_estimate else ex.time_limit_s


def config_text(course: Course) -> str:
    """``oomlab_config.py``, with the timeouts this course's exercises need."""
    limit = max(time_limit_s(e) for e in course.exercises)
    timeout = int(2 * (limit + START_S))
    order = ", ".join(assignments(course))
    return f'''# The nbgrader settings OOM Lab's grading needs, written by `oomlab nbgrader build` (oomlab {__version__}) on
# every build: edit nbgrader_config.py instead, which loads this file.
# Assignments, one per module, in teaching order: {order}.
import os
import sys
import tempfile

from oomlab.classroom.autograde_guard import refuse_autograde_without_a_gpu

c = get_config()  # noqa: F821

# Plain `nbgrader autograde` on a machine that cannot measure would record 0 for every student as if graded: it
# stops here instead, before nbgrader opens the gradebook (oomlab.classroom.autograde_guard.py).
refuse_autograde_without_a_gpu(sys.argv)

c.CourseDirectory.course_id = "{COURSE_ID}"

# `oomlab nbgrader autograde` runs several students' nbgrader at once. Over TCP each picks its kernel's ports
# by asking the system for free ones and handing them on, so two kernels starting together can be handed the
# same port, and one of them never answers. Unix sockets named after this nbgrader process cannot collide.
if os.name == "posix":
    c.KernelManager.transport = "ipc"
    c.KernelManager.ip = os.path.join(tempfile.gettempdir(), f"oomlab-kernel-{{os.getpid()}}")

# The measuring cell runs the learner's script in a process of its own, or an estimator and then its configs' runs
# (the longest of these may take {limit:g} s), and, the first time on a GPU, the reference fix as well; each process
# takes up to {START_S} s more to start.
c.Execute.timeout = {timeout}
c.Execute.interrupt_on_timeout = True
# Once every cell has run, the kernel is stopped at once. Asked to shut down gracefully, an ipykernel before
# ipython/ipykernel#1518 may publish its last status on a socket that is closing, and print that race's
# traceback to the instructor's terminal; the kernel keeps nothing that the grades need.
c.Execute.shutdown_kernel = "immediate"

# Only the exercise cell's script is graded, in a process of its own (oomlab/classroom/preprocessors.py):
# after nbgrader restores the locked cells' sources, a locked or graded cell deleted from a submission is
# put back as released, and code cells a student added become raw cells, which nobody runs. No file beside
# the notebooks is graded: autograde writes each script from its exercise cell, and every other file handed
# in is left out of the folder the notebook is graded in, where the kernel could import it in place of the
# grader (a folder oomlab/classroom/cells.py whose checks all pass).
c.Autograde.sanitize_preprocessors = [
    "nbgrader.preprocessors.ClearOutput",
    "nbgrader.preprocessors.DeduplicateIds",
    "nbgrader.preprocessors.OverwriteKernelspec",
    "nbgrader.preprocessors.OverwriteCells",
    "oomlab.classroom.preprocessors.GradeOnlyTheExercise",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# nbgrader's own list, with its Execute replaced by one whose kernel has no folder of the submission's on
# sys.path, whatever appears there while the notebook is graded (oomlab/classroom/kernel.py). The Execute
# settings above apply to it.
c.Autograde.autograde_preprocessors = [
    "oomlab.classroom.kernel.GradingKernel",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
'''


def _planned(course: Course) -> dict[str, bytes]:
    """Every file the build writes, by its path in the course folder."""
    files = {OURS: config_text(course).encode(), ".gitignore": f"{PINNED}/{STATE}/\n".encode()}
    files[f"{PINNED}/exercises/{MODULE_LIST}"] = course.modules_file.read_bytes()  # the order and the modules
    for ex in course.exercises:
        # the notebooks' cells score the checks, or the parts, that the manifest names
        validate_exercise(ex)
        files[f"{PINNED}/exercises/{ex.id}/exercise.toml"] = ex.manifest_path.read_bytes()
        files[f"{PINNED}/exercises/{ex.id}/{ex.file}"] = shipped_source(ex).encode()
        files[f"{PINNED}/solutions/{ex.id}/{ex.file}"] = ex.solution_path.read_bytes()
    for module, exercises in assignments(course).items():
        for ex in exercises:
            files[f"source/{module}/{ex.id}.ipynb"] = nbformat.writes(build_notebook(ex)).encode() + b"\n"
    return files


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _record(dest: Path) -> dict[str, str] | None:
    """What the last build wrote (path -> hash), or None where no build wrote this folder."""
    path = dest / BUILT
    if not path.is_file():
        return None
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise OomLabError(
            f"{shown(path)} is damaged, so the build cannot tell which files it wrote; nothing was changed.",
            f"Build into a new folder (oomlab nbgrader build NEW-FOLDER), or delete {BUILT} after checking by hand "
            "that nothing in source/, oomlab-course/ or nbgrader_config.py is yours.",
        ) from None


def build_course(dest: Path) -> Built:
    """Write (or bring up to date) the nbgrader course folder ``dest``; see the module's docstring."""
    shipped = shipped_root()
    if shipped is None:
        raise OomLabError("This installation of oomlab carries no course.", "Reinstall it: pip install oomlab")
    course = Course(shipped, working_tree=True)  # the instructor's course as it is: a checkout's edits included
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and not dest.is_dir():
        raise OomLabError(f"{shown(dest)} exists and is not a folder.", "Name a new folder: oomlab nbgrader build my-class")
    record = _record(dest) if dest.is_dir() else None
    if record is None and dest.is_dir() and any(dest.iterdir()):  # nbgrader_config.py alone is no build either
        raise OomLabError(
            f"{shown(dest)} is not empty and is not a course that `oomlab nbgrader build` made; nothing was changed.",
            "Name a new or empty folder: oomlab nbgrader build my-class",
        )
    record = record or {}
    planned = _planned(course)
    edited = []
    for rel in sorted(set(planned) | set(record)):
        path = dest / rel
        if not path.is_file():
            continue
        try:
            now = _sha(path.read_bytes())
        except OSError as err:
            raise read_error(path, err, "a file of the course") from None
        if now != record.get(rel) and now != _sha(planned.get(rel, b"")):
            edited.append(rel)
    if edited:
        raise OomLabError(
            f"These files in {shown(dest)} were changed since the last build: {', '.join(edited)}. Nothing was changed.",
            "Move your edits out of the way (the build writes these files from the exercise folders), then build again.",
        )
    removed = 0
    for rel in sorted(set(record) - set(planned)):  # made by an earlier build, no longer made, unedited
        path = dest / rel
        if path.is_file():
            path.unlink()
            removed += 1
    for rel, data in planned.items():
        write_atomic(dest / rel, data)
    if not (dest / CONFIG).exists():
        write_atomic(dest / CONFIG, instructor_config())
    (dest / EXCHANGE).mkdir(mode=0o755, exist_ok=True)  # made here, so that nbgrader never makes it world-writable
    write_atomic(
        dest / BUILT,
        json.dumps({"oomlab": __version__, "files": {rel: _sha(data) for rel, data in sorted(planned.items())}}, indent=1) + "\n",
    )
    return Built(dest, {m: [e.id for e in exs] for m, exs in assignments(course).items()}, len(planned), removed)
