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

An estimate exercise (``kind = "estimate"``) has the same cells, told its own way: the problem
states the parts, their tolerances and the public example configs, and no budget; the exercise
cell writes the estimator as shipped; the measuring cell grades it as ``oomlab check`` does (its
``estimate(config)`` in the sandbox for the hidden configs, then each config measured on the GPU);
and there is one graded cell per part (:data:`POINTS_PER_CHECK` points each), which passes when
that part is within its tolerance on every hidden config. The estimator runs in its sandbox,
where it can reach neither the GPU nor an answer, so there is no honest run to require: the hidden
part holds the tripwire alone.

The exercise cell carries no nbgrader metadata, so ``generate_assignment`` releases
the buggy script as it is instead of replacing it with a stub; it is found by
``metadata.oomlab.role`` (:mod:`oomlab.classroom.preprocessors`).
"""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from oomlab.classroom.layout import EXERCISE_ROLE
from oomlab.classroom.scoring import (
    ANSWER_POINTS,
    POINTS_PER_CHECK,
    grade_id,
    graded,
    honesty_checks,
    magic_line,
    memory_checks,
    script_name,
)
from oomlab.course.manifest import Exercise
from oomlab.course.modules import SIZE_FIRST, step_label
from oomlab.course.originals import shipped_source
from oomlab.grading.truth import source_digest
from oomlab.sizing.grade import SIZED
from oomlab.sizing.hidden import COUNT
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


# What the interview answer should cover, by kind of exercise: a debugging story, or a sizing.
ANSWER_ASKS = {
    "script": "what you look at first, what the numbers tell you, the fix, and how you check it.",
    "estimate": "how you take it apart, the numbers for each part, and how you check them on the real card.",
}
# What the measuring cell says it does, above its call, by kind of exercise.
MEASURES = {
    "script": "# Measures the file the cell above wrote, in a fresh process under the budget, against the reference fix.",
    "estimate": "# Grades the estimator the cell above wrote: its estimate() for each hidden config in a sandbox with no GPU,\n"
    "# then each config run on the GPU by the course's own code.",
}


def _estimate_problem(ex: Exercise) -> str:
    """An estimate exercise's problem: the task, the parts with their tolerances and points, the public examples."""
    kind = SIZED[ex.sizes]
    fields = list(ex.examples[0])
    return "\n".join(
        [
            f"# {ex.title}",
            "",
            f"*{SIZE_FIRST}: no step of the workflow, and no memory budget, since nothing of yours runs on the GPU.*",
            "",
            ex.summary,
            "",
            "## What is graded",
            "",
            f"Your `estimate(config)` returns the bytes of each part below. It is graded on {COUNT} hidden configs, drawn "
            "from your file's own text (any change to it draws new ones); each runs on the GPU and is read from the "
            "caching allocator. A part earns its points when your estimate of it is within its tolerance of the measured "
            "bytes on every hidden config.",
            "",
            "| Part | Tolerance | Points |",
            "|---|---|---|",
            *(f"| `{part}` | ±{kind.tolerance[part]:.0%} | {POINTS_PER_CHECK} |" for part in kind.parts),
            "",
            "## Example configs",
            "",
            "Public configs like the hidden ones; the docstring of the file in the next cell says what each field means "
            f"and what each part counts. `python {script_name(ex.id)}` in a terminal prints your estimate of the config "
            "at the file's end: change it to size any other.",
            "",
            "| # | " + " | ".join(fields) + " |",
            "|---|" + "---|" * len(fields),
            *(f"| {i} | " + " | ".join(str(cfg[f]) for f in fields) + " |" for i, cfg in enumerate(ex.examples, 1)),
            "",
            "## How this notebook is graded",
            "",
            f"1. Write your estimate in the next cell and run it: it writes `{script_name(ex.id)}`. Nothing of it runs in "
            "this notebook's kernel.",
            "2. The cell after it runs your `estimate()` for each hidden config in a sandbox, with no GPU and no answer "
            f"in reach, then measures each config on the GPU, as `oomlab check {ex.id}` does in a terminal, and shows "
            "every part of every config beside its measurement.",
            f"3. Each part earns {POINTS_PER_CHECK} points when it is within its tolerance on every hidden config: "
            f"{', '.join(f'`{p}`' for p in kind.parts)}.",
            f"4. The interview question at the end is marked by hand ({ANSWER_POINTS} points).",
            "",
            "Only the next cell is graded: code in cells you add is not run at grading.",
        ]
    )


def _graded_cell(ex: Exercise, name: str) -> nbformat.NotebookNode:
    """The graded cell of ``name`` (a memory check, or a part), with its hidden part."""
    call = f"{ex.id!r}, {name!r}"
    shown, hidden = (
        (f"cells.part({call})", INSTALLED_ONLY)  # the sandbox keeps the estimator honest: there is no run to judge
        if ex.is_estimate
        else (f"cells.check({call})", f"{INSTALLED_ONLY}\ncells.honest({ex.id!r})")
    )
    return new_code_cell(
        f"from oomlab.classroom import cells\n\n{shown}\n### BEGIN HIDDEN TESTS\n{hidden}\n### END HIDDEN TESTS",
        metadata=_nbgrader(grade_id(ex, name), grade=True, locked=True, points=POINTS_PER_CHECK),
    )


def build_notebook(ex: Exercise) -> nbformat.NotebookNode:
    """The source notebook of ``ex``, ready for ``nbgrader generate_assignment``."""
    cells = [
        new_markdown_cell(_estimate_problem(ex) if ex.is_estimate else _problem(ex), metadata=_nbgrader("problem", locked=True)),
        new_code_cell(
            f"{magic_line(ex.id)}\n{shipped_source(ex)}",
            metadata={"oomlab": {"role": EXERCISE_ROLE, "exercise": ex.id}},
        ),
        new_code_cell(
            f"{MEASURES[ex.kind]}\nfrom oomlab.classroom import cells\n\ncells.measure({ex.id!r}, sources={source_digest(ex)!r})",
            metadata=_nbgrader("measure", locked=True),
        ),
    ]
    cells += [_graded_cell(ex, name) for name in graded(ex)]
    cells += [
        new_markdown_cell(
            f"## Interview question\n\n{ex.interview.question}\n\nAnswer in the next cell as you would aloud, in about two "
            f"minutes: {ANSWER_ASKS[ex.kind]}",
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
