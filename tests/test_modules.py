"""The course's order: ``exercises/modules.toml`` lists the modules in teaching order, each with its exercises.

It is the one place that says which module an exercise is in and where it comes: an exercise's
number is its place in it, so an exercise inserted renumbers nothing before it and a manifest
that does not load renumbers nothing at all; a folder it does not name, or a name with no
folder, is an error that says which file to edit and what to add.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from oomlab.course import Course
from oomlab.course.modules import met_before_its_step
from oomlab.course.shipped import init_course
from oomlab.errors import OomLabError

REPO = Path(__file__).resolve().parents[1]
LIST = Path("exercises") / "modules.toml"


def add_folder(root: Path, ex_id: str, like: str = "eval-graphs") -> None:
    """A new exercise folder, a copy of ``like`` under another id, that no list names yet."""
    shutil.copytree(root / "exercises" / like, root / "exercises" / ex_id)
    manifest = root / "exercises" / ex_id / "exercise.toml"
    text = manifest.read_text(encoding="utf-8")
    assert text.count(f'id = "{like}"\n') == 1
    manifest.write_text(text.replace(f'id = "{like}"\n', f'id = "{ex_id}"\n'), encoding="utf-8")


def edit_list(root: Path, find: str, replace: str) -> Path:
    path = root / LIST
    text = path.read_text(encoding="utf-8")
    assert text.count(find) == 1, f"{path} no longer contains {find!r} exactly once"
    path.write_text(text.replace(find, replace), encoding="utf-8")
    return path


def test_the_list_is_the_one_home_of_each_exercises_module_and_place():
    course = Course(REPO, working_tree=True)
    assert course.modules_file == REPO / LIST
    folders = sorted(p.parent.name for p in REPO.glob("exercises/*/exercise.toml"))
    assert sorted([*course.ids_in_order, *course.drafts]) == folders and len(set(course.ids_in_order)) == len(course.ids_in_order)
    assert [e.id for e in course.exercises] == [ex_id for m in course.modules for ex_id in m.exercises]
    for ex in course.exercises:
        data = tomllib.loads(ex.manifest_path.read_text(encoding="utf-8"))
        assert not {"module", "order"} & set(data), f"{ex.manifest_path}: the list says where it belongs, not its manifest"
        assert ex.module is not None and ex.id in ex.module.exercises


def test_an_inserted_exercise_renumbers_nothing_before_it(course_copy):
    before = Course(course_copy, working_tree=True).ids_in_order
    add_folder(course_copy, "eval-graphs-again")
    edit_list(course_copy, '    "summed-microbatch-losses",\n', '    "summed-microbatch-losses",\n    "eval-graphs-again",\n')
    course = Course(course_copy, working_tree=True)
    k = before.index("summed-microbatch-losses") + 1
    assert course.ids_in_order[:k] == before[:k], "an exercise before the new one changed its number"
    assert course.number("eval-graphs-again") == k + 1 and course.get(str(k + 1)).id == "eval-graphs-again"
    assert course.ids_in_order[k + 1 :] == before[k:], "those after it move down by one"
    assert course.get("eval-graphs-again").module.name == "hunt"


@pytest.mark.parametrize("where", [0, 5, -1], ids=["first", "middle", "last"])
def test_a_broken_manifest_keeps_everyones_number(course_copy, where):
    every = Course(course_copy, working_tree=True).ids_in_order
    broken = every[where]
    (course_copy / "exercises" / broken / "exercise.toml").write_text("", encoding="utf-8")  # nothing left to say where
    course = Course(course_copy, strict=False, working_tree=True)
    assert list(course.broken) == [broken]
    assert course.ids_in_order == every
    assert [course.number(ex_id) for ex_id in every] == list(range(1, len(every) + 1))
    for n, ex_id in enumerate(every, 1):
        if ex_id != broken:
            assert course.get(str(n)).id == ex_id
    with pytest.raises(OomLabError, match="the key 'id' is missing"):
        course.get(str(every.index(broken) + 1))


def test_a_folder_the_list_does_not_name_is_an_error_that_says_what_to_add(course_copy):
    every = Course(course_copy, working_tree=True).ids_in_order
    add_folder(course_copy, "new-exercise")
    listed = course_copy / LIST
    with pytest.raises(OomLabError) as err:
        Course(course_copy, working_tree=True)
    assert err.value.what == f"{course_copy / 'exercises' / 'new-exercise'} is an exercise folder that {listed} does not name."
    assert err.value.todo.startswith(f'Add "new-exercise" to the exercises of its module in {listed}, at its place')
    # A learner's commands: it blocks only itself, numbered after the rest, so it renumbers nothing.
    course = Course(course_copy, strict=False, working_tree=True)
    assert list(course.broken) == ["new-exercise"] and course.ids_in_order == [*every, "new-exercise"]
    assert (
        course.problem("new-exercise")
        == "exercises/new-exercise is an exercise folder that exercises/modules.toml does not name."
    )
    with pytest.raises(OomLabError, match="does not name"):
        course.get(str(len(every) + 1))


def test_a_name_in_the_list_with_no_folder_is_an_error_that_says_what_to_add(course_copy):
    every = Course(course_copy, working_tree=True).ids_in_order
    shutil.rmtree(course_copy / "exercises" / "retain-graph")
    listed = course_copy / LIST
    with pytest.raises(OomLabError) as err:
        Course(course_copy, working_tree=True)
    assert err.value.what == (
        f"{listed} names the exercise 'retain-graph' in module 'hunt', "
        f"but there is no folder {course_copy / 'exercises' / 'retain-graph'}."
    )
    assert err.value.todo == (
        f"Add the folder exercises/retain-graph/ with its script and exercise.toml, or take 'retain-graph' out of {listed}."
    )
    course = Course(course_copy, strict=False, working_tree=True)
    assert list(course.broken) == ["retain-graph"] and course.ids_in_order == every, (
        "it keeps its number, and so does every other"
    )
    with pytest.raises(OomLabError, match="there is no folder"):
        course.get("retain-graph")


@pytest.mark.parametrize(
    "find, replace, words",
    [
        ('name = "capstone"', 'name = = "capstone"', "is not valid TOML"),
        ("[[modules]]", "[[mods]]", "lists no modules"),
        ('    "capstone",\n]', '    "capstone",\n    "eval-graphs",\n]', "names the exercise 'eval-graphs' more than once"),
        ('name = "capstone"', 'name = "production"', "names the module 'production' more than once"),
        ('title = "Capstone"\n', "", "module 'capstone': 'title' should be a non-empty string, found None"),
        ('exercises = [\n    "capstone",\n]', 'exercises = "capstone"', "'exercises' should be a list of exercise ids"),
        ('    "capstone",\n]', '    "../capstone",\n]', "module 'capstone': the exercise '../capstone' is not a plain name"),
        ('reading = ["training-step.md#anatomy"', 'reading = ["training-step#anatomy"', "each PAGE.md#ANCHOR"),
    ],
    ids=[
        "not-toml",
        "no-modules",
        "exercise-twice",
        "module-twice",
        "no-title",
        "exercises-not-a-list",
        "not-a-name",
        "reading-not-a-section",
    ],
)
def test_a_list_that_does_not_load_says_what_is_wrong_in_it(course_copy, find, replace, words):
    path = course_copy / LIST
    text = path.read_text(encoding="utf-8")
    assert find in text, f"{path} no longer contains {find!r}"
    path.write_text(text.replace(find, replace), encoding="utf-8")  # every [[modules]] at once, or the one line
    for strict in (True, False):  # even for a learner's commands: without the list nothing can be numbered
        with pytest.raises(OomLabError) as err:
            Course(course_copy, strict=strict, working_tree=True)
        assert str(path) in err.value.what and words in err.value.what, err.value.what


def test_a_course_without_a_list_says_where_to_write_it(course_copy):
    (course_copy / LIST).unlink()
    with pytest.raises(OomLabError) as err:
        Course(course_copy, working_tree=True)
    assert err.value.what == f"{course_copy / LIST} does not exist."
    assert "each with its exercises in teaching order" in err.value.todo


def test_a_course_declares_its_own_modules(tmp_path):
    """A course folder other than the repository's: its own list orders it, names its modules, tags its steps."""
    root = tmp_path / "course"
    for ex_id in ("feature-cache", "eval-graphs"):
        for part in ("exercises", "solutions"):
            shutil.copytree(REPO / part / ex_id, root / part / ex_id)
    (root / LIST).write_text(
        '[[modules]]\nname = "basics"\ntitle = "Basics"\ngoal = "Find it."\nexercises = ["eval-graphs", "feature-cache"]\n\n'
        '[[modules]]\nname = "hunt"\ntitle = "Hunting"\ngoal = """\nHunt it,\n  later.\n"""\nexercises = []\n',
        encoding="utf-8",
    )
    course = Course(root, working_tree=True)
    assert [e.id for e in course.exercises] == course.ids_in_order == ["eval-graphs", "feature-cache"]
    assert [(m.name, m.title, m.goal, m.exercises) for m in course.modules] == [
        ("basics", "Basics", "Find it.", ("eval-graphs", "feature-cache")),
        ("hunt", "Hunting", "Hunt it, later.", ()),
    ]
    # eval-graphs drills the hunt, which this course teaches after it; feature-cache's snapshot it never teaches.
    assert [met_before_its_step(e.module, e.step) for e in course.exercises] == [True, False]
    from oomlab.site.module_pages import taught

    assert [(m.name, [(n, ex.id) for n, ex in chosen]) for m, chosen in taught(course.exercises)] == [
        ("basics", [(1, "eval-graphs"), (2, "feature-cache")])
    ]
    pytest.importorskip("nbformat", reason="the nbgrader course needs the classroom extra")
    from oomlab.classroom.build import assignments

    assert {name: [e.id for e in exs] for name, exs in assignments(course).items()} == {
        "basics": ["eval-graphs", "feature-cache"]
    }


def test_a_learners_folder_takes_the_list_along_and_without_it_is_ordered_by_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.resolve()))
    root = tmp_path / "mine"
    init_course(root)
    assert (root / LIST).read_bytes() == (REPO / LIST).read_bytes()
    shipped = Course(REPO, working_tree=True).ids_in_order
    assert Course(root).ids_in_order == shipped
    (root / LIST).unlink()  # a folder made by an older oomlab, whose manifests said where each exercise belongs
    course = Course(root)
    assert course.modules_file == REPO / LIST and course.ids_in_order == shipped


def add_draft(root: Path, ex_id: str) -> None:
    """``ex_id`` listed as a draft, first of the list's ``drafts`` (written before the first module where there are none)."""
    path = root / LIST
    text = path.read_text(encoding="utf-8")
    if re.search(r"^drafts = \[", text, flags=re.M):
        text = re.sub(r"^drafts = \[", f'drafts = ["{ex_id}", ', text, count=1, flags=re.M)
    else:
        text = text.replace("[[modules]]", f'drafts = ["{ex_id}"]\n\n[[modules]]', 1)
    path.write_text(text, encoding="utf-8")


def test_a_draft_keeps_its_folder_beside_the_others_and_stays_out_of_the_course(course_copy):
    before = Course(course_copy).ids_in_order
    add_folder(course_copy, "not-measured-yet")
    add_draft(course_copy, "not-measured-yet")
    course = Course(course_copy)
    assert course.drafts[0] == "not-measured-yet"
    assert course.ids_in_order == before and "not-measured-yet" not in {e.id for e in course.exercises}
    assert not course.broken
    with pytest.raises(OomLabError, match="'not-measured-yet' is a draft, not yet part of the course"):
        course.get("not-measured-yet")  # `oomlab check not-measured-yet`


def test_a_draft_that_is_in_a_module_too_is_an_error_and_one_whose_folder_stayed_behind_is_no_exercise(course_copy):
    add_draft(course_copy, "eval-graphs")
    with pytest.raises(OomLabError, match="both as a draft and in module 'hunt'"):
        Course(course_copy)
    # A copy of the course (a class's, a learner's) takes the list along and leaves the drafts' folders behind.
    edit_list(course_copy, 'drafts = ["eval-graphs"', 'drafts = ["left-behind"')
    course = Course(course_copy)
    assert "left-behind" in course.drafts and "left-behind" not in course.ids_in_order and not course.broken


def test_drafts_that_are_not_a_list_of_ids_say_so(course_copy):
    path = course_copy / LIST
    text = re.sub(r"^drafts = .*\n", "", path.read_text(encoding="utf-8"), flags=re.M)
    path.write_text(text.replace("[[modules]]", 'drafts = "eval-graphs"\n\n[[modules]]', 1), encoding="utf-8")
    with pytest.raises(OomLabError, match="'drafts' should be a list of exercise ids, found 'eval-graphs'"):
        Course(course_copy)


def test_every_draft_of_the_course_is_a_well_formed_exercise_whose_edits_apply():
    """A draft is checked as an exercise is, so that it needs only the GPU's measurements to join the course."""
    from oomlab.course.manifest import load_exercise
    from oomlab.grading.truth import variants

    course = Course(REPO, working_tree=True)
    for ex_id in course.drafts:
        assert (REPO / "exercises" / ex_id).is_dir(), f"{ex_id} is a draft of {LIST} with no folder"
        ex = load_exercise(REPO / "exercises" / ex_id / "exercise.toml", REPO)
        runs = variants(ex)
        assert ex.solution_path.is_file() and {v.kind for v in runs} >= {"solution", "bug", "wrong-fix"}, ex_id


def test_a_learners_folder_gets_the_course_but_not_its_drafts(course_copy, tmp_path, monkeypatch):
    from oomlab.course import shipped

    add_folder(course_copy, "not-measured-yet")
    add_draft(course_copy, "not-measured-yet")
    shutil.copytree(REPO / "graders", course_copy / "graders", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(shipped, "shipped_root", lambda: course_copy)
    init_course(tmp_path / "mine")
    mine = Course(tmp_path / "mine")
    assert not (tmp_path / "mine" / "exercises" / "not-measured-yet").exists() and "not-measured-yet" in mine.drafts
    assert [e.id for e in mine.exercises] == [e.id for e in Course(course_copy).exercises]


def test_a_modules_reading_is_linked_by_the_titles_of_its_page_and_section_and_a_missing_one_stops_the_build(tmp_path):
    """A module names the site's sections it builds on once (PAGE.md#ANCHOR); its page links each by what the page and
    the section call themselves, and a section that is not there stops the build with where it is named."""
    pytest.importorskip("mkdocs")
    from dataclasses import replace

    from mkdocs.exceptions import PluginError

    from oomlab.site.module_pages import module_page, reading_section

    course = Course(REPO, working_tree=True)
    (sizing,) = [m for m in course.modules if m.name == "size-it-first"]
    page = module_page(sizing, course.exercises, REPO / "course")
    assert page.index("## Read first") < page.index("## The exercises")
    assert (
        "- [What a parameter costs](../training-step.md#bytes-per-parameter), in "
        "[The memory of a training step](../training-step.md)" in page
    )
    (tmp_path / "training-step.md").write_text("# The memory of a training step\n\n## Phase by phase {#anatomy}\n")
    with pytest.raises(PluginError, match=r"module 'size-it-first' reads training-step.md#bytes-per-parameter, but"):
        module_page(sizing, course.exercises, tmp_path)
    assert reading_section(replace(sizing, reading=()), "modules/size-it-first.md", REPO / "course") == []
    for module in course.modules:  # every module's reading is there to link
        assert module.reading and module_page(module, course.exercises, REPO / "course").count("- [") >= len(module.reading)
