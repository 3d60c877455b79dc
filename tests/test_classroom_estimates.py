"""An estimate exercise in the nbgrader course, without nbgrader running: its notebook, its points, the student build,
and its grading up to the GPU.

The course is copied with the estimate exercises' examples made tiny (:func:`tests.test_estimate_exercises.tiny`);
the class is built from that copy once for the file. Where there is
no GPU, the grading says so as a script's does; with the CPU's count standing in for the GPU
(:func:`tests.test_estimate_exercises.cpu_for_gpu`), each part is scored as on a GPU: a reference estimate earns every
part's points, the estimator as shipped fewer, and the class report names the parts it got wrong.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader.nbgraderformat import MetadataValidator

from oomlab.classroom import build, cells, classgrade
from oomlab.classroom.build import START_S, build_course
from oomlab.classroom.layout import PINNED
from oomlab.classroom.notebook import INSTALLED_ONLY
from oomlab.classroom.scoring import ANSWER_POINTS, POINTS_PER_CHECK, graded, magic_line, most_points, script_name
from oomlab.classroom.student import ANSWER_KEPT, student_course
from oomlab.course import Course
from oomlab.course.originals import shipped_source
from oomlab.errors import OomLabError
from oomlab.grading import estimates
from oomlab.grading.estimates import parts_of
from oomlab.grading.truth import source_digest
from oomlab.measure.machine import has_nvidia_driver
from tests.test_estimate_exercises import ESTIMATES, cpu_for_gpu, landlock, tiny  # noqa: F401 - a fixture

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
MODULE = "size-it-first"  # the module of the estimate exercises: the assignment they are in
DECODER = "size-a-decoder"  # the one graded here: its configs count on the CPU in a fraction of a second


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """A copy of the course with the estimate exercises' examples tiny."""
    root = tmp_path_factory.mktemp("estimates") / "course"
    for folder in ("exercises", "solutions"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return tiny(root)


@pytest.fixture(scope="module")
def klass(course, tmp_path_factory) -> Path:
    """The nbgrader course folder built from that copy, as `oomlab nbgrader build` builds it from the installed course."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(build, "shipped_root", lambda: course)
        built = build_course(tmp_path_factory.mktemp("class") / "class")
    assert built.assignments[MODULE] == list(ESTIMATES)
    return built.root


def pinned(root: Path, ex_id: str):
    return Course(root / PINNED, working_tree=True).get(ex_id)


def source_notebook(root: Path, ex_id: str) -> nbformat.NotebookNode:
    return nbformat.read(root / "source" / MODULE / f"{ex_id}.ipynb", as_version=4)


@pytest.mark.parametrize("ex_id", ESTIMATES)
def test_an_estimate_notebook_states_its_parts_and_examples_and_scores_each_part(klass, ex_id):
    ex = pinned(klass, ex_id)
    nb = source_notebook(klass, ex_id)
    MetadataValidator().validate_nb(nb)  # what nbgrader checks before it generates an assignment
    problem, exercise, measure, *rest = nb.cells
    kind_tolerance = estimates.SIZED[ex.sizes].tolerance
    assert "Size it before it runs: no step of the workflow, and no memory budget" in problem.source
    assert "Memory budget:" not in problem.source and "Workflow step" not in problem.source
    assert all(f"| `{p}` | ±{kind_tolerance[p]:.0%} | {POINTS_PER_CHECK} |" in problem.source for p in parts_of(ex))
    assert "| # | " + " | ".join(ex.examples[0]) + " |" in problem.source
    assert all(f"| {i} | {cfg['layers']} | {cfg['width']} |" in problem.source for i, cfg in enumerate(ex.examples, 1))
    assert exercise.source == f"{magic_line(ex_id)}\n{shipped_source(ex)}" and "nbgrader" not in exercise.metadata
    assert f"cells.measure({ex_id!r}, sources={source_digest(ex)!r})" in measure.source
    parts = [c for c in rest if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
    assert [c.metadata.nbgrader.grade_id for c in parts] == [f"part-{p}" for p in parts_of(ex)] == [c.id for c in parts]
    for cell, part in zip(parts, parts_of(ex), strict=True):
        shown, hidden = cell.source.split("\n### BEGIN HIDDEN TESTS\n")
        assert shown.endswith(f"cells.part({ex_id!r}, {part!r})") and hidden == f"{INSTALLED_ONLY}\n### END HIDDEN TESTS"
    points = [c.metadata.nbgrader.points for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    assert sum(points) == most_points(ex) == POINTS_PER_CHECK * len(parts_of(ex)) + ANSWER_POINTS
    answer = rest[-1]
    assert answer.metadata.nbgrader.solution and ex.interview.answer in answer.source
    assert graded(ex) == list(parts_of(ex))


def test_the_class_grades_an_estimate_within_the_cells_timeout_and_releases_no_reference_estimator(klass):
    config = (klass / "oomlab_config.py").read_text()
    assert f"c.Execute.timeout = {int(2 * (estimates.TIME_LIMIT_S + START_S))}" in config
    assert not list((klass / "source").rglob("solutions")) and not list((klass / "source").rglob("estimate.py"))
    assert all((klass / PINNED / "solutions" / ex_id / "estimate.py").is_file() for ex_id in ESTIMATES)


def test_the_student_build_leaves_out_the_reference_estimators_and_the_model_answers(course):
    files = student_course(course)  # and loads each student manifest, or raises
    everything = b"\n".join(files.values()).decode("utf-8", errors="replace")
    assert not [n for n in files if "solutions" in n.split("/")]
    for ex_id in ESTIMATES:
        ex = Course(course, working_tree=True).get(ex_id)
        assert files[f"exercises/{ex_id}/estimate.py"].decode() == shipped_source(ex)
        assert ex.solution_path.read_text() not in everything and ex.interview.answer.splitlines()[0] not in everything
        mine = tomllib.loads(files[f"exercises/{ex_id}/exercise.toml"].decode())
        assert mine["interview"]["answer"] == ANSWER_KEPT and mine["examples"] == list(ex.examples)


@pytest.fixture
def graded_in(klass, monkeypatch):
    """A student's graded copy of the assignment, entered as nbgrader's kernel enters it; a function that writes an
    estimator there as its exercise cell does."""

    def enter(student: str, ex_id: str, source: str) -> Path:
        folder = klass / "autograded" / student / MODULE
        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.chdir(folder)
        (folder / script_name(ex_id)).write_text(source, encoding="utf-8")
        cells._last.clear()
        cells._pinned.clear()
        return folder

    return enter


def score(ex, capsys) -> tuple[float, dict[str, list[str]]]:
    """The points the notebook's cells give, as nbgrader scores them (a cell that raises scores zero), and each failed
    part's lines; after the measuring cell, which must grade."""
    cells.measure(ex.id, sources=source_digest(ex))
    out = capsys.readouterr().out
    assert "Not graded" not in out and "parts within tolerance" in out, out
    points, failed = 0.0, {}
    for part in parts_of(ex):
        try:
            cells.part(ex.id, part)
            points += POINTS_PER_CHECK
        except cells.CheckFailed as err:
            failed[part] = err.lines
    return points, failed


def test_without_a_gpu_an_estimate_is_answered_then_not_graded_with_the_message_a_script_gets(klass, graded_in, capsys):
    if has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver")
    landlock()
    ex = pinned(klass, DECODER)
    graded_in("ada", DECODER, shipped_source(ex))
    cells.measure(DECODER, sources=source_digest(ex))
    out = " ".join(capsys.readouterr().out.split())
    assert "Not graded: This machine has no NVIDIA driver" in out, out
    assert "measuring the 6 configs your estimate is graded on needs an NVIDIA GPU" in out, out
    with pytest.raises(cells.NotGraded, match="needs an NVIDIA GPU"):
        cells.part(DECODER, "kv_cache")
    # The estimator answers first, in its sandbox: one that fails is said on any machine.
    graded_in("bo", DECODER, "def estimate(config):\n    return 1 / 0\n")
    with pytest.raises(cells.NotGraded) as err:
        cells.part(DECODER, "kv_cache")
    assert err.value.lines[0].startswith("estimate() failed on config 1") and "ZeroDivisionError" in err.value.lines[0]


def test_a_class_of_estimates_without_a_gpu_is_not_graded_and_says_so(klass, monkeypatch):
    if has_nvidia_driver():
        pytest.skip("this machine has an NVIDIA driver")
    folder = klass / "submitted" / "cy" / MODULE
    folder.mkdir(parents=True)
    shutil.copy(klass / "source" / MODULE / f"{DECODER}.ipynb", folder)
    monkeypatch.chdir(klass)
    with pytest.raises(OomLabError) as err:
        classgrade.grade_class(MODULE, ["cy"])
    said = str(err.value)
    assert "Nothing was graded, and the gradebook is as it was" in said and "needs an NVIDIA GPU" in said, said
    assert not (klass / "gradebook.db").exists()


@pytest.mark.usefixtures("cpu_for_gpu")
def test_with_the_cpu_for_the_gpu_a_reference_estimate_earns_every_part_and_the_shipped_one_fewer(
    klass, course, graded_in, monkeypatch, capsys
):
    """The cells alone (plain ``nbgrader autograde``), then a class's estimators graded before nbgrader runs, one
    after another, each grade kept for its notebook's cells and the class report."""
    landlock()
    monkeypatch.setattr(estimates, "has_nvidia_driver", lambda: True)
    monkeypatch.setattr(classgrade, "has_nvidia_driver", lambda: True)
    ex = pinned(klass, DECODER)
    full = POINTS_PER_CHECK * len(parts_of(ex))
    reference, shipped = ex.solution_path.read_text(encoding="utf-8"), shipped_source(ex)

    graded_in("ada", DECODER, reference)
    assert score(ex, capsys) == (full, {})
    graded_in("ed", DECODER, reference.replace('"peak": peak(cfg)', '"peak": 0', 1))  # each part earns its own points
    points, failed = score(ex, capsys)
    assert (points, list(failed)) == (full - POINTS_PER_CHECK, ["peak"])
    graded_in("bo", DECODER, shipped)
    points, failed = score(ex, capsys)
    assert points < full and "kv_cache" in failed, failed
    first, *configs = failed["kv_cache"]
    assert first.startswith("kv_cache: within ±2% on 0 of 3 hidden configs") and configs[0].startswith("config 1 (layers=2")

    # `oomlab nbgrader autograde`: each distinct estimator graded once, before nbgrader, and kept for its notebook.
    subs = [
        classgrade._Submission(student, ex, klass / "submitted" / student / MODULE / f"{DECODER}.ipynb", script=source)
        for student, source in (("ada", reference), ("bo", shipped), ("cy", shipped), ("di", "def estimate(c):\n    1 / 0\n"))
    ]
    notes = []
    assert classgrade._measure_all(klass, subs, 4, notes.append) == 3
    assert notes == ["3 distinct estimator(s), one after another (each runs its configs on the whole GPU)"]

    def no_gpu_again(*args, **kwargs):
        raise AssertionError("the kept grade was measured again")

    monkeypatch.setattr("oomlab.sizing.grade.measure_configs", no_gpu_again)
    graded_in("bo", DECODER, shipped)
    assert score(ex, capsys) == (points, failed), "the notebook's cells read the grade kept for its exact estimator"
    judged = {sub.student: classgrade._judged(sub) for sub in subs}
    assert judged["ada"] == ([], {})
    assert judged["bo"] == judged["cy"] == ([lines[0] for lines in failed.values()], {p: lines[0] for p, lines in failed.items()})
    assert judged["di"][1] == {} and judged["di"][0][0].startswith("estimate() failed on config 1")
    assert judged["di"][0][0].endswith("ZeroDivisionError: division by zero")

    row = classgrade.Row("bo", DECODER, *judged["bo"], score=points, max_score=full + ANSWER_POINTS)
    row.points = {f"part-{p}": [0.0 if p in failed else 2.0, 2.0] for p in parts_of(ex)}
    table = classgrade.checks_csv([row])
    assert "part-kv_cache why" in table and failed["kv_cache"][0] in table, table
