"""``oomlab nbgrader autograde ASSIGNMENT``: a class's submissions graded on one GPU, many at once.

nbgrader grades one notebook after another, and each of ours waits for a
measurement. On one GPU many measurements fit at once, each under its own cap
(:func:`oomlab.measure.machine.parallel_runs` says how many), so this runs in
four steps:

1. **Read** every submitted notebook of the assignment. One that is not a
   notebook (not JSON, not nbformat) would make nbgrader drop the student's whole
   assignment, so once the measuring has worked it is moved aside as
   ``NAME.ipynb.unreadable`` (kept, never deleted) and scores zero, as a missing
   notebook does, with the reason;
2. **Measure** the script of each exercise cell, as the grading preprocessor will
   write it, all at once, forked from warm servers (:mod:`oomlab.measure.warm`),
   and keep each measurement for the notebook to find (:mod:`oomlab.classroom.measured`).
   An estimate exercise's estimators are graded after them, one after another, since
   each grading runs its configs on the whole GPU, and each grade is kept the same way;
3. **Autograde** with nbgrader itself, several processes at once, each grading a
   share of the students (``nbgrader autograde`` with the others excluded). Two
   failures are the machine's, never the student's, and their run goes again: the gradebook is SQLite, so a run that finds it locked
   goes again alone; and a kernel that did not start (jupyter_client picks a free
   TCP port and hands it to the kernel, and a kernel starting at the same moment
   may take it first) is started again. Each notebook's cells find their
   measurement and check it;
4. **Report** who scored what, from the gradebook, and for every point lost the
   check (or the estimate's part) and the reason, from the same checks the cells ran;
   also as JSON, in ``reports/ASSIGNMENT.json``.

Plain ``nbgrader autograde`` grades the same, one notebook at a time, measuring
each in turn.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from oomlab.classroom import measured
from oomlab.classroom.autograde_guard import CHECKED, UNREADABLE, set_aside, why_unreadable
from oomlab.classroom.build import assignments
from oomlab.classroom.cells import check_line
from oomlab.classroom.layout import PINNED, course_folder
from oomlab.classroom.preprocessors import exercise_cell, script_of
from oomlab.classroom.scoring import graded_name, honesty_checks, memory_checks, script_name
from oomlab.course import Course
from oomlab.course.manifest import Exercise
from oomlab.course.state import StateDir, shown, write_atomic, write_error
from oomlab.errors import OomLabError
from oomlab.grading.estimates import failed_parts, grade_estimate
from oomlab.grading.present import unfinished
from oomlab.grading.reference import measure_reference
from oomlab.grading.verdict import grade, require_witness
from oomlab.measure import warm
from oomlab.measure.declared import declared_alloc_conf
from oomlab.measure.harness import MACHINE_PROBLEMS, child_env, measure_exercise_file
from oomlab.measure.machine import has_nvidia_driver, machine_error, no_driver, parallel_runs
from oomlab.sizing.grade import MeasuringFailed
from oomlab.sizing.present import part_line

__all__ = ["ClassReport", "Row", "grade_class", "nbgrader_env"]

LOCKED = "database is locked"
# What nbgrader logs when a notebook's kernel did not start. The exercise cell only writes a file, so no
# student's code runs before the kernel answers: such a run is graded again, up to KERNEL_TRIES times in all.
KERNEL_NOT_STARTED = ("Kernel didn't respond", "Kernel died before replying")
KERNEL_TRIES = 3
NBGRADER_FAILED = "There was an error processing assignment"
# How nbgrader 0.9 starts each student's part of a log, and, when it has gone through them all, names each student
# it failed for and ends with SEE_ABOVE.
STUDENT_STARTS = re.compile(r"Creating/updating student with ID '(?P<student>[^']*)'")
FAILED_FOR = re.compile(r"There was an error processing assignment '[^']*' for student '(?P<student>[^']*)'")
SEE_ABOVE = "for details on the specific errors on the above failures"


@dataclass
class Row:
    """One student's notebook: its score from the gradebook, and why points were lost."""

    student: str
    notebook: str
    reasons: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # check name (an estimate's part) -> why it lost its points
    score: float | None = None
    max_score: float | None = None
    # Each graded cell's points as the gradebook has them (check-NAME, interview-answer): [score, max_score].
    points: dict[str, list[float | None]] = field(default_factory=dict)


@dataclass
class ClassReport:
    assignment: str
    rows: list[Row]
    jobs: int
    measured: int
    measure_s: float
    autograde_s: float
    failed_students: dict[str, str]  # student -> the error nbgrader logged

    def to_json(self) -> dict:
        return {
            "assignment": self.assignment,
            "jobs": self.jobs,
            "scripts_measured": self.measured,
            "measure_s": round(self.measure_s, 1),
            "autograde_s": round(self.autograde_s, 1),
            "students_nbgrader_failed": self.failed_students,
            "rows": [r.__dict__ for r in self.rows],
        }


@dataclass
class _Submission:
    student: str
    ex: Exercise
    path: Path  # the submitted notebook
    script: str | None = None  # what its exercise cell writes; None when it has none
    problem: str = ""  # why it cannot be graded at all
    not_answered: str = ""  # why its estimator gave no answers to grade: its own error, which its notebook says too
    unreadable: bool = False  # not a notebook: set aside before nbgrader runs, which would drop the whole assignment


def _set_aside(subs: list[_Submission]) -> None:
    """Move each unreadable notebook to ``NAME.ipynb.unreadable``: kept, and nbgrader scores the notebook missing (zero)."""
    for sub in subs:
        if sub.unreadable and sub.path.is_file():
            try:
                set_aside(sub.path)
            except OSError as err:
                raise write_error(
                    sub.path.with_name(sub.path.name + UNREADABLE), err, "set aside the unreadable notebook as"
                ) from None


def _submissions(root: Path, course: Course, assignment: str, students: list[str]) -> list[_Submission]:
    exercises = assignments(course).get(assignment)
    if exercises is None:
        raise OomLabError(
            f"There is no assignment {assignment!r} in this course.", f"The assignments: {', '.join(assignments(course))}."
        )
    submitted = root / "submitted"
    found = sorted(p.name for p in submitted.iterdir() if (p / assignment).is_dir()) if submitted.is_dir() else []
    for student in students:
        if student not in found:
            raise OomLabError(
                f"{student} has no submission of {assignment} under {shown(submitted)}.",
                "Collect it first (nbgrader collect or zip_collect).",
            )
    subs = []
    for student in students or found:
        for ex in exercises:
            path = submitted / student / assignment / f"{ex.id}.ipynb"
            sub = _Submission(student, ex, path)
            if not path.is_file():
                sub.problem = "not submitted"
            else:
                try:
                    nb = nbformat.read(path, as_version=4)
                except Exception as err:  # noqa: BLE001 - not JSON, not a notebook, not UTF-8: nbformat raises each its own way
                    sub.unreadable = True
                    sub.problem = (
                        f"the notebook could not be read ({why_unreadable(err)}); it was kept as {path.name + UNREADABLE}"
                    )
                else:
                    cell = exercise_cell(nb)
                    if cell is None:
                        sub.problem = "the exercise cell was deleted"
                    else:
                        sub.script = script_of(cell, script_name(ex.id))
            subs.append(sub)
    return subs


def _measure_all(root: Path, subs: list[_Submission], jobs: int, note: Callable[[str], None]) -> int:
    """Measure every distinct script once, ``jobs`` at a time, then grade every distinct estimator once, one after
    another; keep each measurement and grade for its notebooks. Returns how many were measured or graded."""
    todo = {(s.ex.id, s.script): s for s in subs if s.script is not None}
    if not todo:
        return 0
    if not has_nvidia_driver():  # said at once: the warm servers and the references would import torch to find no GPU
        raise instructors_error(no_driver("measuring"))
    estimators = [s for s in todo.values() if s.ex.is_estimate]
    if estimators:  # said before anything is measured: every estimator would fail alike, and score nothing
        _require_a_sandbox()
    scripts = {key: s for key, s in todo.items() if not s.ex.is_estimate}
    if scripts:
        _measure_scripts(root, scripts, jobs, note)
    if estimators:
        note(f"{len(estimators)} distinct estimator(s), one after another (each runs its configs on the whole GPU)")
        failed = _grade_estimators(root, estimators)
        for sub in subs:
            sub.not_answered = failed.get((sub.ex.id, sub.script), "")
    return len(todo)


def _require_a_sandbox() -> None:
    """An estimator is graded sandboxed or not at all: a machine without the sandbox is the instructor's to change."""
    from oomlab.measure.sandbox import availability

    abi, why = availability()
    if not abi:
        raise instructors_error(
            OomLabError(f"the sandbox that keeps an estimator from the GPU and the answers is unavailable here ({why}).")
        )


def _grade_estimators(root: Path, estimators: list[_Submission]) -> dict[tuple[str, str], str]:
    """Grade each estimator once, as its notebook would, one after another, and keep each grade for its notebooks.

    Returns those that gave no answers to grade (their own error: it does not load, raises, answers nonsense), each
    with the error on one line; a machine that cannot measure the configs stops the class.
    """
    failed = {}
    for sub in estimators:
        path = _script_path(sub)
        write_atomic(path, sub.script)
        try:
            # Sandboxed, with the whole class folder out of reach, as a script's run is.
            report = grade_estimate(sub.ex, path, strict=True, hide=(root,))
        except MeasuringFailed as err:
            raise instructors_error(err) from None
        except OomLabError as err:
            lines = err.what.strip().splitlines()
            failed[(sub.ex.id, sub.script)] = " ".join(dict.fromkeys([lines[0], lines[-1]]))  # what, and its last frame
            continue
        measured.store_estimate(sub.ex, sub.script, report)
    return failed


def _measure_scripts(root: Path, todo: dict[tuple[str, str], _Submission], jobs: int, note: Callable[[str], None]) -> None:
    """Measure every distinct script once, ``jobs`` at a time, and keep each measurement for its notebooks."""
    pinned = root / PINNED
    exercises = list({s.ex.id: s.ex for s in todo.values()}.values())
    confs = [ex.alloc_conf for ex in exercises] + [c for _, text in todo if (c := declared_alloc_conf(text)) is not None]

    def one(sub: _Submission) -> None:
        path = _script_path(sub)
        write_atomic(path, sub.script)
        # Sandboxed with the whole class folder out of reach (other students' work, the pinned course, the
        # gradebook), and witnessed by the driver: a grade others rely on, or none (a machine problem stops the class).
        m = measure_exercise_file(sub.ex, path, sandbox_required=True, hide=(root,))
        if m.status in MACHINE_PROBLEMS:
            raise machine_error(m, sub.ex)
        require_witness(m, sub.ex)
        measured.store(sub.ex, sub.script, m)

    with contextlib.ExitStack() as stack:
        for server in stack.enter_context(warm.serving(pinned, confs, child_env)):
            server.wait_ready()
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=jobs))
        note(f"the reference fixes of {len(exercises)} exercise(s)")
        for ex, ref in zip(exercises, pool.map(measure_reference, exercises), strict=True):
            if ref.status in MACHINE_PROBLEMS:  # said to the instructor, whose gradebook is untouched so far
                raise instructors_error(machine_error(ref, ex))
        note(f"{len(todo)} distinct script(s), {jobs} at a time")
        list(pool.map(one, todo.values()))


def instructors_error(err: OomLabError) -> OomLabError:
    """A machine that cannot measure, said to the instructor: what it lacks, and that nothing was graded."""
    return OomLabError(
        f"Nothing was graded, and the gradebook is as it was: {err.what}",
        "Grade the class on a machine with an NVIDIA GPU that fits the course's budgets (`oomlab doctor` there says "
        "whether it does), with `oomlab nbgrader autograde` or plain `nbgrader autograde`.",
    )


def _script_path(sub: _Submission) -> Path:
    """Where a submission's script is measured: one folder per distinct script, the file named as the notebook writes it."""
    return (
        StateDir(sub.ex.root).path / "class" / "scripts" / measured.cache_path(sub.ex, sub.script).stem / script_name(sub.ex.id)
    )


def _autograde(root: Path, assignment: str, students: list[str], jobs: int, note: Callable[[str], None]) -> dict[str, str]:
    """``nbgrader autograde`` over ``students`` in ``jobs`` processes at once; the students it failed for, each with its error.

    Each process grades a share of the class (importing nbgrader costs a process seconds,
    grading a notebook about one), and its log is cut into one log per student. A student
    whose grading the machine spoiled (a kernel that did not start, a gradebook locked), or
    whom a process never reached, is graded again in a process of its own.
    """
    logs = StateDir(root / PINNED).path / "class" / "logs" / assignment
    logs.mkdir(parents=True, exist_ok=True)
    submitted = root / "submitted"
    everyone = set(students) | ({p.name for p in submitted.iterdir() if p.is_dir()} if submitted.is_dir() else set())

    def run(group: list[str]) -> dict[str, tuple[int, str]]:
        """Grade ``group`` in one process; each student it reached, with its exit status and its part of the log."""
        alone = len(group) == 1 or any("," in s for s in everyone)  # nbgrader's exclude list is comma-separated
        if alone and len(group) > 1:
            return {k: v for s in group for k, v in run([s]).items()}
        chosen = (
            ["--student", group[0]]
            if alone
            else [
                "--CourseDirectory.student_id=*",
                f"--CourseDirectory.student_id_exclude={','.join(sorted(everyone - set(group)))}",
            ]
        )
        path = logs / (f"{group[0]}.log" if alone else f"students-{group[0]}-and-{len(group) - 1}-more.log")
        with path.open("w", encoding="utf-8") as log:  # written as nbgrader goes, so a slow student can be followed
            code = subprocess.run(
                [sys.executable, "-m", "nbgrader", "autograde", assignment, *chosen, "--force"],
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**nbgrader_env(), CHECKED: "1"},  # the reference fixes were measured: this machine can grade
            ).returncode
        text = path.read_text(encoding="utf-8", errors="replace")
        if alone:
            return {group[0]: (code, text)}
        parts = _per_student(text, group)
        for student, (_, part) in parts.items():
            write_atomic(logs / f"{student}.log", part)
        if code != 0 and parts and SEE_ABOVE not in text:
            # nbgrader ended without its closing summary (it crashed): in the last part it reached, so that student
            # is graded again alone, to say whose error it is; those it never reached are graded alone too
            del parts[list(parts)[-1]]
        return {student: (1 if failed else 0, part) for student, (failed, part) in parts.items()}

    def spoiled(log: str) -> bool:
        return any(s in log for s in KERNEL_NOT_STARTED)

    shares = [share for share in (students[i :: max(1, jobs)] for i in range(max(1, jobs))) if share]
    results: dict[str, tuple[int, str]] = {}
    tries = dict.fromkeys(students, 0)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        todo = shares
        while todo:
            for graded in pool.map(run, todo):
                for student, result in graded.items():
                    tries[student] += 1
                    results[student] = result
            again = [s for s in students if s not in results or (spoiled(results[s][1]) and tries[s] < KERNEL_TRIES)]
            for student in again:
                if student in results:
                    note(f"a kernel did not start for {student}: grading again")
            todo = [[s] for s in again]
    for student in [s for s, (_, log) in results.items() if LOCKED in log]:
        # SQLite lets one writer in at a time: a run that waited too long goes again, alone
        note(f"the gradebook was busy for {student}: grading again")
        results[student] = run([student])[student]
    return {s: _nbgrader_error(log) for s, (code, log) in sorted(results.items()) if code != 0 or NBGRADER_FAILED in log}


def _per_student(log: str, group: list[str]) -> dict[str, tuple[bool, str]]:
    """An nbgrader log of several students cut at each student's first line; for each student it reached, in order,
    whether nbgrader says it failed, and its part (without the summary nbgrader writes at the end)."""
    failed = {m["student"] for m in FAILED_FOR.finditer(log)}
    parts: dict[str, list[str]] = {}
    current = None
    for line in log.splitlines(keepends=True):
        if m := STUDENT_STARTS.search(line):
            current = m["student"]
        if FAILED_FOR.search(line) or SEE_ABOVE in line:
            continue
        if current in group:
            parts.setdefault(current, []).append(line)
    return {student: (student in failed, "".join(lines)) for student, lines in parts.items()}


def _nbgrader_error(log: str) -> str:
    """What went wrong, from an nbgrader log: the exception that ends its first logged traceback, else its first error
    line, else its last line (the exception of a traceback that nbgrader did not catch)."""
    lines = log.splitlines()
    errors = [i for i, line in enumerate(lines) if "| ERROR]" in line]
    for i in errors:
        if lines[i].endswith("Traceback (most recent call last):"):
            block = []
            for line in lines[i + 1 :]:
                if line.startswith("["):
                    break
                block.append(line.strip())
            if block := [line for line in block if line]:
                return block[-1][:300]
    return (
        lines[errors[0]].split("]", 1)[-1].strip()[:300]
        if errors
        else (log.strip().splitlines() or ["nbgrader printed nothing"])[-1][:300]
    )


def nbgrader_env() -> dict:
    """The environment for an nbgrader command: this Python's scripts first on PATH, since nbgrader runs ``alembic``
    from PATH when it makes the gradebook, and ``jupyter`` to start kernels."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]), "PYTHONUNBUFFERED": "1"}


def _judged(sub: _Submission) -> tuple[list[str], dict[str, str]]:
    """Why the notebook lost points, from the same measurement and checks its cells used; and each failed check's line."""
    if sub.problem:
        return [sub.problem], {}
    if sub.ex.is_estimate:
        return _judged_estimate(sub)
    m = measured.load(sub.ex, _script_path(sub))
    if m is None:
        return ["not measured before autograde: the notebook measured it itself (see its feedback)"], {}
    report = grade(sub.ex, Path(m.script), measurement=m)
    if unfinished(report):  # it did not run to its end (a check may say why: the sandbox)
        failed = [c for c in report.checks if not c.passed]
        return [m.ending(), *map(check_line, failed)], {c.name: check_line(c) for c in failed}
    honesty = set(honesty_checks(sub.ex))
    memory = set(memory_checks(sub.ex))
    reasons = [
        check_line(c) + (" (no memory points while it fails)" if c.name in honesty else "")
        for c in report.checks
        if not c.passed and c.name in honesty | memory
    ]
    return reasons, {c.name: check_line(c) for c in report.checks if not c.passed}


def _judged_estimate(sub: _Submission) -> tuple[list[str], dict[str, str]]:
    """Why an estimate's notebook lost points, from the grade its cells used: each part off on some hidden config."""
    if sub.not_answered:
        return [sub.not_answered], {}
    report = measured.load_estimate(sub.ex, _script_path(sub))
    if report is None:
        return ["not graded before autograde: the notebook graded it itself (see its feedback)"], {}
    lines = {part: part_line(report, part) for part in failed_parts(report)}
    return list(lines.values()), lines


def _scores(root: Path, assignment: str, rows: list[Row], graded: set[str]) -> None:
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for row in rows:
            try:
                nb = gb.find_submission_notebook(row.notebook, assignment, row.student)
            except MissingEntry:
                if row.student in graded:
                    row.reasons.insert(0, "nbgrader recorded no grade (its log says why)")
                else:  # nothing of theirs could be read: nbgrader had nothing to grade
                    row.score = 0.0
                    with contextlib.suppress(MissingEntry):
                        row.max_score = gb.find_notebook(row.notebook, assignment).max_score
                continue
            row.score, row.max_score = nb.score, nb.max_score
            row.points = {g.name: [g.score, g.max_score] for g in sorted(nb.grades, key=lambda g: g.name)}
            if nb.needs_manual_grade:
                row.reasons.append("the interview answer waits for manual grading")


def grade_class(
    assignment: str, students: list[str] | None = None, jobs: int | None = None, note: Callable[[str], None] = lambda _: None
) -> ClassReport:
    """Grade every collected submission of ``assignment`` (or those of ``students``); see the module's docstring."""
    root = course_folder()
    course = Course(root / PINNED, working_tree=True)  # the instructor's pinned copy: its manifests are the ones
    subs = _submissions(root, course, assignment, list(students or []))
    if not subs:
        raise OomLabError(
            f"Nobody has submitted {assignment} under {shown(root / 'submitted')}.", "Collect the submissions first."
        )
    budgets = [ex.budget_bytes for ex in assignments(course)[assignment]]
    jobs = jobs or parallel_runs(budgets)
    start = time.perf_counter()
    n = _measure_all(root, subs, jobs, note)
    measure_s = time.perf_counter() - start
    _set_aside(subs)  # only now: without a GPU, nothing is touched
    # A student with no readable notebook has nothing for nbgrader to grade (it would fail on them): zero, with the reasons.
    everyone = sorted({s.student for s in subs if s.path.is_file()})
    note(f"nbgrader autograde for {len(everyone)} student(s), {jobs} at a time")
    start = time.perf_counter()
    failed = _autograde(root, assignment, everyone, jobs, note) if everyone else {}
    autograde_s = time.perf_counter() - start
    rows = [Row(s.student, s.ex.id, *_judged(s)) for s in subs]
    _scores(root, assignment, rows, set(everyone))
    for row in rows:
        if row.student in failed:
            row.reasons.insert(0, f"nbgrader could not autograde it: {failed[row.student]}")
    report = ClassReport(assignment, rows, jobs, n, measure_s, autograde_s, failed)
    write_atomic(root / "reports" / f"{assignment}.json", json.dumps(report.to_json(), indent=1) + "\n")
    write_atomic(root / "reports" / f"{assignment}-checks.csv", checks_csv(rows))
    return report


def checks_csv(rows: list[Row]) -> str:
    """One line per student and exercise: the notebook's score, then each graded cell's points and why it lost them.

    Columns are the union of every notebook's graded cells, in order; a cell a notebook does not have is left empty.
    """
    cells = sorted({name for row in rows for name in row.points}, key=lambda n: (n == "interview-answer", n))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    header = ["student", "exercise", "score", "max_score"]
    for name in cells:
        header += [f"{name} points", f"{name} max", f"{name} why"]
    writer.writerow([*header, "notes"])
    for row in sorted(rows, key=lambda r: (r.student, r.notebook)):
        line = [row.student, row.notebook, _number(row.score), _number(row.max_score)]
        for name in cells:
            score, most = row.points.get(name, [None, None])
            check = graded_name(name)
            lost = score is not None and most is not None and score < most
            line += [_number(score), _number(most), row.why.get(check, "") if lost else ""]
        writer.writerow([*line, "; ".join(row.reasons)])
    return out.getvalue()


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"
