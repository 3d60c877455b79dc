"""A class of N students for the grading benchmark, made from the exercises' own variants.

Student ``k`` submits, for each exercise of the assignment, variant ``k`` modulo the
exercise's variants, in the order the manifest gives them: the reference fix, the
seeded bug, each tempting wrong fix, each accepted alternative. So a class holds
every kind of submission the truth check measures, in about equal numbers, and
each has a known verdict: the fixes earn every memory point (an estimate, every part), the rest do not.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from oomlab.classroom.build import assignments, build_course
from oomlab.classroom.classgrade import nbgrader_env
from oomlab.classroom.layout import EXERCISE_ROLE, PINNED
from oomlab.classroom.scoring import POINTS_PER_CHECK, graded, magic_line
from oomlab.course import Course
from oomlab.errors import OomLabError
from oomlab.grading.truth import variants as truth_variants

__all__ = ["bench_class", "make_class"]


def variants(ex) -> list[tuple[str, str, bool]]:
    """(name, script, whether it is a fix) for each variant of ``ex`` the truth check measures, but its cheats."""
    return [
        ("reference" if v.kind == "solution" else v.name, v.source(), not v.expect)
        for v in truth_variants(ex)
        if v.kind != "cheat"
    ]


def make_class(root: Path, assignment: str, students: int) -> dict[tuple[str, str], tuple[str, bool]]:
    """Write ``students`` submissions of ``assignment`` under ``submitted/``; (student, exercise) -> (variant, is a fix)."""
    course = Course(root / PINNED, working_tree=True)  # the instructor's pinned copy grades as it is
    made = {}
    for ex in assignments(course)[assignment]:
        release = json.loads((root / "release" / assignment / f"{ex.id}.ipynb").read_text(encoding="utf-8"))
        runs = variants(ex)
        for k in range(students):
            name, script, fix = runs[k % len(runs)]
            student = f"student-{k + 1:03d}"
            for cell in release["cells"]:
                if cell["metadata"].get("oomlab", {}).get("role") == EXERCISE_ROLE:
                    cell["source"] = f"{magic_line(ex.id)}\n{script}"
            folder = root / "submitted" / student / assignment
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{ex.id}.ipynb").write_text(json.dumps(release), encoding="utf-8")
            made[(student, ex.id)] = (name, fix)
    return made


def bench_class(folder: Path, assignment: str, students: int) -> dict:
    """Build a course, release ``assignment``, make a class, and time ``oomlab nbgrader autograde`` on it."""
    root = build_course(folder / "class").root
    env = nbgrader_env()
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "generate_assignment", assignment], cwd=root, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise OomLabError(
            f"nbgrader generate_assignment failed: {(done.stdout + done.stderr)[-800:]}", "Run it by hand to see why."
        )
    made = make_class(root, assignment, students)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "oomlab", "nbgrader", "autograde", assignment], cwd=root, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise OomLabError(f"oomlab nbgrader autograde failed: {(done.stdout + done.stderr)[-800:]}", "Run it by hand to see why.")
    report = json.loads((root / "reports" / f"{assignment}.json").read_text(encoding="utf-8"))
    course = Course(root / PINNED, working_tree=True)  # the instructor's pinned copy grades as it is
    wrong = []
    for row in report["rows"]:
        variant, fix = made[(row["student"], row["notebook"])]
        full = POINTS_PER_CHECK * len(graded(course.get(row["notebook"])))
        if ((row["score"] or 0) == full) != fix:  # the interview answers are left blank: the score is the memory points
            wrong.append(f"{row['student']} {row['notebook']} ({variant}): {row['score']}")
    return {
        "assignment": assignment,
        "students": students,
        "notebooks": len(made),
        "wall_s": round(wall, 1),
        "measure_s": report["measure_s"],
        "autograde_s": report["autograde_s"],
        "jobs": report["jobs"],
        "scripts_measured": report["scripts_measured"],
        "verdicts_as_expected": not wrong and not report["students_nbgrader_failed"],
        "unexpected": (wrong + [f"{s}: nbgrader: {e}" for s, e in report["students_nbgrader_failed"].items()])[:20],
    }
