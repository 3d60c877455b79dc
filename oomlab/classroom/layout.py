"""Where things live in a course folder that ``oomlab nbgrader build`` made.

A folder of nbgrader's own layout (``source/``, ``release/``, ``submitted/``,
``autograded/``, ``feedback/``, ``gradebook.db``) plus two things of ours:

- ``nbgrader_config.py``: nbgrader reads it from the folder it runs in, and
  only from there. ``build`` writes it once and never again: it is the
  instructor's. Its first line loads ``oomlab_config.py``, which ``build``
  writes every time: the settings the grading needs;
- ``oomlab-course/``: the exercises and their reference fixes as they were when
  the notebooks were built. Grading measures against this copy, so upgrading
  oomlab never changes what a class is graded against. It sits outside
  ``source/``, so nbgrader never releases the reference fixes to students.
"""

from __future__ import annotations

from pathlib import Path

from oomlab.course import CLASS_COPY
from oomlab.errors import OomLabError

CONFIG = "nbgrader_config.py"
OURS = "oomlab_config.py"
LOAD_OURS = f'load_subconfig("{OURS}")'
PINNED = CLASS_COPY  # the course the class is graded with, copied by the build
BUILT = ".oomlab-build.json"  # what build wrote, with hashes: a rebuild never overwrites an instructor's edit
EXERCISE_ROLE = "exercise"  # cell.metadata.oomlab.role of the one cell the learner edits


def class_root(start: Path | None = None) -> Path | None:
    """The course folder at or above ``start`` (the current folder): where nbgrader runs, or None.

    nbgrader executes a notebook in its submission's folder
    (``autograded/STUDENT/ASSIGNMENT/``), so the kernel finds its course by
    walking up; a learner's released notebook has none above it.
    """
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / CONFIG).is_file() and (folder / PINNED / "exercises").is_dir():
            return folder
    return None


def course_folder() -> Path:
    """:func:`class_root` of the current folder, or the error that says where to run instead."""
    root = class_root()
    if root is None:
        raise OomLabError(
            f"No course folder made by `oomlab nbgrader build` at or above {Path.cwd()}.",
            "Run this in the folder that `oomlab nbgrader build DIR` made (it holds nbgrader_config.py).",
        )
    return root
