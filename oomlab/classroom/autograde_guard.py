"""What plain ``nbgrader autograde`` does first in this course, before nbgrader opens the gradebook.

The course's nbgrader settings (``oomlab_config.py``, written by ``oomlab nbgrader build``)
call :func:`before_autograde` when nbgrader starts:

- **No GPU, no grading.** Without one every measuring cell fails, and nbgrader would record 0
  points for every student as if they had been graded: ``nbgrader autograde`` stops with a
  message for the instructor instead. ``oomlab nbgrader autograde`` checks the machine itself
  first (it measures the reference fixes before anything else) and tells its own nbgrader runs
  so through :data:`CHECKED`, so that each of them need not import torch again.
- **An unreadable notebook is set aside**, as ``NAME.ipynb.unreadable``: nbgrader fails on a file
  that is not a notebook and drops the student's whole assignment, with no feedback; set aside,
  it counts as missing (zero for that notebook alone), and the instructor is told whose and why.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from oomlab.measure.machine import why_no_gpu

CHECKED = "OOMLAB_GPU_CHECKED"
UNREADABLE = ".unreadable"  # the suffix an unreadable notebook is kept under


def refuse_autograde_without_a_gpu(argv: list[str]) -> None:
    """Stop ``nbgrader autograde`` (``argv`` as nbgrader got it) with the instructor's message where nothing can be measured."""
    if argv[1:2] != ["autograde"] or os.environ.get(CHECKED) == "1":
        return
    if why := why_no_gpu():
        raise SystemExit(
            f"oomlab: nbgrader autograde stopped before grading anyone: {why}, so every measuring cell would fail and "
            "score 0. Nothing was graded and the gradebook is as it was. Grade the class on a machine with an NVIDIA "
            "GPU that fits the course's budgets (`oomlab doctor` there says whether it does)."
        )


def set_aside(path: Path) -> Path:
    """Keep the unreadable notebook ``path`` as ``NAME.ipynb.unreadable``, where nbgrader does not look; its new path."""
    aside = path.with_name(path.name + UNREADABLE)
    path.replace(aside)
    return aside


def unreadable(path: Path) -> str:
    """Why nbformat cannot read the notebook at ``path``, or "" when it can."""
    import nbformat

    try:
        nbformat.read(path, as_version=4)
    except Exception as err:  # noqa: BLE001 - not JSON, not a notebook, not UTF-8: nbformat raises each its own way
        return why_unreadable(err)
    return ""


def why_unreadable(err: Exception) -> str:
    """nbformat's error on reading a notebook, in one short line."""
    return f"{type(err).__name__}: {str(err)[:200]}"


def _assignment_and_students(argv: list[str]) -> tuple[str | None, list[str]]:
    """``nbgrader autograde ASSIGNMENT [--student S]...``: the assignment and the students named, as nbgrader reads them."""
    assignment, students, words = None, [], iter(argv[2:])
    for word in words:
        if word == "--student":
            students.append(next(words, ""))
        elif word.startswith("--student="):
            students.append(word.split("=", 1)[1])
        elif not word.startswith("-") and assignment is None:
            assignment = word
    return assignment, students


def set_aside_unreadable(argv: list[str], root: Path) -> list[str]:
    """Set aside every submitted notebook of the assignment that nbformat cannot read; what was set aside, and why."""
    assignment, students = _assignment_and_students(argv)
    submitted = root / "submitted"
    if assignment is None or not submitted.is_dir():
        return []
    told = []
    for folder in sorted(submitted.glob(f"*/{assignment}")):
        if students and folder.parent.name not in students:
            continue
        for path in sorted(folder.glob("*.ipynb")):
            if why := unreadable(path):
                set_aside(path)
                told.append(f"{folder.parent.name}'s {path.name} ({why}), kept as {path.name + UNREADABLE}: it scores 0")
    return told


def before_autograde(argv: list[str]) -> None:
    """Called from the course's nbgrader settings with nbgrader's ``argv``: both steps above, for ``autograde`` only."""
    if argv[1:2] != ["autograde"]:
        return
    refuse_autograde_without_a_gpu(argv)
    for line in set_aside_unreadable(argv, Path.cwd()):
        print(f"oomlab: set aside the unreadable notebook {line}", file=sys.stderr)
