"""The nbgrader preprocessor that makes autograde grade the exercise cell's script and nothing else.

Every code cell of a notebook runs in one kernel, and the graded cells read
their verdict in that kernel. A cell a student adds could therefore run anything
before them: import the grading helpers and change them, fill the GPU from the
kernel, or never return. nbgrader restores the locked cells it knows (by their
checksums in the gradebook) but runs every other cell as submitted.

:class:`GradeOnlyTheExercise` runs at autograde, after nbgrader's
``OverwriteCells``, so every cell with an nbgrader id left is one the gradebook
knows. It then

- keeps the first exercise cell (``metadata.oomlab.role``) and makes sure its
  first line is the ``%%writefile`` that writes it to the measured file, so that
  the script is measured in a process of its own and never run in the kernel;
- puts back every locked or graded cell the submission lacks, from the
  gradebook (nbgrader's own ``add_missing_cells`` assumes a graded cell follows a
  graded or solution cell, and fails the whole submission where one follows a
  locked cell, as here), a code cell never above the exercise cell;
- turns every other code cell into a raw cell, which nobody runs;
- removes from the graded copy of the submission every file handed in beside the
  notebooks (:mod:`oomlab.classroom.handin`), which no grading reads and a kernel
  could import,

and says what it did at the top of the graded notebook, so that the feedback
shows the reason.

``oomlab nbgrader build`` lists it in ``nbgrader_config.py``.
"""

from __future__ import annotations

from pathlib import Path

from nbformat.notebooknode import NotebookNode, from_dict
from nbgrader import utils
from nbgrader.api import Gradebook
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor

from oomlab.classroom import handin
from oomlab.classroom.layout import EXERCISE_ROLE
from oomlab.classroom.scoring import MAGIC, script_name

__all__ = ["GradeOnlyTheExercise", "exercise_cell", "script_of"]

NOTE_ID = "oomlab-grading-note"


def is_exercise(cell: NotebookNode) -> bool:
    return cell.cell_type == "code" and cell.get("metadata", {}).get("oomlab", {}).get("role") == EXERCISE_ROLE


def is_known(cell: NotebookNode) -> bool:
    """A cell nbgrader tracks: graded, locked or a solution, with an id."""
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade_id")) and (utils.is_grade(cell) or utils.is_solution(cell) or utils.is_locked(cell))


def exercise_cell(nb: NotebookNode) -> NotebookNode | None:
    """The cell whose script is graded: the first exercise cell that nbgrader does not track as another cell."""
    return next((c for c in nb.cells if is_exercise(c) and not is_known(c)), None)


def _source(cell: NotebookNode) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def script_of(cell: NotebookNode, file: str) -> str:
    """The text the exercise cell writes to ``file`` once :class:`GradeOnlyTheExercise` has made sure of its first line.

    IPython's ``%%writefile`` writes the cell below its first line as it stands;
    a cell whose first line is anything else gets the magic put above it, so all
    of what the student wrote is the script (and a first line that is not Python
    is the script's syntax error, not a way around the measurement).
    """
    first, _, rest = _source(cell).partition("\n")
    return rest if first.rstrip() == f"{MAGIC} {file}" else _source(cell)


class GradeOnlyTheExercise(NbGraderPreprocessor):
    """At autograde: the exercise cell writes the measured script; no other unknown code runs in the kernel."""

    def preprocess(self, nb: NotebookNode, resources: dict):
        notes = []
        exercise = exercise_cell(nb)
        # The notebook's name is the exercise's (nbgrader grades a notebook only under its released name).
        file = script_name(resources["nbgrader"]["notebook"])
        if exercise is None:
            notes.append("The exercise cell is missing, so no script was written and nothing could be measured.")
        else:
            first = _source(exercise).partition("\n")[0]
            if first.rstrip() != f"{MAGIC} {file}":
                exercise.source = f"{MAGIC} {file}\n{_source(exercise)}"
                notes.append(
                    f"The exercise cell did not start with `{MAGIC} {file}`: that line was put back above it, so the cell "
                    "was measured as the script it is, not run in the grading kernel."
                )
        if restored := self._restore_missing(nb, resources, exercise):
            notes.append(
                f"Cell(s) missing from the submission were put back from the released notebook: {', '.join(restored)}. "
                "They were graded as released."
            )
        ignored = 0
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or cell is exercise or is_known(cell):
                continue
            nb.cells[i] = from_dict(
                {
                    "cell_type": "raw",
                    "metadata": {"oomlab": {"not_run": True}},
                    "source": _source(cell),
                    "id": cell.get("id", f"raw-{i}"),
                }
            )
            ignored += 1
        if ignored:
            notes.append(
                f"{ignored} code cell(s) added to the notebook were not run: at grading only the exercise cell's script is "
                "measured, in a process of its own, and code run in the grading kernel could change the grader."
            )
        if unused := self._clear_folder(resources):
            notes.append(
                f"Not used at grading: {', '.join(unused)}. Nothing handed in beside the notebooks is graded (the exercise "
                "cell writes the script that is measured), so it was left out of the folder the notebook is graded in, "
                "where the grading kernel could have imported it in place of the grader."
            )
        if notes:
            for note in notes:
                self.log.warning("%s: %s", resources.get("nbgrader", {}).get("notebook", "notebook"), note)
            nb.cells.insert(
                0,
                from_dict(
                    {
                        "cell_type": "markdown",
                        "metadata": {"oomlab": {"note": True}},
                        "source": "**Changed at grading.**\n\n" + "\n".join(f"- {n}" for n in notes),
                        "id": NOTE_ID,
                    }
                ),
            )
        return nb, resources

    def _clear_folder(self, resources: dict) -> list[str]:
        """Empty the graded copy of the submission of what was handed in beside the notebooks; what was removed.

        The first line of defence against a module handed in to stand in for the grader
        (:mod:`oomlab.classroom.handin`): this runs before the notebook's kernel starts, so
        nothing removed here can be imported at its start or by a cell. What is kept: the
        assignment's notebooks; the scripts other notebooks' exercise cells wrote when they
        were graded earlier in this run; nbgrader's own files; the instructor's own files
        from ``source/``. This notebook's own script, handed in from the student's run, goes
        unremarked: its exercise cell writes it again, and where that cell is missing nothing
        may be measured.
        """
        meta = resources["nbgrader"]
        coursedir = CourseDirectory(config=self.config)
        graded = Path(coursedir.format_path(coursedir.autograded_directory, meta["student"], meta["assignment"]))
        source = Path(coursedir.format_path(coursedir.source_directory, ".", meta["assignment"]))
        keep = {Path(f).relative_to(source).as_posix() for f in utils.find_all_files(str(source), [*coursedir.ignore, "*.ipynb"])}
        with Gradebook(meta["db_url"]) as gb:
            names = [n.name for n in gb.find_assignment(meta["assignment"]).notebooks]
        keep |= {f"{n}.ipynb" for n in names} | {script_name(n) for n in names if n != meta["notebook"]} | handin.NBGRADERS
        return [rel for rel in handin.clear(graded, keep) if rel != script_name(meta["notebook"])]

    def _restore_missing(self, nb: NotebookNode, resources: dict, exercise: NotebookNode | None) -> list[str]:
        """Put back the gradebook's locked and graded cells that ``nb`` lacks, in the released order; their ids."""
        meta = resources["nbgrader"]
        with Gradebook(meta["db_url"]) as gb:
            source_nb = gb.find_notebook(meta["notebook"], meta["assignment"])
            points = {c.name: c.max_score for c in source_nb.grade_cells}
            solutions = {c.name for c in source_nb.solution_cells}
            released = [(c.name, c.cell_type, c.locked, c.source, c.checksum) for c in source_nb.source_cells]
        restored = []
        for k, (name, cell_type, locked, source, checksum) in enumerate(released):
            if any(_grade_id(c) == name for c in nb.cells):
                continue
            cell = {
                "cell_type": cell_type,
                "id": f"restored-{name}",
                "metadata": {
                    "nbgrader": {
                        "grade": name in points,
                        "grade_id": name,
                        "locked": locked,
                        "checksum": checksum,
                        "schema_version": 3,
                        "solution": name in solutions,
                        "task": False,
                        **({"points": points[name]} if name in points else {}),
                    }
                },
                "source": source,
            }
            if cell_type == "code":
                cell.update(outputs=[], execution_count=None)
            after = [i for i, c in enumerate(nb.cells) if _grade_id(c) in {n for n, *_ in released[:k]}]
            if cell_type == "code" and exercise is not None:
                after.append(next(i for i, c in enumerate(nb.cells) if c is exercise))
            nb.cells.insert(max(after) + 1 if after else 0, from_dict(cell))
            restored.append(name)
        return restored


def _grade_id(cell: NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") if is_known(cell) else None
