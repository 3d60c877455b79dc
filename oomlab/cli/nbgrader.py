"""``oomlab nbgrader``: the instructors' commands, an nbgrader course made from the exercises and graded on a GPU.

- ``build DIR``: the course folder (:mod:`oomlab.classroom.build`), then nbgrader's own commands;
- ``autograde ASSIGNMENT``: a class's submissions measured at once, then ``nbgrader autograde``,
  then who lost which points and why (:mod:`oomlab.classroom.classgrade`);
- ``student-wheel DIR``: oomlab for the learners' kernels, without the reference fixes and
  model answers (:mod:`oomlab.classroom.student`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from oomlab.cli import console, nbgrader_app
from oomlab.errors import OomLabError


def _classroom():
    """The nbgrader extra, or one message saying how to install it.

    Looked up, not imported: importing nbformat and nbgrader takes seconds, and a command that stops first (no
    course folder here, no GPU) should say so at once.
    """
    from importlib.util import find_spec

    for name in ("nbformat", "nbgrader"):
        if find_spec(name) is None:
            raise OomLabError(
                f"nbgrader is not installed here ({name} is missing).",
                "Install the instructors' extra: pip install 'oomlab[nbgrader]' (in a checkout: pip install -e '.[nbgrader]').",
            )


@nbgrader_app.command()
def build(folder: Path = typer.Argument(..., help="a new or empty folder, or one an earlier build made")) -> None:
    """Write an nbgrader course: nbgrader_config.py, the pinned exercises, one assignment per module."""
    _classroom()
    from oomlab.classroom.build import build_course

    built = build_course(folder)
    console.print(
        f"Wrote the nbgrader course into {built.root} ({built.written} files"
        + (f", {built.removed} removed)." if built.removed else ").")
    )
    table = Table(header_style="bold")
    table.add_column("assignment")
    table.add_column("notebooks")
    for name, ids in built.assignments.items():
        table.add_row(name, ", ".join(ids))
    console.print(table)
    first = next(iter(built.assignments))
    console.print(Text(f"  cd {folder}\n  nbgrader generate_assignment {first}", style="bold cyan"))
    console.print("The instructor's guide (README, and the site's page for instructors) has every step after that.")


@nbgrader_app.command()
def autograde(
    assignment: str = typer.Argument(..., help="an assignment (a module), as `build` listed them"),
    student: Optional[list[str]] = typer.Option(None, "--student", help="grade only this student (repeat for more)"),
    jobs: int = typer.Option(0, min=0, help="runs at once (default 0: as many as the cores and the GPU's free memory allow)"),
) -> None:
    """Grade a class on this GPU: measure every submission at once, run nbgrader's autograde, say who lost what and why."""
    _classroom()
    from oomlab.classroom.layout import course_folder

    course_folder()  # in the wrong folder, said before the seconds importing nbgrader takes
    from oomlab.classroom.classgrade import grade_class

    with console.status(f"Grading {assignment}…") as status:
        report = grade_class(
            assignment, student or None, jobs or None, note=lambda msg: status.update(f"Grading {assignment}: {msg}…")
        )
    table = Table(
        header_style="bold", title=f"{assignment}: {len({r.student for r in report.rows})} student(s)", title_justify="left"
    )
    for col in ("student", "notebook", "score", "points lost: which check, why"):
        table.add_column(col, overflow="fold")
    for row in report.rows:
        score = "—" if row.score is None else f"{row.score:g}" + (f" / {row.max_score:g}" if row.max_score is not None else "")
        table.add_row(row.student, row.notebook, score, "\n".join(row.reasons) or Text("none", style="green"))
    console.print(table)
    console.print(
        f"Measured {report.measured} distinct handed-in file(s), scripts and estimators, in {report.measure_s:.0f} s and autograded in {report.autograde_s:.0f} s, "
        f"{report.jobs} at a time. The report is in reports/{assignment}.json, each check's points and why in "
        f"reports/{assignment}-checks.csv (a line per student and exercise); nbgrader's feedback: "
        f"nbgrader generate_feedback {assignment}."
    )
    if report.failed_students:
        for student, error in report.failed_students.items():
            console.print(Text(f"nbgrader could not autograde {student}: {error}", style="bold red"))
        console.print(f"Their logs are in oomlab-course/.oomlab/class/logs/{assignment}/; grade them again with --student.")
        raise typer.Exit(1)


@nbgrader_app.command("student-wheel")
def student_wheel(folder: Path = typer.Argument(..., help="the folder to write the wheel into")) -> None:
    """Write the wheel to give students: oomlab without the reference fixes, model answers or alternative fixes."""
    from oomlab.classroom.student import build_student_wheel

    path = build_student_wheel(folder)
    console.print(f"Wrote the student build of oomlab: {path}", soft_wrap=True)
    console.print(
        "It carries the exercises and the notebooks' cells, but no reference fixes, model answers or accepted alternative "
        "fixes: in it, the notebooks measure a script and show its figures, and the grade comes from your autograde."
    )
    console.print(Text(f"  pip install {path}", style="bold cyan"), soft_wrap=True)
    console.print(
        "Give students this wheel and the released notebooks (release/ASSIGNMENT/); never the course folder or the full wheel."
    )
