"""The nbgrader course's parts, without nbgrader running: notebooks, the build, the cells' scoring, a class's submissions."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from nbgrader.converters.autograde import Autograde
from nbgrader.nbgraderformat import MetadataValidator
from nbgrader.preprocessors import Execute
from traitlets.config import Config
from traitlets.utils.importstring import import_item

from oomlab.classroom import cells, classgrade
from oomlab.classroom.autograde_guard import CHECKED, UNREADABLE, before_autograde
from oomlab.classroom.build import build_course, config_text
from oomlab.classroom.classgrade import KERNEL_TRIES, _autograde, _set_aside, _submissions
from oomlab.classroom.handin import clear
from oomlab.classroom.kernel import GradingKernel
from oomlab.classroom.layout import BUILT, CONFIG, LOAD_OURS, OURS, PINNED
from oomlab.classroom.notebook import INSTALLED_ONLY, build_notebook
from oomlab.classroom.scoring import honesty_checks, magic_line, memory_checks
from oomlab.classroom.student import ANSWER_KEPT
from oomlab.course import Course
from oomlab.course.manifest import load_exercise
from oomlab.course.originals import shipped_source
from oomlab.errors import OomLabError
from oomlab.grading.checks import ALWAYS, CHECKS, CheckResult
from oomlab.grading.truth import source_digest
from oomlab.grading.verdict import Report
from oomlab.measure.harness import Measurement
from tests.forked_commands import nbgrader_commands

REPO = Path(__file__).resolve().parents[1]
COURSE = Course(REPO, working_tree=True)  # what `oomlab nbgrader build` and the student wheel are made from


def test_the_checks_that_earn_points_are_the_memory_checks_and_none_of_those_every_run_gets():
    earning = {name for name, check in CHECKS.items() if check.earns_points}
    assert earning == {"no_oom", "peak_allocated", "peak_reserved", "inactive_split_peak", "retries", "plateau"}
    assert not earning & set(ALWAYS), "a check every run gets would give every notebook its points"


@pytest.mark.parametrize("ex", COURSE.scripts, ids=lambda e: e.id)  # an estimate's: tests/test_classroom_estimates.py
def test_each_exercise_notebook_is_its_folder(ex):
    nb = build_notebook(ex)
    nbformat.validate(nb)
    MetadataValidator().validate_nb(nb)  # what nbgrader checks before it generates an assignment
    exercise = [c for c in nb.cells if c.metadata.get("oomlab", {}).get("role") == "exercise"]
    assert [c.source for c in exercise] == [f"{magic_line(ex.id)}\n{shipped_source(ex)}"]
    assert "nbgrader" not in exercise[0].metadata, "generate_assignment would replace a solution cell with a stub"
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    assert [c.metadata.nbgrader.grade_id for c in graded] == [f"check-{n}" for n in memory_checks(ex)]
    assert memory_checks(ex), "every exercise has a check that earns points"
    for c in graded:
        hidden = c.source.split("### BEGIN HIDDEN TESTS\n", 1)[1]
        assert hidden.startswith(f"{INSTALLED_ONLY}\ncells.honest({ex.id!r})")
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "interview-answer")
    assert answer.metadata.nbgrader.solution and ex.interview.answer in answer.source
    assert f"sources={source_digest(ex)!r}" in json.dumps(nb.cells)


def test_the_exchange_is_a_folder_beside_the_course_that_only_the_instructor_writes(tmp_path, monkeypatch):
    """nbgrader's default exchange, made by release_assignment where it is missing, is writable by every user."""
    from traitlets.config.loader import PyFileConfigLoader

    root = build_course(tmp_path / "class").root
    monkeypatch.chdir(tmp_path)  # nbgrader runs in the course folder; the setting must not depend on it
    config = PyFileConfigLoader(CONFIG, path=str(root)).load_config()
    assert config.Exchange.root == str(root / "exchange")
    assert (root / "exchange").is_dir() and (root / "exchange").stat().st_mode & 0o022 == 0


def test_build_writes_the_course_and_a_rebuild_changes_nothing(tmp_path):
    built = build_course(tmp_path / "class")
    root = built.root
    assert (root / CONFIG).read_text().count(LOAD_OURS) == 1
    assert Course(root / PINNED).ids_in_order == COURSE.ids_in_order, "the pinned copy is a course of its own, in its order"
    assert list(built.assignments) == [m.name for m in COURSE.modules], "an assignment per module, in teaching order"
    for module, ids in built.assignments.items():
        assert sorted(p.stem for p in (root / "source" / module).glob("*.ipynb")) == sorted(ids)
    assert not list((root / "source").rglob("solutions")), "nothing under source/ is released that the students may not see"
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    again = build_course(root)
    assert again.removed == 0
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_rebuild_keeps_the_instructors_config_and_refuses_over_an_edit(tmp_path):
    root = build_course(tmp_path / "class").root
    mine = (root / CONFIG).read_text() + 'c.CourseDirectory.course_id = "gpu-101"\n'
    (root / CONFIG).write_text(mine)
    build_course(root)
    assert (root / CONFIG).read_text() == mine
    notebook = next((root / "source").rglob("*.ipynb"))
    notebook.write_text(notebook.read_text().replace("Interview question", "Interview"))
    edited = notebook.read_bytes()
    ours = (root / OURS).read_bytes()
    (root / OURS).write_text("# stale\n")  # ours is ours: a rebuild may write it, but not while an edit stands
    with pytest.raises(OomLabError, match=notebook.name):
        build_course(root)
    assert notebook.read_bytes() == edited and (root / OURS).read_text() == "# stale\n"
    assert ours != b"# stale\n"


def test_build_never_writes_into_a_folder_it_did_not_make(tmp_path):
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(OomLabError, match="not a course"):
        build_course(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
    (tmp_path / "mine.txt").unlink()
    build_course(tmp_path)
    (tmp_path / BUILT).write_text("{")
    with pytest.raises(OomLabError, match="damaged"):
        build_course(tmp_path)


@pytest.fixture
def class_folder(tmp_path, monkeypatch) -> Path:
    root = build_course(tmp_path / "class").root
    folder = root / "autograded" / "ada" / "production"
    folder.mkdir(parents=True)
    monkeypatch.chdir(folder)
    cells._last.clear()
    cells._pinned.clear()
    return root


def result(name: str, passed: bool) -> CheckResult:
    return CheckResult(name, passed, "measured", "required", "why it matters", "" if passed else "what differs")


def fake_report(ex_id: str, failing: set[str], root: Path) -> cells._Outcome:
    """A report with chosen checks failing: the cells' scoring is under test here, not the measuring."""
    ex = Course(root / PINNED).get(ex_id)
    names = honesty_checks(ex) + memory_checks(ex)
    m = Measurement(script="x.py", status="ok", stats={})
    return cells._Outcome(
        (Path.cwd() / f"{ex_id}.py").read_text(), Report(ex, m, m, [result(n, n not in failing) for n in names]), []
    )


def test_a_memory_check_earns_its_points_only_on_an_honest_run(class_folder, capsys):
    (Path.cwd() / "inference-worker.py").write_text("print('fixed')\n")
    cells._last["inference-worker"] = fake_report("inference-worker", set(), class_folder)
    cells.check("inference-worker", "no_oom")
    cells.honest("inference-worker")
    assert "PASS no_oom" in capsys.readouterr().out
    cells._last["inference-worker"] = fake_report("inference-worker", {"same_workload"}, class_folder)
    cells.check("inference-worker", "no_oom")  # what the learner sees: the memory check itself passed
    with pytest.raises(cells.CheckFailed) as err:
        cells.honest("inference-worker")  # what grading adds: the hidden part fails the cell
    assert "same_workload" in err.value.lines[0]
    cells._last["inference-worker"] = fake_report("inference-worker", {"no_oom"}, class_folder)
    with pytest.raises(cells.CheckFailed) as err:
        cells.check("inference-worker", "no_oom")
    assert err.value._render_traceback_()[0].startswith("CheckFailed: no_oom")
    assert "Why it matters" in err.value._render_traceback_()[-1]


def test_a_run_the_sandbox_stopped_is_not_graded_and_says_what_it_reached_for(class_folder, monkeypatch):
    """A run that ended reaching for what grading hides is a failed run with one check, ``sandbox``: every graded cell
    told the student the notebook "has no check 'no_oom'" and to rebuild the course, and the autograde report gave no
    reason at all (sandbox is none of the exercise's checks). It did not run to its end, as a crash did not, and both
    now say so, and what it reached for."""
    from oomlab.classroom import classgrade, measured
    from oomlab.grading import verdict
    from oomlab.measure import machine

    ex = Course(class_folder / PINNED).get("inference-worker")
    (Path.cwd() / "inference-worker.py").write_text("open('/course/solutions/train.py')\n")
    stopped = Measurement(script="inference-worker.py", status="error", message="Permission denied: '/course/solutions'")
    reached = CheckResult("sandbox", False, "reached for /course/solutions", "nothing grading keeps hidden", "why", "it tried")
    monkeypatch.setattr(machine, "refuse_without_a_driver", lambda *a: None)
    monkeypatch.setattr(measured, "load", lambda *a: stopped)
    monkeypatch.setattr(verdict, "grade", lambda *a, **k: Report(ex, stopped, None, [reached]))
    with pytest.raises(cells.NotGraded) as err:
        cells.check("inference-worker", "no_oom")
    assert err.value.lines[0].startswith("The script did not run to its end")
    assert "sandbox: reached for /course/solutions (required nothing grading keeps hidden): it tried" in err.value.lines
    monkeypatch.setattr(classgrade, "grade", lambda *a, **k: Report(ex, stopped, None, [reached]))
    monkeypatch.setattr(classgrade.measured, "load", lambda *a: stopped)
    sub = classgrade._Submission("ada", ex, Path.cwd() / "production.ipynb", script="open('/course/solutions/train.py')\n")
    reasons, lines = classgrade._judged(sub)
    assert reasons[1:] == ["sandbox: reached for /course/solutions (required nothing grading keeps hidden)"]
    assert list(lines) == ["sandbox"]


def test_plain_nbgrader_autograde_grades_a_script_as_strictly_as_oomlab_autograde(class_folder, monkeypatch):
    """Where `oomlab nbgrader autograde` measured nothing first (plain `nbgrader autograde`), the cell measures the
    script itself: strict, with the class folder (its pinned course's reference fixes, the other submissions) hidden.
    Outside a class, a released notebook's check is a learner's own, as `oomlab check`."""
    from oomlab.classroom import measured
    from oomlab.grading import verdict
    from oomlab.measure import machine

    ex = Course(class_folder / PINNED).get("inference-worker")
    (Path.cwd() / "inference-worker.py").write_text("print('fixed')\n")
    asked = []
    m = Measurement(script="inference-worker.py", status="ok", stats={})
    monkeypatch.setattr(machine, "refuse_without_a_driver", lambda *a: None)
    monkeypatch.setattr(measured, "load", lambda *a: None)
    monkeypatch.setattr(verdict, "grade", lambda ex_, script, **k: asked.append(k) or Report(ex, m, m, []))
    cells.measure("inference-worker", sources=source_digest(ex))
    assert asked == [{"measurement": None, "strict": True, "hide": (class_folder.resolve(),)}]
    outside = class_folder.parent / "released"
    outside.mkdir()
    monkeypatch.chdir(outside)
    (outside / "inference-worker.py").write_text("print('fixed')\n")
    cells._last.clear()
    monkeypatch.setattr(cells, "_exercise", lambda ex_id: ex)
    cells.measure("inference-worker", sources=source_digest(ex))
    assert asked[1] == {"measurement": None, "strict": False, "hide": ()}


def test_no_cell_passes_where_nothing_was_written(class_folder, capsys):
    ex = Course(class_folder / PINNED).get("inference-worker")
    cells.measure("inference-worker", sources=source_digest(ex))
    assert "inference-worker.py was not written" in capsys.readouterr().out
    with pytest.raises(cells.NotGraded, match="was not written"):
        cells.check("inference-worker", "no_oom")


def test_a_notebook_of_another_version_is_not_graded(class_folder, capsys):
    (Path.cwd() / "inference-worker.py").write_text("print('fixed')\n")
    cells.measure("inference-worker", sources="0" * 16)
    assert "another version of inference-worker" in capsys.readouterr().out
    with pytest.raises(cells.NotGraded, match="another version"):
        cells.check("inference-worker", "no_oom")


def test_an_unreadable_notebook_is_kept_aside_and_scores_zero_with_its_reason(class_folder):
    source = class_folder / "source" / "production" / "inference-worker.ipynb"
    for student, content in (("ada", None), ("bo", "this is not json"), ("cy", "")):
        folder = class_folder / "submitted" / student / "production"
        folder.mkdir(parents=True)
        if content is None:
            shutil.copy(source, folder)
        else:
            (folder / source.name).write_text(content)
    (class_folder / "submitted" / "dee" / "production").mkdir(parents=True)  # submitted the assignment, not this notebook
    subs = {s.student: s for s in _submissions(class_folder, Course(class_folder / PINNED), "production", [])}
    assert subs["ada"].script == shipped_source(Course(class_folder / PINNED).get("inference-worker"))
    assert (class_folder / "submitted" / "bo" / "production" / source.name).is_file(), "reading alone moves nothing"
    _set_aside(list(subs.values()))
    for student in ("bo", "cy"):
        assert "could not be read" in subs[student].problem
        kept = class_folder / "submitted" / student / "production" / (source.name + UNREADABLE)
        assert kept.is_file() and not kept.with_suffix("").exists()
    assert (class_folder / "submitted" / "bo" / "production" / (source.name + UNREADABLE)).read_text() == "this is not json"
    assert subs["dee"].problem == "not submitted"
    with pytest.raises(OomLabError, match="no submission"):
        _submissions(class_folder, Course(class_folder / PINNED), "production", ["zed"])
    with pytest.raises(OomLabError, match="no assignment"):
        _submissions(class_folder, Course(class_folder / PINNED), "nope", [])


def oomlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``oomlab ARGS`` in a process of its own, forked from one that imported nbgrader once."""
    env = {**os.environ, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    return nbgrader_commands.run(list(args), cwd, env, 300, program="oomlab")


def test_autograde_without_a_gpu_says_so_and_leaves_the_gradebook_alone(class_folder):
    folder = class_folder / "submitted" / "ada" / "production"
    folder.mkdir(parents=True)
    shutil.copy(class_folder / "source" / "production" / "inference-worker.ipynb", folder)
    (class_folder / "submitted" / "bo" / "production").mkdir(parents=True)
    (class_folder / "submitted" / "bo" / "production" / "inference-worker.ipynb").write_text("not json")
    done = oomlab(class_folder, "nbgrader", "autograde", "production")
    assert done.returncode == 2, done.stdout + done.stderr
    assert (class_folder / "submitted" / "bo" / "production" / "inference-worker.ipynb").read_text() == "not json"
    out = " ".join(done.stdout.split())
    assert "Nothing was graded, and the gradebook is as it was" in out and "Traceback" not in done.stdout + done.stderr
    assert "needs an NVIDIA GPU" in out and "Grade the class on a machine with an NVIDIA GPU" in out, out
    assert not (class_folder / "gradebook.db").exists()
    assert not list((class_folder / "autograded" / "ada" / "production").glob("*.ipynb"))


def test_plain_nbgrader_autograde_without_a_gpu_stops_before_the_gradebook(class_folder):
    """nbgrader's own autograde would score every student 0 as if graded: the course's settings stop it first."""
    folder = class_folder / "submitted" / "ada" / "production"
    folder.mkdir(parents=True)
    shutil.copy(class_folder / "source" / "production" / "inference-worker.ipynb", folder)
    done = nbgrader_commands.run(["autograde", "production"], class_folder, {**os.environ, "CUDA_VISIBLE_DEVICES": ""}, 300)
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, out
    assert "nbgrader autograde stopped before grading anyone" in out and "the gradebook is as it was" in out, out
    assert not (class_folder / "gradebook.db").exists()
    assert not (class_folder / "autograded").exists() or not list((class_folder / "autograded").rglob("*.ipynb"))


def test_autograde_outside_a_course_folder_says_where_to_run_it(tmp_path):
    done = oomlab(tmp_path, "nbgrader", "autograde", "production")
    assert done.returncode == 2 and "nbgrader_config.py" in " ".join(done.stdout.split())


def test_without_the_instructors_extra_a_classroom_command_says_how_to_install_it(monkeypatch, capsys):
    import importlib.util

    from oomlab.cli import main

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nbgrader" else found(name, *a))
    with pytest.raises(SystemExit) as done:
        main(["nbgrader", "autograde", "production"])
    out = " ".join(capsys.readouterr().out.split())
    assert done.value.code == 2 and "nbgrader is not installed here (nbgrader is missing)" in out
    assert "pip install 'oomlab[nbgrader]'" in out


# How nbgrader 0.9 logs a kernel that never answered, as it did when two kernels started at once took the same port.
KERNEL_LOST = """[AutogradeApp | INFO] Autograding /c/autograded/ada/production/inference-worker.ipynb
zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:47263')
[AutogradeApp | ERROR] Error occurred while starting new kernel client for kernel 0710: Kernel didn't respond in 60 seconds
[AutogradeApp | ERROR] There was an error processing assignment: /c/submitted/ada/production
[AutogradeApp | ERROR] Traceback (most recent call last):
      File "/site-packages/nbclient/client.py", line 659, in async_start_new_kernel_client
        raise RuntimeError("Kernel didn't respond in %d seconds" % timeout)
    RuntimeError: Kernel didn't respond in 60 seconds
[AutogradeApp | ERROR] There was an error processing assignment 'production' for student 'ada'
"""


def fake_nbgrader(monkeypatch, logs: dict[str, list[str]]) -> list[list[str]]:
    """Make each ``nbgrader autograde`` log, for each student it grades (``--student S``, or everyone of ``logs`` that it
    does not exclude), that student's first line and the next of ``logs[S]``; at the end, as nbgrader 0.9 does, each
    student it failed for. A log that is a bare traceback is nbgrader crashing: the process ends there. Returns the
    groups of students, in the order run."""
    ran = []

    def run(args, **kwargs):
        if "--student" in args:
            group = [args[args.index("--student") + 1]]
        else:
            excluded = next(a.split("=", 1)[1] for a in args if a.startswith("--CourseDirectory.student_id_exclude="))
            group = sorted(set(logs) - set(excluded.split(",")))
        ran.append(group)
        out, failed = kwargs["stdout"], []
        for student in group:
            log = logs[student].pop(0)
            out.write(f"[AutogradeApp | INFO] Creating/updating student with ID '{student}': {{}}\n{log}")
            if log.startswith("Traceback"):
                return subprocess.CompletedProcess(args, 1)
            if "There was an error processing" in log:
                failed.append(student)
        out.writelines(
            f"[AutogradeApp | ERROR] There was an error processing assignment 'production' for student '{s}'\n" for s in failed
        )
        if failed:
            out.write(
                "[AutogradeApp | ERROR] Please see the the above traceback for details on the specific errors on the above failures.\n"
            )
        return subprocess.CompletedProcess(args, 1 if failed else 0)

    monkeypatch.setattr(classgrade.subprocess, "run", run)
    return ran


def test_a_kernel_that_did_not_start_is_started_again(class_folder, monkeypatch):
    ran = fake_nbgrader(
        monkeypatch, {"ada": [KERNEL_LOST, "[AutogradeApp | INFO] graded"], "bo": ["[AutogradeApp | INFO] graded"]}
    )
    assert _autograde(class_folder, "production", ["ada", "bo"], 2, lambda _: None) == {}
    assert sorted(ran) == [["ada"], ["ada"], ["bo"]]


def test_a_class_is_graded_in_a_few_processes_and_each_student_gets_its_own_log(class_folder, monkeypatch):
    """Importing nbgrader costs each process seconds: ``jobs`` processes share the class, each excluding the others'."""
    graded = "[AutogradeApp | INFO] graded\n"
    broken = "[AutogradeApp | ERROR] There was an error processing assignment: x\n[AutogradeApp | ERROR] Traceback (most recent call last):\n    ValueError: bad metadata\n"
    ran = fake_nbgrader(monkeypatch, {"ada": [graded], "bo": [broken], "cy": [graded], "di": [graded], "ed": [graded]})
    failed = _autograde(class_folder, "production", ["ada", "bo", "cy", "di", "ed"], 2, lambda _: None)
    assert ran == [["ada", "cy", "ed"], ["bo", "di"]] or ran == [["bo", "di"], ["ada", "cy", "ed"]]
    assert failed == {"bo": "ValueError: bad metadata"}, "the error is the student's whose part of the log has it"
    logs = class_folder / PINNED / ".oomlab" / "class" / "logs" / "production"
    assert (logs / "di.log").read_text() == "[AutogradeApp | INFO] Creating/updating student with ID 'di': {}\n" + graded
    assert broken in (logs / "bo.log").read_text() and "for student" not in (logs / "bo.log").read_text()


def test_a_student_nbgrader_keeps_failing_is_reported_with_the_error(class_folder, monkeypatch):
    broken = "[AutogradeApp | ERROR] There was an error processing assignment: x\n[AutogradeApp | ERROR] Traceback (most recent call last):\n    ValueError: bad metadata\n"
    # nbgrader itself crashing, outside the errors it logs (as it did where nbconvert's templates were missing)
    crashed = "Traceback (most recent call last):\n  File \"nbconvert/exporters/templateexporter.py\"\nValueError: No template sub-directory with name 'classic'\n"
    ran = fake_nbgrader(monkeypatch, {"ada": [KERNEL_LOST] * KERNEL_TRIES, "bo": [broken], "cy": [crashed] * 2})
    failed = _autograde(class_folder, "production", ["ada", "bo", "cy"], 2, lambda _: None)
    assert failed == {
        "ada": "RuntimeError: Kernel didn't respond in 60 seconds",
        "bo": "ValueError: bad metadata",
        "cy": "ValueError: No template sub-directory with name 'classic'",
    }
    runs_of = lambda student: sum(student in group for group in ran)  # noqa: E731
    assert runs_of("ada") == KERNEL_TRIES and runs_of("bo") == 1, "a student's own failure is not run again"
    assert runs_of("cy") == 2, "a crash ends a shared process: its student is graded again alone, to say whose it is"
    logs = class_folder / PINNED / ".oomlab" / "class" / "logs" / "production"
    assert broken in (logs / "bo.log").read_text()


def test_the_benchmarks_class_holds_every_variant_with_its_verdict(class_folder):
    from oomlab.bench.classroom import make_class, variants

    shutil.copytree(
        class_folder / "source" / "snapshot", class_folder / "release" / "snapshot"
    )  # the exercise cells are the same
    made = make_class(class_folder, "snapshot", 12)
    course = Course(class_folder / PINNED)
    for ex_id in ("feature-cache", "ragged-batches", "allocator-settings"):
        runs = variants(course.get(ex_id))
        assert [made[(f"student-{k + 1:03d}", ex_id)][0] for k in range(len(runs))] == [name for name, _, _ in runs]
        assert made[("student-001", ex_id)] == ("reference", True) and made[("student-002", ex_id)] == ("bug", False)
        nb = json.loads((class_folder / "submitted" / "student-002" / "snapshot" / f"{ex_id}.ipynb").read_text())
        exercise = next(c for c in nb["cells"] if c["metadata"].get("oomlab", {}).get("role") == "exercise")
        assert exercise["source"] == f"{magic_line(ex_id)}\n{shipped_source(course.get(ex_id))}"


def test_the_measuring_cell_prints_what_oomlab_check_prints(class_folder, capsys, monkeypatch):
    (Path.cwd() / "inference-worker.py").write_text("print('fixed')\n")
    outcome = fake_report("inference-worker", {"plateau"}, class_folder)
    monkeypatch.setattr(cells, "_grade", lambda ex_id: outcome)
    cells.measure("inference-worker", sources="any")
    out = capsys.readouterr().out
    assert "Checks for inference-worker" in out and "\x1b[" not in out
    assert "✗ plateau: what differs" in out and "Why it matters: why it matters" in out
    assert out.rstrip().endswith("inference-worker does not pass yet.")


def test_a_learners_kernel_needs_no_nbgrader(tmp_path):
    """The cells run where oomlab is installed without the instructors' extra: nothing they import needs nbformat or nbgrader."""
    code = (
        "import sys; sys.modules['nbformat'] = sys.modules['nbgrader'] = None\n"
        "from oomlab.classroom import cells\n"
        "try:\n    cells.check('feature-cache', 'no_oom')\nexcept cells.NotGraded as err:\n    print(err.lines[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "feature-cache.py was not written" in done.stdout, done.stdout + done.stderr


# A grader handed in beside the notebooks: three defences, each tested on its own here, all three through nbgrader
# in tests/test_nbgrader_flow.py.

SHADOW = {  # each module, if ever imported, leaves a file named after it in the folder MARKERS names
    "oomlab/__init__.py": "",
    "oomlab/classroom/__init__.py": "",
    "oomlab/classroom/cells.py": "def check(*args):\n    print('PASS')\n\n\nhonest = check\n",
    "traitlets/__init__.py": "",
    "rich/__init__.py": "",
}


def hand_in(folder: Path, markers: Path) -> None:
    for rel, code in SHADOW.items():
        name = rel.removesuffix("/__init__.py").removesuffix(".py").replace("/", ".")
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(f"open({str(markers / name)!r}, 'w').close()\n{code}")


def test_what_is_handed_in_beside_the_notebooks_is_cleared_but_what_is_kept(tmp_path):
    hand_in(tmp_path, tmp_path / "imported")
    for rel in ("a.ipynb", "timestamp.txt", "data/train.csv", "data/evil.py", "notes.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "data")
    removed = clear(tmp_path, {"a.ipynb", "timestamp.txt", "data/train.csv"})
    assert removed == ["data/evil.py", "link", "notes.txt", "oomlab/", "rich/", "traitlets/"]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "a.ipynb",
        "data",
        "data/train.csv",
        "timestamp.txt",
    ]


def test_the_grading_kernel_imports_nothing_from_the_notebooks_folder(tmp_path):
    """Started as nbgrader starts it, in the notebook's folder: the folder holds look-alikes of what the kernel
    imports as it starts and of the grader, and none is imported, though the kernel works in that folder."""
    folder, markers = tmp_path / "autograded" / "ada" / "production", tmp_path / "imported"
    folder.mkdir(parents=True)
    markers.mkdir()
    hand_in(folder, markers)
    probe = (
        "import json, os, sys\nimport oomlab.classroom.cells, rich\nprint(json.dumps([os.getcwd(), oomlab.__file__, sys.path]))"
    )
    nb = new_notebook(cells=[new_code_cell(probe)], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb, _ = GradingKernel(timeout=120).preprocess(nb, {"metadata": {"path": str(folder)}})
    outputs = nb.cells[0].outputs
    assert [o.output_type for o in outputs] == ["stream"], outputs
    cwd, grader, path = json.loads(outputs[0].text)
    assert [p.name for p in markers.iterdir()] == []
    assert cwd == str(folder.resolve()) and Path(grader).is_relative_to(REPO / "oomlab")
    assert not [p for p in path if p in ("", ".") or Path(p).resolve() == folder.resolve() or "oomlab-kernel-start" in p]


def test_the_grading_kernel_stands_in_for_nbgraders_execute_alone():
    """oomlab_config.py's list of autograde preprocessors is nbgrader's own, with GradingKernel for Execute."""
    c = Config()
    exec(config_text(COURSE), {"get_config": lambda: c})
    ours = [import_item(name) for name in c.Autograde.autograde_preprocessors]
    nbgraders = Autograde.class_traits()["autograde_preprocessors"].default()
    assert ours == [GradingKernel if p is Execute else p for p in nbgraders]
    assert issubclass(GradingKernel, Execute), "so every Execute setting applies to it"


def test_a_graded_cell_refuses_grading_helpers_from_the_submissions_folder(tmp_path):
    """The notebook's own tripwire, for when the two defences before it were configured away: with the folder first
    on sys.path (python -c puts it there), the cell's import takes the fake, whose check passes; its hidden part fails."""
    ex = COURSE.get("inference-worker")
    source = next(c.source for c in build_notebook(ex).cells if c.metadata.get("nbgrader", {}).get("grade_id") == "check-no_oom")
    folder, markers = tmp_path / "production", tmp_path / "imported"
    folder.mkdir()
    markers.mkdir()
    hand_in(folder, markers)
    run = lambda: subprocess.run([sys.executable, "-c", source], cwd=folder, capture_output=True, text=True, timeout=120)  # noqa: E731
    done = run()
    assert "PASS" in done.stdout and done.returncode == 1, done.stdout + done.stderr
    assert "ImportError: The grading helpers were imported from" in done.stderr and "scores nothing" in done.stderr
    assert (markers / "oomlab.classroom.cells").is_file(), "the fake was imported: the tripwire, not the path, caught it"
    for handed in folder.iterdir():  # the installed oomlab passes the tripwire, and grades (here: nothing was written)
        shutil.rmtree(handed)
    done = run()
    assert "NotGraded" in done.stderr and "ImportError" not in done.stderr, done.stderr


@pytest.fixture(scope="module")
def student_install(tmp_path_factory) -> dict:
    """The student wheel, built by the instructors' command and installed with pip into a folder of its own."""
    tmp = tmp_path_factory.mktemp("student")
    done = oomlab(tmp, "nbgrader", "student-wheel", "dist")
    assert done.returncode == 0 and "pip install" in done.stdout, done.stdout + done.stderr
    (wheel,) = (tmp / "dist").glob("*.whl")
    target = tmp / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {"wheel": wheel, "target": target}


def test_the_student_wheel_carries_no_reference_fixes_and_no_answers(student_install):
    wheel = student_install["wheel"]
    assert wheel.name.endswith("+student-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        files = {name: zf.read(name) for name in zf.namelist()}
    assert not [n for n in files if "solutions" in n.split("/")]
    everything = b"\n".join(files.values()).decode("utf-8", errors="replace")
    for ex in COURSE.exercises:
        manifest = files[f"oomlab/_course/exercises/{ex.id}/exercise.toml"].decode()
        assert "[[alternatives" not in manifest and ANSWER_KEPT in manifest, ex.id
        assert ex.interview.answer.splitlines()[0] not in everything, ex.id
        assert ex.solution_path.read_text() not in everything, ex.id
        assert not [a for a in ex.alternatives if a.why in everything or a.apply(ex.learner_path.read_text()) in everything]
        assert files[f"oomlab/_course/exercises/{ex.id}/{ex.file}"].decode() == ex.learner_path.read_text(), ex.id
    assert "oomlab/classroom/cells.py" in files and "oomlab/_course/graders/conftest.py" in files


def test_the_student_wheel_installs_as_the_guide_says_with_what_it_depends_on(student_install):
    """The guide's `pip install` of the student wheel, dependencies resolved: pip, offline, finds every one of them
    already in this environment (the course's own), and would install nothing but the wheel; none is an instructor's."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--quiet",
            "--report",
            "-",
            str(student_install["wheel"]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    installed = [item["metadata"]["name"] for item in json.loads(done.stdout)["install"]]
    assert installed == ["oomlab"], installed
    with zipfile.ZipFile(student_install["wheel"]) as zf:
        (metadata,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line for line in zf.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    needed = [r for r in requires if "extra ==" not in r]
    assert any("torch>=2.4" in r for r in needed) and not [r for r in needed if "nbgrader" in r], needed


def test_a_draft_never_goes_to_the_students(course_copy):
    """A draft is not in the course: no GPU has measured it, so the student build leaves its folder out."""
    from oomlab.classroom.student import student_course
    from tests.test_modules import add_draft, add_folder

    add_folder(course_copy, "not-measured-yet")
    add_draft(course_copy, "not-measured-yet")
    files = student_course(course_copy)
    assert "exercises/eval-graphs/exercise.toml" in files
    assert not [name for name in files if name.startswith("exercises/not-measured-yet/")], "a draft went to the students"


def test_the_student_manifests_load_and_keep_everything_but_the_answers(student_install):
    course = student_install["target"] / "oomlab" / "_course"
    for ex in COURSE.exercises:
        mine = load_exercise(course / "exercises" / ex.id / "exercise.toml", course, course / "solutions")
        assert mine.alternatives == () and mine.interview.answer == ANSWER_KEPT
        assert mine.interview.question == ex.interview.question and mine.hints == ex.hints
        assert (mine.budget_bytes, mine.alloc_conf, mine.checks, mine.time_limit_s) == (
            ex.budget_bytes,
            ex.alloc_conf,
            ex.checks,
            ex.time_limit_s,
        )
        assert [f.name for f in mine.wrong_fixes] == [f.name for f in ex.wrong_fixes]


def test_a_student_install_measures_and_says_the_grade_is_the_instructors(student_install, tmp_path):
    """The measuring cell, where the student wheel is installed: it runs the script and shows the figures (the run is
    faked here, as there is no GPU), and every cell says who grades; nothing crashes for want of a reference fix."""
    shutil.copy(COURSE.get("inference-worker").learner_path, tmp_path / "inference-worker.py")
    code = """
from oomlab.classroom import cells
from oomlab.measure import harness, machine
machine.has_nvidia_driver = lambda: True  # the run is faked: nothing is measured, so no driver is needed to say so
stats = {"peak_allocated": 2**30, "peak_reserved": 2**31, "inactive_split_peak": 0, "retries": 0, "ooms": 0}
harness.measure_exercise_file = lambda ex, script, **kw: harness.Measurement(str(script), "ok", stats=stats, budget_bytes=ex.budget_bytes)
import oomlab
print(oomlab.__file__)
cells.measure("inference-worker", sources="from the release")
try:
    cells.check("inference-worker", "no_oom")
except cells.NotGraded as err:
    print("check:", err.lines[-1])
"""
    env = {**os.environ, "PYTHONPATH": str(student_install["target"]), "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith(str(student_install["target"] / "oomlab")), out
    assert "peak allocated" in out and "1,024.0 MiB" in out and "student build" in out
    assert "Your grade comes from your instructor" in out
    assert out.rstrip().endswith(
        "check: Your grade comes from your instructor, who measures this notebook on the grading machine."
    )


def test_the_per_check_export_has_a_line_per_student_and_exercise_with_each_checks_points_and_why():
    import csv as csvlib

    from oomlab.classroom.classgrade import Row, checks_csv

    rows = [
        Row("bo", "feature-cache", ["no_oom: 2 OOMs"], {"no_oom": "✗ no_oom: 2 OOMs (required 0)"}, 2.0, 8.0),
        Row("ada", "feature-cache", [], {}, 8.0, 8.0),
        Row("ada", "eval-graphs", ["the interview answer waits for manual grading"], {}, 6.0, 8.0),
    ]
    rows[0].points = {"check-no_oom": [0.0, 2.0], "check-same_workload": [2.0, 2.0], "interview-answer": [0.0, 2.0]}
    rows[1].points = {"check-no_oom": [2.0, 2.0], "check-same_workload": [2.0, 2.0], "interview-answer": [2.0, 2.0]}
    rows[2].points = {"check-retries": [2.0, 2.0], "interview-answer": [None, 2.0]}
    table = list(csvlib.DictReader(io.StringIO(checks_csv(rows))))
    assert [(r["student"], r["exercise"]) for r in table] == [
        ("ada", "eval-graphs"),
        ("ada", "feature-cache"),
        ("bo", "feature-cache"),
    ]
    bo = table[2]
    assert (bo["score"], bo["max_score"], bo["check-no_oom points"], bo["check-no_oom max"]) == ("2", "8", "0", "2")
    assert bo["check-no_oom why"] == "✗ no_oom: 2 OOMs (required 0)" and bo["check-same_workload why"] == ""
    assert table[0]["check-no_oom points"] == "" and table[0]["check-retries points"] == "2"
    assert table[0]["interview-answer points"] == "" and "manual grading" in table[0]["notes"]
    assert list(table[0])[-4:] == ["interview-answer points", "interview-answer max", "interview-answer why", "notes"]


def test_before_plain_autograde_an_unreadable_notebook_is_set_aside_not_the_whole_assignment(class_folder, monkeypatch, capsys):
    """nbgrader fails on a file that is not a notebook and drops every notebook of that student's assignment."""
    source = class_folder / "source" / "production" / "inference-worker.ipynb"
    for student, content in (("ada", None), ("bo", "not json"), ("cy", "{}")):
        folder = class_folder / "submitted" / student / "production"
        folder.mkdir(parents=True)
        if content is None:
            shutil.copy(source, folder)
        else:
            (folder / source.name).write_text(content)
    monkeypatch.chdir(class_folder)
    monkeypatch.setenv(CHECKED, "1")  # as oomlab's autograde runs it, after measuring: no GPU check here
    before_autograde(["nbgrader", "autograde", "production", "--student", "bo", "--force"])
    assert (class_folder / "submitted" / "bo" / "production" / (source.name + UNREADABLE)).read_text() == "not json"
    assert (class_folder / "submitted" / "cy" / "production" / source.name).read_text() == "{}", "only the students named"
    told = capsys.readouterr().err
    assert "set aside the unreadable notebook bo's inference-worker.ipynb" in told and "it scores 0" in told
    before_autograde(["nbgrader", "autograde", "production"])
    assert (class_folder / "submitted" / "cy" / "production" / (source.name + UNREADABLE)).is_file()
    assert (class_folder / "submitted" / "ada" / "production" / source.name).is_file(), "a notebook stays where it is"
    before_autograde(["nbgrader", "generate_feedback", "production"])  # only autograde is touched


def test_list_and_doctor_work_in_a_class_folder_on_the_course_it_pins(tmp_path):
    root = build_course(tmp_path / "class").root
    env_free = {k: v for k, v in os.environ.items() if k != "OOMLAB_ROOT"}
    for args, expect in ((["list"], "grads-during-forward"), (["doctor"], f"{root / PINNED}: ")):
        done = subprocess.run(
            [sys.executable, "-m", "oomlab", *args],
            cwd=root / "source",  # anywhere in the class folder
            env={**env_free, "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert "No OOM Lab course folder" not in done.stdout and expect in done.stdout, done.stdout + done.stderr


def test_zip_collect_takes_student_dash_dash_notebook_files_as_the_config_says(tmp_path):
    """Without a pattern nbgrader's zip_collect collects nothing, silently: the built config gives one."""
    import zipfile

    root = build_course(tmp_path / "class").root
    archive = root / "downloaded" / "snapshot" / "archive"
    archive.mkdir(parents=True)
    notebook = root / "source" / "snapshot" / "feature-cache.ipynb"
    shutil.copy(notebook, archive / "ada--feature-cache.ipynb")
    with zipfile.ZipFile(archive / "bo.zip", "w") as zf:
        zf.write(notebook, "bo--feature-cache.ipynb")
    done = nbgrader_commands.run(["zip_collect", "snapshot"], root, dict(os.environ), 300)
    assert done.returncode == 0, done.stdout + done.stderr
    for student in ("ada", "bo"):
        assert (root / "submitted" / student / "snapshot" / "feature-cache.ipynb").read_bytes() == notebook.read_bytes()
