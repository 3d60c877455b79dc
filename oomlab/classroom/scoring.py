"""How an exercise notebook scores, and the file its exercise cell writes: what the kernel needs, without nbformat.

A learner's kernel has oomlab but not necessarily nbgrader's parts; the cells
(:mod:`oomlab.classroom.cells`) read their scoring from here.

Every graded cell is worth :data:`POINTS_PER_CHECK` points, whatever the kind of exercise:

- a script exercise has one per memory check (:func:`memory_checks`), which earns its points on an honest run
  (:func:`honesty_checks`);
- an estimate exercise has one per part of what it sizes (:func:`oomlab.grading.estimates.parts_of`), which earns
  its points when that part is within its tolerance on every hidden config. A training step (five parts) is worth
  10 points, a generation (three) 6, as a script with five or three memory checks would be.

Both have the interview answer besides, marked by hand (:data:`ANSWER_POINTS`).
"""

from __future__ import annotations

from oomlab.course.manifest import Exercise
from oomlab.grading.checks import ALWAYS, CHECKS
from oomlab.grading.estimates import parts_of

__all__ = [
    "ANSWER_POINTS",
    "MAGIC",
    "POINTS_PER_CHECK",
    "grade_id",
    "graded",
    "graded_name",
    "honesty_checks",
    "magic_line",
    "memory_checks",
    "most_points",
    "script_name",
]

POINTS_PER_CHECK = 2  # a graded cell's points: a script's memory check, an estimate's part
ANSWER_POINTS = 2
MAGIC = "%%writefile"
# What a graded cell's nbgrader id starts with, by kind of exercise: the memory check or the part follows it.
GRADE_PREFIX = {"script": "check-", "estimate": "part-"}


def memory_checks(ex: Exercise) -> list[str]:
    """The exercise's checks that earn points (memory checks), in its manifest's order."""
    return [name for name in ex.checks if CHECKS[name].earns_points]


def honesty_checks(ex: Exercise) -> list[str]:
    """The checks every graded cell requires, hidden from the release: those every run gets, then the manifest's.

    They earn no points of their own, but a run that fails one earns no memory points either: they say whether
    it is still the same training job, measured untouched."""
    return list(ALWAYS) + [name for name in ex.checks if not CHECKS[name].earns_points and name not in ALWAYS]


def graded(ex: Exercise) -> list[str]:
    """What earns points, one graded cell each, in order: a script's memory checks, or an estimate's parts."""
    return list(parts_of(ex)) if ex.is_estimate else memory_checks(ex)


def grade_id(ex: Exercise, name: str) -> str:
    """The nbgrader id of the graded cell of ``name`` (one of :func:`graded`): ``check-no_oom``, ``part-peak``."""
    return GRADE_PREFIX[ex.kind] + name


def graded_name(cell_id: str) -> str:
    """The memory check or part a graded cell's id names (``part-peak`` -> ``peak``); another cell's id as it is."""
    for prefix in GRADE_PREFIX.values():
        if cell_id.startswith(prefix):
            return cell_id.removeprefix(prefix)
    return cell_id


def most_points(ex: Exercise) -> int:
    """What a notebook of ``ex`` is worth: every graded cell, and the interview answer."""
    return POINTS_PER_CHECK * len(graded(ex)) + ANSWER_POINTS


def script_name(ex_id: str) -> str:
    """The file an exercise cell writes, beside its notebook: one per exercise, since an assignment's notebooks share a folder."""
    return f"{ex_id}.py"


def magic_line(ex_id: str) -> str:
    """The exercise cell's first line: it writes the cell to the file that is measured."""
    return f"{MAGIC} {script_name(ex_id)}"
