"""How an exercise notebook scores, and the file its exercise cell writes: what the kernel needs, without nbformat.

A learner's kernel has oomlab but not necessarily nbgrader's parts; the cells
(:mod:`oomlab.classroom.cells`) read their scoring from here.
"""

from __future__ import annotations

from oomlab.course.manifest import Exercise
from oomlab.grading.checks import ALWAYS, CHECKS

__all__ = [
    "ANSWER_POINTS",
    "MAGIC",
    "POINTS_PER_CHECK",
    "honesty_checks",
    "magic_line",
    "memory_checks",
    "script_name",
]

POINTS_PER_CHECK = 2
ANSWER_POINTS = 2
MAGIC = "%%writefile"


def memory_checks(ex: Exercise) -> list[str]:
    """The exercise's checks that earn points (memory checks), in its manifest's order."""
    return [name for name in ex.checks if CHECKS[name].earns_points]


def honesty_checks(ex: Exercise) -> list[str]:
    """The checks every graded cell requires, hidden from the release: those every run gets, then the manifest's.

    They earn no points of their own, but a run that fails one earns no memory points either: they say whether
    it is still the same training job, measured untouched."""
    return list(ALWAYS) + [name for name in ex.checks if not CHECKS[name].earns_points and name not in ALWAYS]


def script_name(ex_id: str) -> str:
    """The file an exercise cell writes, beside its notebook: one per exercise, since an assignment's notebooks share a folder."""
    return f"{ex_id}.py"


def magic_line(ex_id: str) -> str:
    """The exercise cell's first line: it writes the cell to the file that is measured."""
    return f"{MAGIC} {script_name(ex_id)}"
