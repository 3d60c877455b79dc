"""What an exercise notebook's locked cells call, in the notebook's kernel.

The kernel measures nothing itself: it never imports torch, so it never holds GPU
memory. :func:`measure` grades the file the exercise cell wrote exactly as
``oomlab check`` does (:func:`oomlab.grading.verdict.grade`: a fresh process, or
one forked from a warm server, under the budget, against the reference fix
measured on the same GPU) and prints the same table. :func:`check` and
:func:`honest` then turn one check each into a cell's score for nbgrader:

- a cell that returns scores full points: the check passed;
- a cell that raises scores zero. The exception shows the same lines the terminal
  shows (what was measured, what was required, why it matters), and nothing else:
  no traceback into oomlab, and nothing on stderr, which nbgrader scores as a failure.

A run that could not be graded (no GPU, a syntax error, a crash, the time limit,
a notebook built from another version of the exercise) raises :class:`NotGraded`
in every graded cell, saying why: no cell passes where nothing was measured.

An estimate exercise's file holds ``estimate(config)``. :func:`measure` grades it as
``oomlab check`` does (:func:`oomlab.grading.estimates.grade_estimate`: its answers for
the hidden configs in its sandbox, then each config run on the GPU) and prints the same
table; :func:`part` turns one part into a cell's score: within its tolerance on every
hidden config, or not. In a class's folder the grade is strict (the estimator runs
sandboxed or nothing is graded) with the whole class folder out of its reach, and it is
the grade ``oomlab nbgrader autograde`` made before nbgrader ran, where there is one
(:mod:`oomlab.classroom.measured`). An estimator that fails to load or answer is said on
any machine; only then does grading need a GPU. A script is graded by the same rules in a
class's folder: strict, the folder out of its reach.

In a student build of oomlab (``oomlab nbgrader student-wheel``: no reference
fixes) there is nothing to grade a script against: :func:`measure` still runs the
script under the budget and shows its figures, and every cell says that the grade
comes from the instructor. An estimate needs no reference fix: it is graded there as
``oomlab check`` grades it, and the instructor's grade is made the same way.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

from oomlab.errors import OomLabError

__all__ = ["CheckFailed", "NotGraded", "check", "honest", "measure", "part"]


class _CellError(Exception):
    """An error a cell shows as its lines alone (IPython renders ``_render_traceback_`` instead of a traceback)."""

    def __init__(self, lines: list[str]):
        super().__init__(lines[0] if lines else "")
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self.lines[0]}", *self.lines[1:]]


class NotGraded(_CellError):
    """Nothing could be measured, so no check can pass: the reason, and what to do."""


class CheckFailed(_CellError):
    """The run was measured, and this check failed."""


@dataclass
class _Outcome:
    script_text: str
    report: object | None  # oomlab.grading.verdict.Report; an estimate's, oomlab.sizing.grade.SizingReport
    reason: list[str]  # why it was not graded: nothing measured (report None), or the script did not run to its end
    shown: str = ""  # a run measured but not graded (a student build): its figures, as text


# What every cell of a student build says: it has no reference fix, so it cannot grade, and nobody should think it did.
STUDENT_BUILD = [
    "This is the student build of oomlab: it carries no reference fixes, and every check compares your run with the "
    "reference fix measured on the same GPU, so it cannot grade here.",
    "Your grade comes from your instructor, who measures this notebook on the grading machine.",
]


_last: dict[str, _Outcome] = {}  # exercise id -> the last grading of its file in this kernel
_pinned: dict[str, str] = {}  # exercise id -> the sources digest its notebook was built from


def _plain(draw) -> str:
    """What ``draw(console)`` prints, as plain text laid out as in a terminal: no colour (the kernel sets FORCE_COLOR), no HTML."""
    from rich.console import Console

    out = io.StringIO()
    draw(Console(file=out, width=100, color_system=None, force_terminal=False, force_jupyter=False, highlight=False))
    return out.getvalue().rstrip()


def _error_lines(err: OomLabError) -> list[str]:
    return [err.what] + ([err.todo] if err.todo else [])


def _exercise(ex_id: str):
    """The exercise to grade against: the class's pinned copy above this notebook, else the installed course."""
    from oomlab.classroom.layout import PINNED, class_root
    from oomlab.course import Course
    from oomlab.course.shipped import shipped_root

    root = class_root()
    course_root = root / PINNED if root is not None else shipped_root()
    if course_root is None:
        raise NotGraded(["This installation of oomlab carries no course to grade against.", "Reinstall it: pip install oomlab"])
    try:
        # The class's pinned copy is the instructor's, out of the students' hands: its own manifests are the ones.
        return Course(course_root, working_tree=root is not None).get(ex_id)
    except OomLabError as err:
        raise NotGraded(_error_lines(err)) from None


def _student_build() -> bool:
    """Whether the notebook grades against a course that has no reference fixes: an installed student build.

    Never in a class's folder, whose pinned copy carries them; a fix missing from a
    full course is a broken install, and grading says so.
    """
    from oomlab.classroom.layout import class_root
    from oomlab.course.shipped import shipped_root

    shipped = shipped_root()
    return class_root() is None and shipped is not None and not (shipped / "solutions").is_dir()


def _grade(ex_id: str) -> _Outcome:
    from oomlab.classroom import measured
    from oomlab.classroom.layout import class_root
    from oomlab.classroom.scoring import magic_line, script_name
    from oomlab.grading.present import script_failure, unfinished
    from oomlab.grading.truth import source_digest
    from oomlab.grading.verdict import grade
    from oomlab.measure.machine import refuse_without_a_driver

    ex = _exercise(ex_id)
    student = _student_build()  # nothing to grade against, and no reference fix to take a digest of
    if not student and ex_id in _pinned and source_digest(ex) != _pinned[ex_id]:
        raise NotGraded(
            [
                f"This notebook was built from another version of {ex_id} than the one grading would measure against "
                f"({source_digest(ex)}, the notebook says {_pinned[ex_id]}): its budget, checks or reference fix differ.",
                "Grade it with the oomlab version and course folder it was built with, or rebuild and re-release it.",
            ]
        )
    script = Path.cwd() / script_name(ex_id)
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise NotGraded(
            [
                f"{script.name} was not written, so there is nothing to measure.",
                f"Run the exercise cell: its first line, {magic_line(ex_id)}, writes it. If you deleted that cell, "
                "copy it back from the released notebook.",
            ]
        ) from None
    except OSError as err:
        raise NotGraded([f"Cannot read {script}: {err.strerror or err}.", "Make it readable and run the cell again."]) from None
    if ex.is_estimate:
        return _estimated(ex, script, text)
    try:  # no NVIDIA driver: say so now, not after a measuring process has imported torch to find no GPU (seconds)
        refuse_without_a_driver(script, f"measuring {script.name}")
    except OomLabError as err:
        return _Outcome(text, None, _error_lines(err))
    if student:
        return _measured_only(ex, script, text)
    root = class_root()
    try:
        # In a class's folder the run is graded as `oomlab nbgrader autograde` grades it before nbgrader runs: strict
        # (sandboxed and witnessed, or nothing is graded), the class folder out of its reach. Plain `nbgrader
        # autograde` finds no such measurement and measures here by the same rules: a learner's would run the
        # script unsandboxed on a machine that cannot sandbox, free to read the reference fix and run it.
        kept = measured.load(ex, script)
        report = grade(ex, script, measurement=kept, strict=root is not None, hide=() if root is None else (root,))
    except OomLabError as err:  # the machine (no GPU, too small, busy) or the course, not the learner's code
        return _Outcome(text, None, _error_lines(err))
    if unfinished(report):
        m = report.measurement
        return _Outcome(
            text,
            report,
            [
                f"The script did not run to its end: {m.ending()}.",
                *_plain(lambda console: console.print(script_failure(m, ex))).splitlines(),
                *(f"{check_line(c)}: {c.detail}" for c in report.checks if not c.passed),  # what it reached for
            ],
        )
    return _Outcome(text, report, [])


def _estimated(ex, script: Path, text: str) -> _Outcome:
    """An estimator's grade: the one kept for its exact text in a class's folder, else graded now (see the module's
    docstring). Its failure to answer, or a machine that cannot measure, is the reason nothing was graded."""
    from oomlab.classroom import measured
    from oomlab.classroom.layout import class_root
    from oomlab.grading.estimates import grade_estimate

    root = class_root()
    if root is not None and (kept := measured.load_estimate(ex, script)) is not None:
        return _Outcome(text, kept, [])
    try:
        report = grade_estimate(ex, script, strict=root is not None, hide=() if root is None else (root,))
    except OomLabError as err:
        return _Outcome(text, None, _error_lines(err))
    return _Outcome(text, report, [])


def _measured_only(ex, script: Path, text: str) -> _Outcome:
    """A student build's run: measured under the budget as grading would, shown, and never graded."""
    from oomlab.measure.harness import MACHINE_PROBLEMS, measure_exercise_file
    from oomlab.measure.machine import machine_error

    m = measure_exercise_file(ex, script)
    if m.status in MACHINE_PROBLEMS:
        return _Outcome(text, None, [*_error_lines(machine_error(m, ex)), *STUDENT_BUILD])
    return _Outcome(text, None, STUDENT_BUILD, shown=_run_text(m, ex))


def _run_text(m, ex) -> str:
    """A run's own figures, as ``oomlab run`` shows them: the failure, or the OOM and the allocator's figures."""
    from oomlab.grading.present import print_run

    return _plain(lambda console: print_run(console, m, ex))


def _outcome(ex_id: str) -> _Outcome:
    """The grading of the exercise's file as it is now: the last one if the file has not changed since, else a new one."""
    last = _last.get(ex_id)
    if last is not None:
        from oomlab.classroom.scoring import script_name

        with contextlib.suppress(OSError):
            if (Path.cwd() / script_name(ex_id)).read_text(encoding="utf-8", errors="replace") == last.script_text:
                return last
    with contextlib.redirect_stderr(sys.stdout):  # anything a library prints goes where nbgrader does not score it
        _last[ex_id] = _grade(ex_id)
    return _last[ex_id]


def check_line(c) -> str:
    """One check as every cell and report says it: ``name: measured (required threshold)``."""
    return f"{c.name}: {c.measured} (required {c.threshold})"


def _graded(ex_id: str):
    outcome = _outcome(ex_id)
    if outcome.report is None or outcome.reason:  # not measured, or the script did not run to its end
        raise NotGraded(outcome.reason or ["Nothing was measured."])
    return outcome.report


def _print_grade(console, report) -> None:
    """What ``oomlab check`` prints of a grade: a script's checks, or an estimate's parts of every hidden config."""
    from oomlab.grading.present import print_report
    from oomlab.sizing.grade import SizingReport
    from oomlab.sizing.present import scores_table

    if isinstance(report, SizingReport):
        console.print(scores_table(report))
    else:
        print_report(console, report)


def measure(ex_id: str, sources: str) -> None:
    """The measuring cell: grade the exercise's file now and print what ``oomlab check`` prints."""
    _pinned[ex_id] = sources
    _last.pop(ex_id, None)
    try:
        report = _graded(ex_id)
    except NotGraded as err:
        if ex_id in _last and _last[ex_id].shown:
            print(_last[ex_id].shown)
        print("\n".join(["Not graded:", *err.lines]))
        return
    print(_plain(lambda console: _print_grade(console, report)))
    print(f"{ex_id} {'passes' if report.passed else 'does not pass yet'}.")


def check(ex_id: str, name: str) -> None:
    """A graded cell: passes when the check ``name`` passed on the exercise's file."""
    report = _graded(ex_id)
    result = next((c for c in getattr(report, "checks", ()) if c.name == name), None)
    if result is None:
        raise NotGraded([f"{ex_id} has no check {name!r}: this notebook does not match its exercise.", "Rebuild the course."])
    if not result.passed:
        raise CheckFailed(
            [
                check_line(result),
                *filter(None, [result.detail]),
                f"Why it matters: {result.why}",
            ]
        )
    print(f"PASS {check_line(result)}")


def honest(ex_id: str) -> None:
    """The hidden part of every graded cell: the run is the same job, measured untouched, or no memory check counts."""
    from oomlab.classroom.scoring import honesty_checks

    report = _graded(ex_id)
    wanted = set(honesty_checks(report.exercise))
    failed = [c for c in report.checks if c.name in wanted and not c.passed]
    if failed:
        names = ", ".join(c.name for c in failed)
        lines = [f"no memory points: the run fails {names}, so it is not the same job measured untouched."]
        for c in failed:
            lines += [check_line(c), *filter(None, [c.detail])]
        raise CheckFailed(lines)


def part(ex_id: str, name: str) -> None:
    """A graded cell of an estimate exercise: passes when the part ``name`` is within its tolerance on every hidden config."""
    from oomlab.sizing.grade import SizingReport
    from oomlab.sizing.present import off_lines, part_line

    report = _graded(ex_id)
    if not isinstance(report, SizingReport) or name not in report.sized.parts:
        raise NotGraded([f"{ex_id} has no part {name!r}: this notebook does not match its exercise.", "Rebuild the course."])
    if off := off_lines(report, name):
        raise CheckFailed([part_line(report, name), *off])
    print(f"PASS {part_line(report, name)}")
