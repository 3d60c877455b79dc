"""Manifests: each problem is one OomLabError that names the file and what is wrong; the learner's copy never grades."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.manifest import STEP_NAMES
from oomlab.course.shipped import init_course
from oomlab.course.state import StateDir
from oomlab.errors import OomLabError
from oomlab.grading import verdict
from tests.in_process import oomlab

REPO = Path(__file__).resolve().parents[1]


def manifest(root: Path, ex_id: str) -> Path:
    return root / "exercises" / ex_id / "exercise.toml"


def edit(root: Path, ex_id: str, find: str, replace: str) -> Path:
    """Change one manifest; fails loudly if the manifest no longer holds ``find`` exactly once."""
    path = manifest(root, ex_id)
    text = path.read_text(encoding="utf-8")
    assert text.count(find) == 1, f"{path} no longer contains {find!r} exactly once"
    path.write_text(text.replace(find, replace), encoding="utf-8")
    return path


def load_error(root: Path) -> str:
    with pytest.raises(OomLabError) as err:
        Course(root, working_tree=True)  # the manifests as edited: a learner's command would grade with the originals
    return str(err.value)


def grading_error(root: Path, ex_id: str) -> str:
    """What grading the exercise says of its manifest's checks, before it measures anything.

    The course loads a manifest's ``[checks]`` as tables; which checks exist and what
    parameters each takes is the grader's to say (the course never imports the grader).
    """
    ex = Course(root, working_tree=True).get(ex_id)
    with pytest.raises(OomLabError) as err:
        verdict.grade(ex, ex.solution_path)
    return str(err.value)


@pytest.fixture(autouse=True)
def nothing_is_measured(monkeypatch):
    def measure(*args, **kwargs):
        raise AssertionError("a manifest's checks are validated before anything is measured")

    monkeypatch.setattr(verdict, "measure_exercise_file", measure)


def test_the_copy_loads(course_copy):
    course = Course(course_copy, working_tree=True)
    ids = [e.id for e in course.exercises]
    assert ids.index("feature-cache") < ids.index("eval-graphs") < ids.index("one-hot-peak")
    # In the order of the course's list: module by module, each module's exercises as it names them.
    assert ids == [ex_id for m in course.modules for ex_id in m.exercises] == course.ids_in_order
    assert all(e.module is not None and e.id in e.module.exercises for e in course.exercises)
    ex = course.get("feature-cache")
    assert ex.manifest_path == manifest(course_copy, "feature-cache")
    assert isinstance(ex.time_limit_s, float)  # an int in TOML is accepted where a float is wanted
    assert all(e.step in STEP_NAMES for e in course.scripts) and all(not e.step for e in course.exercises if e.is_estimate)


def test_invalid_toml(course_copy):
    path = edit(course_copy, "eval-graphs", 'step = "hunt"\n', 'step = = "hunt"\n')
    line = path.read_text().splitlines().index('step = = "hunt"') + 1
    message = load_error(course_copy)
    assert f"{path} is not valid TOML" in message
    assert f"line {line}" in message


def test_missing_key(course_copy):
    path = edit(course_copy, "eval-graphs", 'title = "Training fits, validation runs out of memory"\n', "")
    message = load_error(course_copy)
    assert f"{path}: the key 'title' is missing" in message


@pytest.mark.parametrize(
    "find, replace, words",
    [
        ("budget_bytes = 1_073_741_824", 'budget_bytes = "1 GiB"', "'budget_bytes' should be a int, found str '1 GiB'"),
        ("budget_bytes = 1_073_741_824", "budget_bytes = true", "'budget_bytes' should be a int, found bool True"),
        ("time_limit_s = 120", 'time_limit_s = "2 min"', "'time_limit_s' should be a float, found str"),
        ('alloc_conf = ""', "alloc_conf = 5", "'alloc_conf' should be a str, found int 5"),
        ("[checks.same_results]\nrtol", "[checks]\nsame_results = 3\n[checks.x]\nrtol", "[checks.same_results] must be a table"),
    ],
    ids=["budget-str", "budget-bool", "time-limit-str", "alloc-conf-int", "check-not-a-table"],
)
def test_wrong_type(course_copy, find, replace, words):
    path = edit(course_copy, "eval-graphs", find, replace)
    message = load_error(course_copy)
    assert str(path) in message
    assert words in message


@pytest.mark.parametrize("hints", ["[]", '["one", "two"]', '["one", "two", " "]', '["1", "2", "3", "4"]'])
def test_hints_must_be_three_strings(course_copy, hints):
    path = manifest(course_copy, "eval-graphs")
    text = path.read_text(encoding="utf-8")
    path.write_text(re.sub(r"hints = \[.*?\n\]\n", f"hints = {hints}\n", text, flags=re.S), encoding="utf-8")
    message = load_error(course_copy)
    assert f"{path}: hints must be a list of 3 non-empty strings" in message


def test_interview_needs_a_question_and_an_answer(course_copy):
    path = manifest(course_copy, "eval-graphs")
    text = path.read_text(encoding="utf-8")
    path.write_text(re.sub(r'question = ".*?"\n', 'question = ""\n', text), encoding="utf-8")
    assert f"{path}: [interview] needs a question and a model answer" in load_error(course_copy)
    path.write_text(re.sub(r"\[interview\].*?(?=\n\[checks)", "", text, flags=re.S), encoding="utf-8")
    assert f"{path}: the key 'interview' is missing" in load_error(course_copy)


def test_an_exercise_without_a_wrong_fix(course_copy):
    path = manifest(course_copy, "eval-graphs")
    text = path.read_text(encoding="utf-8")
    path.write_text(text[: text.index("[[wrong_fixes]]")], encoding="utf-8")
    assert f"{path}: no [[wrong_fixes]]" in load_error(course_copy)


def test_alternatives_load_as_fixes_that_must_pass(course_copy):
    path = manifest(course_copy, "eval-graphs")
    alternative = (
        '\n[[alternatives]]\nname = "item-not-tensor"\nwhy = "A float keeps no graph."\n'
        '[[alternatives.edits]]\nfind = "losses.append(F.cross_entropy(model(x), y))"\n'
        'replace = "losses.append(F.cross_entropy(model(x), y).item())"\n'
    )
    path.write_text(path.read_text(encoding="utf-8") + alternative, encoding="utf-8")
    ex = Course(course_copy, working_tree=True).get("eval-graphs")
    assert [a.name for a in ex.alternatives][-1] == "item-not-tensor" and ex.alternatives[-1].expect == ""
    path.write_text(path.read_text(encoding="utf-8") + alternative, encoding="utf-8")
    assert "share a name" in load_error(course_copy)


def test_unknown_check(course_copy):
    path = edit(course_copy, "feature-cache", "[checks.retries]", "[checks.retry]")
    message = grading_error(course_copy, "feature-cache")
    assert f"{path}: unknown check 'retry'" in message
    assert "Known checks:" in message and "retries" in message


def test_unknown_check_parameter(course_copy):
    path = edit(course_copy, "feature-cache", "[checks.retries]\nmax = 0", "[checks.retries]\nmaximum = 0")
    message = grading_error(course_copy, "feature-cache")
    assert f"{path}: [checks.retries]: unknown parameter 'maximum'" in message
    assert "Allowed: max" in message


def test_check_parameter_of_the_wrong_type(course_copy):
    path = edit(course_copy, "feature-cache", "tolerance = 0.5", 'tolerance = "half"')
    message = grading_error(course_copy, "feature-cache")
    assert f"{path}: [checks.inactive_split_peak]: tolerance should be a float" in message


def test_symptom_not_among_the_checks(course_copy):
    # retries is a real check, but eval-graphs does not use it.
    path = edit(course_copy, "eval-graphs", 'symptom = "no_oom"', 'symptom = "retries"')
    message = load_error(course_copy)
    assert f"{path}: symptom 'retries' is not one of this exercise's checks" in message


def test_wrong_fix_expecting_a_check_the_exercise_lacks(course_copy):
    path = edit(course_copy, "eval-graphs", 'expect = "same_workload"', 'expect = "retries"')
    message = grading_error(course_copy, "eval-graphs")
    assert str(path) in message and "expects check 'retries', which this exercise does not have" in message


def test_wrong_fix_whose_edit_is_not_in_the_script(course_copy):
    # The manifest is valid; the edit fails when it is applied to the buggy script (verify, pytest --solutions).
    path = edit(
        course_copy,
        "eval-graphs",
        'find = "batch_size, steps, eval_every, eval_batches = 4096, 30, 10, 8"',
        'find = "batch_size = 4096"',
    )
    ex = Course(course_copy, working_tree=True).get("eval-graphs")
    fix = next(f for f in ex.wrong_fixes if f.name == "fewer-eval-batches")
    source = ex.learner_path.read_text(encoding="utf-8")
    with pytest.raises(OomLabError) as err:
        fix.apply(source)
    message = str(err.value)
    assert str(path) in message
    assert "'fewer-eval-batches'" in message and "'batch_size = 4096'" in message and "found it 0 times" in message
    # The fixes whose edits still match apply cleanly.
    other = next(f for f in ex.wrong_fixes if f.name != "fewer-eval-batches")
    assert other.apply(source) != source


def test_id_not_matching_its_folder(course_copy):
    path = edit(course_copy, "eval-graphs", 'id = "eval-graphs"', 'id = "eval-graph"')
    message = load_error(course_copy)
    assert f"{path}: id 'eval-graph' does not match its folder 'eval-graphs'" in message


def test_bad_step(course_copy):
    path = edit(course_copy, "eval-graphs", 'step = "hunt"', 'step = "debug"')
    message = load_error(course_copy)
    assert f"{path}: step 'debug' is not one of snapshot, hunt, profile" in message


def test_missing_manifest(course_copy):
    path = manifest(course_copy, "eval-graphs")
    path.unlink()
    message = load_error(course_copy)
    assert f"{path} does not exist" in message


# --- Course.get ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def course() -> Course:
    return Course(REPO, working_tree=True)


def test_get_by_id(course):
    assert course.get("eval-graphs").id == "eval-graphs"


def test_get_by_number_follows_the_teaching_order(course):
    n = len(course.exercises)
    assert [course.get(str(i)).id for i in range(1, n + 1)] == [e.id for e in course.exercises]
    assert [course.get(str(i)).id for i in (1, 2, 3)] == ["grads-during-forward", "checkpoints-on-gpu", "size-a-training-step"]


@pytest.mark.parametrize("key", ["0", str(len(Course(REPO, working_tree=True).exercises) + 1), ""])
def test_get_out_of_range(course, key):
    with pytest.raises(OomLabError) as err:
        course.get(key)
    assert f"There is no exercise {key!r}" in str(err.value)


def test_unknown_id_suggests_the_close_match(course):
    with pytest.raises(OomLabError) as err:
        course.get("eval-graph")
    assert "Did you mean 'eval-graphs'?" in str(err.value)
    assert ", ".join(e.id for e in course.exercises) in str(err.value)


def test_unknown_id_without_a_close_match(course):
    with pytest.raises(OomLabError) as err:
        course.get("zzz")
    assert "Did you mean" not in str(err.value)
    assert "`oomlab list`" in str(err.value)


# --- one broken manifest blocks only its own exercise ----------------------------------------


def test_a_broken_manifest_blocks_only_its_own_exercise(course_copy):
    every = [e.id for e in Course(course_copy, working_tree=True).exercises]
    path = edit(course_copy, "eval-graphs", 'step = "hunt"\n', 'step = = "hunt"\n')
    course = Course(course_copy, strict=False, working_tree=True)
    assert [e.id for e in course.exercises] == [e for e in every if e != "eval-graphs"]
    assert list(course.broken) == ["eval-graphs"]
    assert course.problem("eval-graphs").startswith("exercises/eval-graphs/exercise.toml is not valid TOML")
    number = every.index("eval-graphs") + 1
    assert course.ids_in_order == every, "a broken manifest keeps its number, and so does every other exercise"
    for key in ("eval-graphs", str(number)):  # by id, or by its number
        with pytest.raises(OomLabError) as err:
            course.get(key)
        assert f"{path} is not valid TOML" in str(err.value)
    after = every[number]
    assert course.get(str(number + 1)).id == after and course.number(after) == number + 1
    with pytest.raises(OomLabError, match="Did you mean 'eval-graphs'"):
        course.get("eval-graph")
    # The graders, the site and `oomlab dev` keep the strict default: the first broken manifest is the error.
    assert f"{path} is not valid TOML" in load_error(course_copy)


def test_a_manifest_of_the_wrong_shape_is_a_clear_error(course_copy):
    path = manifest(course_copy, "eval-graphs")
    text = path.read_text(encoding="utf-8")
    first_edit = text.index("[[wrong_fixes.edits]]")
    path.write_text(text[:first_edit] + "edits = [1, 2]\n" + text[text.index("\n\n", first_edit) :], encoding="utf-8")
    message = load_error(course_copy)
    assert f"{path} is not shaped like an exercise.toml" in message


def test_a_manifest_that_is_not_utf8_is_a_clear_error(course_copy):
    path = manifest(course_copy, "eval-graphs")
    path.write_bytes(path.read_bytes().replace(b'title = "', b'title = "\xff', 1))
    assert f"{path} is not UTF-8 text" in load_error(course_copy)


def test_an_exercise_number_that_is_not_a_small_ascii_number_is_just_unknown(course):
    for key in ("9" * 5000, "²", "-1"):
        with pytest.raises(OomLabError, match="There is no exercise"):
            course.get(key)


# --- the learner's manifest never grades -----------------------------------------------------
# A learner's commands (and `pytest graders`) load each exercise from the course's own manifest,
# kept under .oomlab/originals/ (or the package's); `Course(working_tree=True)` reads the folder's
# own, as the maintainer's tools do.

ID = "feature-cache"
# Each edit a learner might make to pass more easily, and what it would change in the exercise.
LEARNER_EDITS = {
    "budget": ("budget_bytes = 1_207_959_552", "budget_bytes = 8_589_934_592", lambda ex: ex.budget_bytes),
    "tolerance": ("tolerance = 0.5", "tolerance = 100.0", lambda ex: ex.checks),
    "deleted-check": ("[checks.retries]\nmax = 0\n", "", lambda ex: ex.checks),
    "file": ('file = "train.py"', 'file = "mine.py"', lambda ex: (ex.file, ex.learner_path, ex.solution_path)),
}


@pytest.fixture
def learner_course(tmp_path, monkeypatch) -> Path:
    """A course folder made by `oomlab init`, as a learner has it."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.resolve()))
    monkeypatch.delenv("OOMLAB_ROOT", raising=False)
    root = tmp_path / "my-course"
    init_course(root)
    return root.resolve()


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def test_init_keeps_every_manifest_as_shipped(learner_course):
    for ex in Course(learner_course).exercises:
        kept = StateDir(learner_course).original(ex.id, "exercise.toml")
        assert ex.manifest_path == kept and not ex.manifest_edited
        assert kept.read_bytes() == (REPO / "exercises" / ex.id / "exercise.toml").read_bytes()


@pytest.mark.parametrize("what", list(LEARNER_EDITS))
def test_an_edited_manifest_changes_nothing_in_a_learners_folder(learner_course, what):
    find, replace, seen = LEARNER_EDITS[what]
    shipped = seen(Course(learner_course).get(ID))
    edit(learner_course, ID, find, replace)
    ex = Course(learner_course).get(ID)
    assert seen(ex) == shipped and ex.manifest_edited
    assert ex.manifest_path == StateDir(learner_course).original(ID, "exercise.toml")
    # The edit is real: read as the folder has it, the exercise does change.
    assert seen(Course(learner_course, working_tree=True).get(ID)) != shipped


def test_without_its_state_folder_a_learners_folder_grades_with_the_packages_manifest(learner_course):
    shutil.rmtree(learner_course / ".oomlab")
    find, replace, seen = LEARNER_EDITS["budget"]
    edit(learner_course, ID, find, replace)
    ex = Course(learner_course).get(ID)
    package = Course(REPO, working_tree=True).get(ID)
    assert ex.manifest_path == package.manifest_path and seen(ex) == seen(package) and ex.manifest_edited


def test_a_learners_manifest_that_no_longer_loads_blocks_nothing(learner_course):
    mine = manifest(learner_course, ID)
    mine.write_text(mine.read_text(encoding="utf-8").replace("step = ", "step = = ", 1), encoding="utf-8")
    course = Course(learner_course, strict=False)
    assert course.broken == {} and course.get(ID).manifest_edited
    assert course.get(ID).checks == Course(REPO, working_tree=True).get(ID).checks
    assert list(Course(learner_course, strict=False, working_tree=True).broken) == [ID]  # it is broken indeed
    mine.unlink()  # a deleted manifest, too
    assert Course(learner_course).get(ID).manifest_edited


def test_an_unedited_manifest_is_not_called_edited(learner_course):
    mine = manifest(learner_course, ID)
    mine.write_bytes(mine.read_bytes().replace(b"\n", b"\r\n"))  # a checkout's line endings are no edit
    assert not any(ex.manifest_edited for ex in Course(learner_course).exercises)


@pytest.fixture
def checkout(course_copy) -> Path:
    """The course's source as a git checkout, committed, never run yet."""
    git(course_copy, "init", "-q")
    git(course_copy, "add", "-A")
    git(course_copy, "commit", "-q", "-m", "course")
    return course_copy


def test_in_a_checkout_an_edit_made_before_the_first_command_is_not_taken(checkout):
    find, replace, seen = LEARNER_EDITS["budget"]
    committed = manifest(checkout, ID).read_text(encoding="utf-8")
    shipped = seen(Course(checkout, working_tree=True).get(ID))  # reads the folder: keeps nothing
    assert not (checkout / ".oomlab").exists()
    edit(checkout, ID, find, replace)
    ex = Course(checkout).get(ID)  # the first sight: git's committed manifest is kept
    assert seen(ex) == shipped and ex.manifest_edited
    assert ex.manifest_path.read_text(encoding="utf-8") == committed
    git(checkout, "commit", "-q", "-am", "my budget")  # committed later, the edit is still not the original
    assert seen(Course(checkout).get(ID)) == shipped
    # The maintainer's tools read the folder as it is.
    ex = Course(checkout, working_tree=True).get(ID)
    assert seen(ex) != shipped and ex.manifest_path == manifest(checkout, ID) and not ex.manifest_edited


def test_in_a_source_without_git_the_manifest_is_kept_once_it_loads(course_copy):
    find, replace, seen = LEARNER_EDITS["budget"]
    mine = manifest(course_copy, ID)
    good = mine.read_text(encoding="utf-8")
    mine.write_text(good.replace("step = ", "step = = ", 1), encoding="utf-8")
    course = Course(course_copy, strict=False)  # broken at first sight: named as the learner's, and not kept
    assert course.problem(ID).startswith(f"exercises/{ID}/exercise.toml is not valid TOML")
    mine.write_text(good, encoding="utf-8")
    shipped = seen(Course(course_copy).get(ID))  # fixed: now it is seen, and kept
    edit(course_copy, ID, find, replace)
    ex = Course(course_copy).get(ID)
    assert seen(ex) == shipped and ex.manifest_edited
    assert ex.manifest_path.read_text(encoding="utf-8") == good


def test_a_damaged_kept_manifest_says_how_to_get_it_back(learner_course):
    kept = StateDir(learner_course).original(ID, "exercise.toml")
    kept.write_text("id = = 1\n", encoding="utf-8")
    problem = Course(learner_course, strict=False).broken[ID]
    assert f"{kept} is not valid TOML" in problem.what and "delete it" in problem.todo
    kept.unlink()  # oomlab init's folder: the package's copy takes its place
    assert Course(learner_course).get(ID).manifest_path == Course(REPO, working_tree=True).get(ID).manifest_path


@pytest.fixture
def faked_runs(learner_course, monkeypatch):
    """`oomlab check` and `run` in this process, the measuring faked: each run records the exercise and script it got.

    The learner's run strands twice the non-releasable memory the shipped tolerance allows, and
    retries once more than the shipped maximum: it fails both checks as shipped, and would pass
    with the tolerance of LEARNER_EDITS and without the retries check.
    """
    from oomlab.grading import verdict
    from oomlab.measure import harness, machine
    from oomlab.measure.harness import Measurement
    from oomlab.units import MIB

    checks = Course(learner_course, working_tree=True).get(ID).checks  # as shipped: nothing is edited yet
    base = 100 * MIB
    inactive = checks["inactive_split_peak"]
    allowed = max(base * (1 + inactive["tolerance"]), base + inactive.get("slack_mib", 0) * MIB)
    runs = []

    def measurement(ex, script, inactive, retries) -> Measurement:
        stats = {"peak_allocated": 500 * MIB, "peak_reserved": 600 * MIB, "inactive_split_peak": inactive, "retries": retries}
        return Measurement(script=str(script), status="ok", stats=stats, workload={}, budget_bytes=ex.budget_bytes)

    def measure(ex, script, **kwargs):
        runs.append((ex, Path(script)))
        return measurement(ex, script, int(2 * allowed), checks["retries"]["max"] + 1)

    monkeypatch.setattr(verdict, "measure_exercise_file", measure)
    monkeypatch.setattr(harness, "measure_exercise_file", measure)  # `oomlab run` imports it from there when it runs
    monkeypatch.setattr(verdict, "reference_for", lambda ex, gpu, torch: measurement(ex, ex.solution_path, base, 0))
    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: True)  # as on a GPU machine: the runs are what is faked
    monkeypatch.chdir(learner_course)
    monkeypatch.setenv("COLUMNS", "200")
    return runs


def test_check_grades_with_the_shipped_manifest_and_names_the_edited_one(learner_course, faked_runs, capsys):
    shipped = Course(learner_course).get(ID)
    note = f"exercises/{ID}/exercise.toml differs from the course's own"
    rc, out = oomlab(capsys, "check", ID)
    assert rc == 1 and note not in out, out  # nothing edited: nothing to say
    for find, replace, _ in LEARNER_EDITS.values():  # every edit at once: a bigger budget, no retries check, ...
        edit(learner_course, ID, find, replace)
    (learner_course / "exercises" / ID / "mine.py").write_text("print('fits')\n", encoding="utf-8")
    rc, out = oomlab(capsys, "check", ID)
    ex, script = faked_runs[-1]
    assert (ex.budget_bytes, ex.checks, script) == (shipped.budget_bytes, shipped.checks, shipped.learner_path)
    assert rc == 1 and "✗ inactive_split_peak" in out and "✗ retries" in out, out
    assert f"Note: {note} (.oomlab/originals/{ID}/exercise.toml), which was used" in out, out
    rc, out = oomlab(capsys, "run", ID)
    assert faked_runs[-1][1] == shipped.learner_path and f"Note: {note}" in out, out
