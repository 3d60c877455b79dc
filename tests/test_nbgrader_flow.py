"""The instructors' flow end to end, with nbgrader itself: build, generate_assignment, autograde, feedback, export.

The submissions are the ones an instructor meets: the reference fix, the untouched
bug, a syntax error, a crash, a hang, a run that resets the peak statistics, one
that serves fewer requests, a cell that patches the grader, an edited locked cell, deleted cells, an exercise
cell without its first line, grading helpers handed in beside the notebook. Without a GPU nothing is measured,
so every memory check scores zero and says so; the cheats that need no GPU to succeed (a patched
grader, an emptied locked cell, a grader handed in) would score here if they got through, so their
zeros are real verdicts. On a GPU the same flow grades for real.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from oomlab.classroom.build import build_course
from oomlab.classroom.classgrade import _autograde, nbgrader_env
from oomlab.classroom.preprocessors import script_of
from oomlab.classroom.scoring import POINTS_PER_CHECK, magic_line, memory_checks, script_name
from oomlab.course import Course
from oomlab.grading.pytest_plugin import cuda_available
from tests.forked_commands import nbgrader_commands

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

REPO = Path(__file__).resolve().parents[1]
ASSIGNMENT, EXERCISE = "production", "inference-worker"  # one notebook: the flow, not the curriculum, is under test
GPU = cuda_available()


def nbgrader(root: Path, *args: str) -> subprocess.CompletedProcess:
    done = nbgrader_commands.run(list(args), root, nbgrader_env())  # a process of its own, nbgrader imported once
    assert done.returncode == 0 and "ERROR" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def cell(nb: dict, *, role: str | None = None, grade_id: str | None = None) -> dict:
    for c in nb["cells"]:
        if role and c["metadata"].get("oomlab", {}).get("role") == role:
            return c
        if grade_id and c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            return c
    raise KeyError(role or grade_id)


def text(c: dict) -> str:
    return "".join(c["source"]) if isinstance(c["source"], list) else c["source"]


def submissions(release: dict, bug: str, fix: str) -> dict[str, dict]:
    """Each kind of submission, made from the released notebook as a student would edit it."""
    magic = magic_line(EXERCISE) + "\n"
    ex = Course(REPO).get(EXERCISE)
    first_check = f"check-{memory_checks(ex)[0]}"
    fewer = next(f for f in ex.wrong_fixes if f.name == "serve-fewer-requests")  # the manifest's own way to do less work

    def edited(change) -> dict:
        nb = json.loads(json.dumps(release))
        change(nb)
        return nb

    def exercise(source: str):
        return lambda nb: cell(nb, role="exercise").update(source=source)

    def answered(nb):
        exercise(magic + fix)(nb)
        cell(nb, grade_id="interview-answer").update(source="I read reserved against allocated first, then the snapshot.")

    def patch_the_grader(nb):
        at = nb["cells"].index(cell(nb, role="exercise")) + 1
        patch = "from oomlab.classroom import cells\ncells.check = lambda *a: None\ncells.honest = lambda *a: None\n"
        nb["cells"].insert(
            at, {"cell_type": "code", "metadata": {}, "source": patch, "outputs": [], "execution_count": None, "id": "x"}
        )

    def drop(keep):
        return lambda nb: nb.update(cells=[c for c in nb["cells"] if keep(c)])

    graded = lambda c: c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade")  # noqa: E731
    return {
        "reference": edited(answered),
        "untouched": edited(lambda nb: None),
        "syntax-error": edited(exercise(magic + bug + "\nthis is not python(\n")),
        "crash": edited(exercise(magic + "raise RuntimeError('the data loader died')\n" + bug)),
        "hang": edited(exercise(magic + "import time\ntime.sleep(10**6)\n" + fix)),
        "reset-peak-stats": edited(exercise(magic + fix + "\ntorch.cuda.reset_peak_memory_stats()\n")),
        "serves-fewer-requests": edited(exercise(magic + fewer.apply(bug))),
        "patches-the-grader": edited(patch_the_grader),
        "empties-a-locked-cell": edited(lambda nb: cell(nb, grade_id=first_check).update(source="pass")),
        "deletes-graded-cells": edited(drop(lambda c: not graded(c))),
        "deletes-the-exercise": edited(drop(lambda c: c["metadata"].get("oomlab", {}).get("role") != "exercise")),
        "no-first-line": edited(exercise(fix)),
        "shadow-package": edited(lambda nb: None),  # with handed_in(): the grader's own modules, faked, beside it
    }


def handed_in(markers: Path) -> dict[str, dict[str, str]]:
    """Files each student hands in beside the notebook: a fake ``oomlab.classroom.cells`` whose every check passes, and
    packages named as ones the kernel imports as it starts or the cells import. Each one that is imported says so in
    ``markers``."""
    mark = lambda name: f"open({str(markers / name)!r}, 'w').close()\n"  # noqa: E731
    passes = "def measure(*args, **kwargs):\n    print('passes')\n\n\ndef check(*args):\n    print('PASS')\n\n\nhonest = check\n"
    return {
        "shadow-package": {
            "oomlab/__init__.py": mark("oomlab"),
            "oomlab/classroom/__init__.py": "",
            "oomlab/classroom/cells.py": mark("oomlab.classroom.cells") + passes,
            "traitlets/__init__.py": mark("traitlets"),
            "rich/__init__.py": mark("rich"),
            "timestamp.txt": "2030-01-01 00:00:00.000000 UTC",  # nbgrader's own, as submit writes them: kept
            "submission_secret.txt": "0123456789abcdef",
        }
    }


# What each submission scores: on a GPU the honest fixes earn every memory point; without one nothing is measured.
FIXED = {"reference", "no-first-line"}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class") / "oomlab-class"
    build_course(root)
    nbgrader(root, "generate_assignment", ASSIGNMENT)
    release = json.loads((root / "release" / ASSIGNMENT / f"{EXERCISE}.ipynb").read_text())
    bug = (root / "oomlab-course" / "exercises" / EXERCISE / "train.py").read_text()
    fix = (root / "oomlab-course" / "solutions" / EXERCISE / "train.py").read_text()
    subs = submissions(release, bug, fix)
    markers = root.parent / "imported"
    markers.mkdir()
    beside = handed_in(markers)
    for student, nb in subs.items():
        folder = root / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{EXERCISE}.ipynb").write_text(json.dumps(nb))
        for rel, content in beside.get(student, {}).items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(content)
    failed = _autograde(root, ASSIGNMENT, sorted(subs), 2, lambda _: None)
    nbgrader(root, "generate_feedback", ASSIGNMENT)
    nbgrader(root, "export")
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission_notebook(EXERCISE, ASSIGNMENT, s).score for s in subs}
        manual = {s: gb.find_submission_notebook(EXERCISE, ASSIGNMENT, s).needs_manual_grade for s in subs}
    return {
        "root": root,
        "release": release,
        "bug": bug,
        "failed": failed,
        "scores": scores,
        "manual": manual,
        "students": subs,
        "markers": markers,
        "handed_in": beside,
    }


def autograded(graded, student: str) -> dict:
    return json.loads((graded["root"] / "autograded" / student / ASSIGNMENT / f"{EXERCISE}.ipynb").read_text())


def outputs(c: dict) -> str:
    return "\n".join("".join(o.get("text", "")) + "\n".join(o.get("traceback", [])) for o in c.get("outputs", []))


def test_the_release_gives_students_the_bug_and_no_answers(graded):
    release, bug = graded["release"], graded["bug"]
    assert text(cell(release, role="exercise")) == magic_line(EXERCISE) + "\n" + bug
    everything = json.dumps(release)
    assert "BEGIN HIDDEN TESTS" not in everything and "cells.honest" not in everything
    ex = Course(REPO).get(EXERCISE)
    assert ex.interview.answer.splitlines()[0] not in everything
    assert "YOUR ANSWER HERE" in text(cell(release, grade_id="interview-answer"))


def test_no_submission_stops_the_grading_run(graded):
    assert graded["failed"] == {}
    assert set(graded["scores"]) == set(graded["students"])


def test_each_submission_scores_as_it_should(graded):
    ex = Course(REPO).get(EXERCISE)
    full = POINTS_PER_CHECK * len(memory_checks(ex))
    expected = {s: (full if GPU and s in FIXED else 0.0) for s in graded["students"]}
    assert graded["scores"] == expected


# What a cell says where nothing can be measured: with no NVIDIA driver (it is said before torch is imported), or
# with one but no GPU visible to torch.
NO_GPU = "needs an NVIDIA GPU"


def test_every_zero_says_why(graded):
    why = {
        "syntax-error": "syntax error",
        "deletes-the-exercise": f"{EXERCISE}.py was not written",
        "crash": "the data loader died" if GPU else NO_GPU,
        "hang": "Time limit" if GPU else NO_GPU,
        "reset-peak-stats": "untampered" if GPU else NO_GPU,
        "serves-fewer-requests": "same_workload" if GPU else NO_GPU,
        "untouched": "no_oom" if GPU else NO_GPU,
    }
    for student, reason in why.items():
        nb = autograded(graded, student)
        checks = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"]
        assert checks, student
        scored_zero = [bool(c["outputs"]) and c["outputs"][-1]["output_type"] == "error" for c in checks]
        assert all(scored_zero), student
        assert reason in "\n".join(outputs(c) for c in checks), student
        if not GPU:  # nothing was measured: every cell says why, the same way
            assert all(reason in outputs(c) for c in checks), student
        assert reason in (graded["root"] / "feedback" / student / ASSIGNMENT / f"{EXERCISE}.html").read_text()


def test_a_cell_that_patches_the_grader_is_not_run(graded):
    nb = autograded(graded, "patches-the-grader")
    assert [c["cell_type"] for c in nb["cells"] if "cells.check = lambda" in text(c)] == ["raw"]
    assert "were not run" in text(nb["cells"][0])


def test_a_grader_handed_in_beside_the_notebook_is_never_imported(graded):
    """Its fake checks would pass every cell, here without a GPU too: the zero is the real verdict, and the note says why."""
    assert graded["scores"]["shadow-package"] == 0.0
    assert sorted(p.name for p in graded["markers"].iterdir()) == [], "the grading kernel imported a file handed in"
    graded_copy = graded["root"] / "autograded" / "shadow-package" / ASSIGNMENT
    kept = [f"{EXERCISE}.ipynb", f"{EXERCISE}.py", "submission_secret.txt", "timestamp.txt"]
    assert sorted(p.name for p in graded_copy.iterdir()) == kept
    submitted = graded["root"] / "submitted" / "shadow-package" / ASSIGNMENT
    assert all((submitted / rel).is_file() for rel in graded["handed_in"]["shadow-package"]), "the student's own copy is kept"
    nb = autograded(graded, "shadow-package")
    assert "Not used at grading: oomlab/, rich/, traitlets/." in text(nb["cells"][0])
    checks = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade") and c["cell_type"] == "code"]
    assert all(c["outputs"][-1]["output_type"] == "error" and "PASS" not in outputs(c) for c in checks)
    feedback = (graded["root"] / "feedback" / "shadow-package" / ASSIGNMENT / f"{EXERCISE}.html").read_text()
    assert "Not used at grading: oomlab/, rich/, traitlets/." in feedback


def test_an_emptied_locked_cell_is_graded_as_released(graded):
    nb = autograded(graded, "empties-a-locked-cell")
    assert all(text(c) != "pass" for c in nb["cells"])


def test_deleted_graded_cells_are_put_back_after_the_exercise(graded):
    nb = autograded(graded, "deletes-graded-cells")
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id") or c["metadata"].get("oomlab", {}).get("role") for c in nb["cells"]]
    ex = Course(REPO).get(EXERCISE)
    checks = [f"check-{n}" for n in memory_checks(ex)]
    assert all(ids.index("exercise") < ids.index(c) for c in checks)
    assert "put back" in text(nb["cells"][0])


def test_an_exercise_cell_without_its_first_line_is_measured_not_run(graded):
    nb = autograded(graded, "no-first-line")
    assert text(cell(nb, role="exercise")).startswith(magic_line(EXERCISE) + "\n")
    assert (graded["root"] / "autograded" / "no-first-line" / ASSIGNMENT / f"{EXERCISE}.py").is_file()


def test_the_written_script_is_the_cell_below_its_first_line(graded):
    written = (graded["root"] / "autograded" / "untouched" / ASSIGNMENT / f"{EXERCISE}.py").read_text()
    assert written == graded["bug"]


def test_a_written_answer_waits_for_the_instructor(graded):
    assert graded["manual"]["reference"] is True
    assert graded["manual"]["untouched"] is False


def test_export_lists_every_student(graded):
    with open(graded["root"] / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["student_id"] for r in rows} == set(graded["students"])


@pytest.mark.gpu
def test_grading_the_class_at_once_scores_as_nbgrader_alone_does(graded, monkeypatch):
    """``oomlab nbgrader autograde`` (measured first, many at once) against the plain autograde above: the same scores."""
    from oomlab.classroom.classgrade import grade_class

    monkeypatch.chdir(graded["root"])
    report = grade_class(ASSIGNMENT)
    assert {r.student: r.score for r in report.rows} == graded["scores"]
    # each distinct script once: the copies of the untouched bug (under a patched grader, an emptied or deleted
    # graded cell, beside a grader handed in) are one run, the fix with and without its first line another, and a
    # deleted exercise is none
    scripts = {
        script_of(nbformat.from_dict(c), script_name(EXERCISE))
        for nb in graded["students"].values()
        for c in nb["cells"]
        if c["metadata"].get("oomlab", {}).get("role") == "exercise"
    }
    assert report.measured == len(scripts) == len(graded["students"]) - 6
    by_student = {r.student: r for r in report.rows}
    assert any("untampered" in why for why in by_student["reset-peak-stats"].reasons)
    assert by_student["reference"].reasons == ["the interview answer waits for manual grading"]


def test_the_class_report_reads_the_gradebook(graded):
    """Scores as nbgrader recorded them; a student nbgrader had nothing of to grade scores zero out of the notebook's points."""
    from oomlab.classroom.classgrade import Row, _scores

    rows = [Row("reference", EXERCISE), Row("unreadable-only", EXERCISE, reasons=["the notebook could not be read"])]
    _scores(graded["root"], ASSIGNMENT, rows, {"reference"})
    assert rows[0].score == graded["scores"]["reference"] and rows[0].reasons == ["the interview answer waits for manual grading"]
    ex = Course(REPO).get(EXERCISE)
    from oomlab.classroom.scoring import ANSWER_POINTS

    assert (rows[1].score, rows[1].max_score) == (0.0, POINTS_PER_CHECK * len(memory_checks(ex)) + ANSWER_POINTS)
    assert rows[1].reasons == ["the notebook could not be read"]
