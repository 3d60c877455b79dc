"""One exercise as an nbgrader source notebook, derived from its folder every time it is built.

The cells, in the order a learner meets them:

1. the problem (locked markdown): the exercise's summary, budget and workflow step,
   and how the notebook is graded;
2. **the exercise cell**, the only one the learner edits: ``%%writefile train.py``
   above the buggy script as shipped. Running it writes the script; nothing of it runs
   in the notebook's kernel, whose allocator would keep every earlier cell's memory;
3. the measuring cell (locked): the script measured in a fresh process under the
   budget, against the reference fix, as ``oomlab check`` measures it, and the same table;
4. one graded cell per memory check (locked, :data:`POINTS_PER_CHECK` points each),
   whose hidden part (``### BEGIN HIDDEN TESTS``) holds the honesty checks: a fix that
   trains less, resets the statistics or changes the settings earns no memory points.
   Before them it checks that the grading helpers the cell used are the installed
   ones (:data:`INSTALLED_ONLY`);
5. the interview question, and a manually graded answer cell (:data:`ANSWER_POINTS`
   points) whose source holds the model answer, which nbgrader strips from the release.

The exercise cell carries no nbgrader metadata, so ``generate_assignment`` releases
the buggy script as it is instead of replacing it with a stub; it is found by
``metadata.oomlab.role`` (:mod:`oomlab.classroom.preprocessors`).
"""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from oomlab.classroom.layout import EXERCISE_ROLE
from oomlab.classroom.scoring import ANSWER_POINTS, POINTS_PER_CHECK, honesty_checks, magic_line, memory_checks, script_name
from oomlab.course.manifest import Exercise
from oomlab.course.modules import step_label
from oomlab.course.originals import shipped_source
from oomlab.grading.truth import source_digest
from oomlab.units import format_bytes

__all__ = ["INSTALLED_ONLY", "build_notebook"]

# The hidden part's first lines: the last of three defences against grading helpers handed in beside the notebook
# (a folder oomlab/classroom/cells.py whose check() passes). The first two keep such a file from ever being imported:
# the grading preprocessor removes it from the folder the notebook is graded in (oomlab.classroom.handin), and the
# kernel starts with no folder of the submission's on sys.path (oomlab.classroom.kernel). Both live in nbgrader's
# configuration, which an instructor can override; this lives in the locked cell, which nbgrader restores from its
# gradebook, so a regression there scores zero with its reason instead of a forged pass. Each graded cell checks for
# itself, since its score is its own, and with the standard library alone: it cannot ask the module in question.
# It is a tripwire, not a wall: code handed in that did run in the kernel could hide from any check made there.
INSTALLED_ONLY = """\
import os  # graded by the installed oomlab only, never by a copy handed in beside this notebook
_here, _grader = os.path.realpath(os.curdir), os.path.realpath(getattr(cells, "__file__", None) or os.curdir)
if _grader == _here or _grader.startswith(_here + os.sep):
    raise ImportError(
        f"The grading helpers were imported from {_grader}, inside this submission's folder, not from the installed oomlab: "
        "nothing handed in beside the notebook is graded, so this cell scores nothing."
    )"""


def _nbgrader(grade_id: str, *, grade: bool = False, solution: bool = False, locked: bool = False, points: float = 0) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return {"nbgrader": meta}


def _problem(ex: Exercise) -> str:
    memory, honesty = memory_checks(ex), honesty_checks(ex)
    return "\n".join(
        [
            f"# {ex.title}",
            "",
            f"*Workflow step: {step_label(ex.module, ex.step)}. Memory budget: {format_bytes(ex.budget_bytes)}.*",
            "",
            ex.summary,
            "",
            "## How this notebook is graded",
            "",
            f"1. Fix the script in the next cell and run it: it writes `{script_name(ex.id)}`. Nothing of it runs in this "
            "notebook's kernel, whose caching allocator would keep every earlier cell's memory.",
            f"2. The cell after it measures `{script_name(ex.id)}` in a fresh process under the budget and compares it with the "
            f"reference fix measured on the same GPU, as `oomlab check {ex.id}` does in a terminal.",
            f"3. Each memory check below earns {POINTS_PER_CHECK} points: {', '.join(f'`{n}`' for n in memory)}. "
            "At grading, each also requires that the run is still the same job, measured untouched: "
            f"{', '.join(f'`{n}`' for n in honesty)}. A fix that trains less, resets the statistics or changes the "
            "allocator's settings earns none of them.",
            f"4. The interview question at the end is marked by hand ({ANSWER_POINTS} points).",
            "",
            "Work the three-step way: snapshot, hunt references, profile the peak; hyperparameters last. "
            f"In a terminal, `oomlab snapshot --budget {ex.budget_mib:g}MiB {script_name(ex.id)}` (and `hunt`, `profile`) "
            "run the tools on the file this notebook writes. Only the next cell is graded: code in cells you add "
            "is not run at grading.",
        ]
    )


def build_notebook(ex: Exercise) -> nbformat.NotebookNode:
    """The source notebook of ``ex``, ready for ``nbgrader generate_assignment``."""
    call = f"{ex.id!r}"
    cells = [
        new_markdown_cell(_problem(ex), metadata=_nbgrader("problem", locked=True)),
        new_code_cell(
            f"{magic_line(ex.id)}\n{shipped_source(ex)}",
            metadata={"oomlab": {"role": EXERCISE_ROLE, "exercise": ex.id}},
        ),
        new_code_cell(
            "# Measures the file the cell above wrote, in a fresh process under the budget, against the reference fix.\n"
            "from oomlab.classroom import cells\n\n"
            f"cells.measure({call}, sources={source_digest(ex)!r})",
            metadata=_nbgrader("measure", locked=True),
        ),
    ]
    honest = f"{INSTALLED_ONLY}\ncells.honest({call})"
    for name in memory_checks(ex):
        cells.append(
            new_code_cell(
                f"from oomlab.classroom import cells\n\ncells.check({call}, {name!r})\n### BEGIN HIDDEN TESTS\n{honest}\n### END HIDDEN TESTS",
                metadata=_nbgrader(f"check-{name}", grade=True, locked=True, points=POINTS_PER_CHECK),
            )
        )
    cells += [
        new_markdown_cell(
            f"## Interview question\n\n{ex.interview.question}\n\nAnswer in the next cell as you would aloud, in about two "
            "minutes: what you look at first, what the numbers tell you, the fix, and how you check it.",
            metadata=_nbgrader("interview-question", locked=True),
        ),
        new_markdown_cell(
            f"### BEGIN SOLUTION\n{ex.interview.answer}\n### END SOLUTION",
            metadata=_nbgrader("interview-answer", grade=True, solution=True, points=ANSWER_POINTS),
        ),
    ]
    for cell in cells:  # ids from the cells' roles, not random: the same exercise builds the same notebook, byte for byte
        cell.id = cell.metadata.get("nbgrader", {}).get("grade_id") or EXERCISE_ROLE
    nb = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
            "oomlab": {"exercise": ex.id, "sources": source_digest(ex)},
        },
    )
    nbformat.validate(nb)
    return nb
