"""Progress state, pristine originals and reset: nothing the learner wrote is ever lost."""

from __future__ import annotations

import errno
import json
import subprocess
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.originals import keep_originals, pristine_source, reset, shipped_source
from oomlab.course.progress import Progress
from oomlab.course.shipped import init_course
from oomlab.course.state import CannotWrite, StateDir, make_folder, remove_empty_folders, shown, write_atomic
from oomlab.errors import OomLabError

REPO = Path(__file__).resolve().parents[1]


def pristine_path(ex) -> Path:
    return StateDir(ex.root).original(ex.id, ex.file)


# --- hints and the state file ----------------------------------------------------------------


def test_hints_advance_one_per_call_and_stop_at_the_last(tmp_path):
    progress = Progress(StateDir(tmp_path))
    assert [progress.next_hint("a", 3) for _ in range(5)] == [0, 1, 2, 2, 2]
    assert progress.next_hint("b", 3) == 0  # each exercise has its own count
    # The count is kept on disk: a new process goes on where the last one stopped.
    again = Progress(StateDir(tmp_path))
    assert again.next_hint("b", 3) == 1
    assert again.next_hint("a", 3) == 2


def test_passed_is_kept(tmp_path):
    Progress(StateDir(tmp_path)).mark_passed("a")
    progress = Progress(StateDir(tmp_path))
    assert progress.passed("a") and not progress.passed("b")


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", "\xff\xfe garbage"], ids=["bad-json", "not-an-object", "bad-bytes"])
def test_a_damaged_state_file_is_moved_aside(tmp_path, damage):
    state = StateDir(tmp_path).progress_file
    state.parent.mkdir()
    state.write_bytes(damage.encode("latin-1"))
    progress = Progress(StateDir(tmp_path))
    assert not state.exists()
    kept = list(state.parent.glob("state.damaged-*.json"))
    assert len(kept) == 1 and kept[0].read_bytes() == damage.encode("latin-1")
    # Progress starts fresh and can be saved again.
    assert progress.data == {"passed": {}, "hints": {}}
    assert progress.next_hint("a", 2) == 0
    assert json.loads(state.read_text())["hints"] == {"a": 1}


# --- originals and reset ---------------------------------------------------------------------


@pytest.fixture
def ex(course_copy):
    return Course(course_copy).get("eval-graphs")


def backups(ex) -> list[Path]:
    folder = ex.root / ".oomlab" / "backups" / ex.id
    return sorted(folder.iterdir()) if folder.is_dir() else []


def test_reset_restores_the_original_and_keeps_the_learners_version(ex):
    original = pristine_source(ex)  # first sight: kept before any edit
    assert original == ex.learner_path.read_text()
    edited = original.replace("eval_batches = 4096, 30, 10, 8", "eval_batches = 4096, 30, 10, 2") + "# mine\n"
    ex.learner_path.write_text(edited)

    backup = reset(ex)
    assert ex.learner_path.read_text() == original
    assert backup is not None and backup.read_text() == edited
    assert backups(ex) == [backup]


def test_two_resets_keep_two_backups(ex):
    original = pristine_source(ex)
    ex.learner_path.write_text(original + "# first try\n")
    first = reset(ex)
    ex.learner_path.write_text(original + "# second try\n")
    second = reset(ex)
    assert first != second
    assert first.read_text() == original + "# first try\n"
    assert second.read_text() == original + "# second try\n"
    assert sorted(backups(ex)) == sorted([first, second])
    assert ex.learner_path.read_text() == original


def test_reset_of_an_unedited_file_does_nothing(ex):
    original = ex.learner_path.read_text()
    assert reset(ex) is None
    assert ex.learner_path.read_text() == original
    assert backups(ex) == []


def test_a_damaged_state_file_is_recorded_as_recovered_once(tmp_path):
    state = StateDir(tmp_path).progress_file
    state.parent.mkdir()
    state.write_text("{not json")
    progress = Progress(StateDir(tmp_path))
    assert progress.recovered is not None and progress.recovered.read_text() == "{not json"
    assert progress.recovered.parent == state.parent
    assert Progress(StateDir(tmp_path)).recovered is None  # nothing damaged any more: nothing to tell


def test_a_hint_count_of_the_wrong_type_counts_as_none_shown(tmp_path):
    state = StateDir(tmp_path).progress_file
    state.parent.mkdir()
    state.write_text(json.dumps({"passed": {}, "hints": {"a": "three", "b": -2}}))
    progress = Progress(StateDir(tmp_path))
    assert progress.hints_shown("a") == 0 and progress.next_hint("a", 3) == 0
    assert progress.next_hint("b", 3) == 0


def test_a_state_file_that_cannot_be_written_is_a_clear_error(tmp_path):
    (tmp_path / ".oomlab").write_text("")  # a file where the folder belongs: fails even as root
    progress = Progress(StateDir(tmp_path))
    with pytest.raises(CannotWrite) as err:
        progress.next_hint("a", 3)
    assert f"Cannot write {tmp_path}/.oomlab/state.json" in str(err.value)
    assert isinstance(err.value, OSError)  # code that catches a failed write still does


def test_write_atomic_names_the_path_and_the_fix_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "kept.txt"
    target.write_text("old")

    def refuse(self, other):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(CannotWrite) as err:
        write_atomic(target, "new")
    assert f"Cannot write {target}: Permission denied." in str(err.value)
    assert f"chmod u+w {tmp_path}" in err.value.todo
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def test_make_folder_names_what_it_made_and_remove_empty_folders_takes_back_only_empty_ones(tmp_path):
    made = make_folder(tmp_path / "a" / "b" / "c")
    assert made == [tmp_path / "a" / "b" / "c", tmp_path / "a" / "b", tmp_path / "a"]
    (tmp_path / "a" / "keep.txt").write_text("x")
    remove_empty_folders(made)
    assert not (tmp_path / "a" / "b").exists() and (tmp_path / "a" / "keep.txt").is_file()
    with pytest.raises(CannotWrite, match="A file stands where a folder is needed"):
        make_folder(tmp_path / "a" / "keep.txt" / "d")


def test_shown_keeps_both_ends_of_a_long_argument():
    assert shown("short") == "short"
    long = "a" * 2000 + "END"
    assert len(shown(long)) < 160 and shown(long).startswith("aaa") and "END" in shown(long) and "2,003 characters" in shown(long)


def test_reset_of_a_deleted_file_restores_it(ex):
    original = pristine_source(ex)
    ex.learner_path.unlink()
    assert reset(ex) is None  # nothing to keep
    assert ex.learner_path.read_text() == original


def test_a_deleted_file_with_no_original_kept_is_a_clear_error(ex):
    ex.learner_path.unlink()
    with pytest.raises(OomLabError) as err:
        reset(ex)
    assert f"{ex.learner_path} is missing and no original copy was kept" in str(err.value)


def test_keep_originals_keeps_them_before_the_first_edit(course_copy):
    course = Course(course_copy)
    missing = course.get("one-hot-peak")
    missing.learner_path.unlink()  # skipped, not an error: `oomlab run` explains a missing file
    keep_originals(course.exercises)
    assert not pristine_path(missing).exists()
    ex = course.get("eval-graphs")
    original = ex.learner_path.read_text()
    ex.learner_path.write_text("# replaced\n")
    keep_originals(course.exercises)  # a kept original is never replaced by the learner's version
    assert pristine_source(ex) == original
    assert reset(ex).read_text() == "# replaced\n"
    assert ex.learner_path.read_text() == original


def git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", *args],
        cwd=root,
        check=True,
        capture_output=True,
    )


def test_pristine_source_prefers_git_head(course_copy):
    ex = Course(course_copy).get("eval-graphs")
    committed = ex.learner_path.read_text()
    git(course_copy, "init", "-q")
    git(course_copy, "add", "-A")
    git(course_copy, "commit", "-q", "-m", "course")
    # The learner edits before oomlab ever kept an original: HEAD still has it.
    ex.learner_path.write_text("# the learner's version\n")
    assert pristine_source(ex) == committed
    assert reset(ex).read_text() == "# the learner's version\n"
    assert ex.learner_path.read_text() == committed


def test_an_edit_the_learner_committed_is_never_taken_for_the_original(course_copy):
    ex = Course(course_copy).get("eval-graphs")
    shipped = ex.learner_path.read_text()
    git(course_copy, "init", "-q")
    git(course_copy, "add", "-A")
    git(course_copy, "commit", "-q", "-m", "course")
    keep_originals([ex])  # the first oomlab command in the folder
    ex.learner_path.write_text("# the learner's version\n")
    git(course_copy, "commit", "-q", "-am", "my work")
    assert reset(ex).read_text() == "# the learner's version\n"
    assert ex.learner_path.read_text() == shipped


def test_pristine_source_falls_back_to_the_file(course_copy):
    ex = Course(course_copy).get("eval-graphs")
    assert not (course_copy / ".git").exists()
    current = ex.learner_path.read_text()
    assert pristine_source(ex) == current
    assert pristine_path(ex).read_text() == current


# --- a course folder made by `oomlab init` ---------------------------------------------------


@pytest.fixture
def learner_course(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.resolve()))
    dest = tmp_path / "my-course"
    init_course(dest)
    return dest


def test_init_writes_the_exercises_and_graders_but_not_the_solutions(learner_course):
    assert sorted(p.name for p in learner_course.iterdir()) == [".gitignore", ".oomlab", "exercises", "graders"]
    course = Course(learner_course)
    assert [e.id for e in course.exercises] == [e.id for e in Course(REPO, working_tree=True).exercises]
    for ex in course.exercises:
        assert ex.learner_path.read_text() == (REPO / "exercises" / ex.id / ex.file).read_text()
        assert ex.solution_path == REPO / "solutions" / ex.id / ex.file  # graded against the shipped fix
        assert shipped_source(ex) == ex.learner_path.read_text()
    assert (learner_course / "graders" / "test_exercises.py").is_file()


def test_reset_in_an_initialised_course_gives_back_the_shipped_file_after_a_committed_edit(learner_course):
    ex = Course(learner_course).get("feature-cache")
    shipped = (REPO / "exercises" / ex.id / ex.file).read_text()
    git(learner_course, "init", "-q")
    git(learner_course, "add", "-A")
    git(learner_course, "commit", "-q", "-m", "start")
    ex.learner_path.write_text(shipped + "# my fix\n")
    git(learner_course, "commit", "-q", "-am", "my fix")
    assert reset(ex).read_text() == shipped + "# my fix\n"
    assert ex.learner_path.read_text() == shipped


def test_without_its_state_folder_an_initialised_course_resets_from_the_package(learner_course):
    import shutil

    shutil.rmtree(learner_course / ".oomlab")
    ex = Course(learner_course).get("one-hot-peak")
    ex.learner_path.write_text("# broken\n")
    reset(ex)
    assert ex.learner_path.read_text() == (REPO / "exercises" / ex.id / ex.file).read_text()


def test_init_never_writes_into_a_folder_that_holds_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OomLabError, match="is not empty; nothing was changed"):
        init_course(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


# --- reset never loses the learner's version -------------------------------------------------


def test_reset_never_overwrites_when_the_backup_cannot_be_written(ex):
    pristine_source(ex)
    ex.learner_path.write_text("# my work\n")
    (ex.root / ".oomlab" / "backups").write_text("")  # a file where the backups folder belongs
    with pytest.raises(OomLabError) as err:
        reset(ex)
    assert "Your version could not be kept before the reset" in err.value.what
    assert "Nothing was changed: exercises/eval-graphs/train.py is as you left it" in err.value.todo
    assert ex.learner_path.read_text() == "# my work\n"


def test_reset_of_a_read_only_file_changes_nothing(ex, monkeypatch):
    from oomlab.course import originals

    pristine_source(ex)
    ex.learner_path.write_text("# my work\n")
    monkeypatch.setattr(originals.os, "access", lambda path, mode: Path(path) != ex.learner_path)
    with pytest.raises(OomLabError, match="is read-only, so the reset leaves it alone"):
        reset(ex)
    assert ex.learner_path.read_text() == "# my work\n" and backups(ex) == []


def test_reset_of_an_unreadable_file_changes_nothing(ex, monkeypatch):
    pristine_source(ex)
    ex.learner_path.write_text("# my work\n")
    real = Path.read_bytes

    def unreadable(self):
        if self == ex.learner_path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with pytest.raises(OomLabError) as err:
        reset(ex)
    assert "Cannot read your version" in err.value.what and "Nothing was changed" in err.value.todo
    monkeypatch.undo()
    assert ex.learner_path.read_text() == "# my work\n" and backups(ex) == []


def test_reset_when_the_original_cannot_be_written_back_keeps_both_copies(ex, monkeypatch):
    from oomlab.course import originals

    original = pristine_source(ex)
    ex.learner_path.write_text("# my work\n")
    real = originals.write_atomic

    def refuse_the_exercise(path, data):
        if path == ex.learner_path:
            raise CannotWrite(f"Cannot write {path}: Permission denied.", "Make it writable.")
        real(path, data)

    monkeypatch.setattr(originals, "write_atomic", refuse_the_exercise)
    with pytest.raises(OomLabError) as err:
        reset(ex)
    assert "The original could not be put back" in err.value.what and "a copy is also kept at .oomlab/backups/" in err.value.todo
    assert ex.learner_path.read_text() == "# my work\n" != original
    assert [b.read_text() for b in backups(ex)] == ["# my work\n"]


def test_reset_keeps_a_version_that_is_not_utf8(ex):
    pristine_source(ex)
    ex.learner_path.write_bytes(b"# caf\xe9\n")
    backup = reset(ex)
    assert backup.read_bytes() == b"# caf\xe9\n"
    assert ex.learner_path.read_text() == pristine_source(ex)


def test_a_read_only_filesystem_is_named_as_such_not_answered_with_chmod(tmp_path, monkeypatch):
    def refuse(self, other):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(CannotWrite) as err:
        write_atomic(tmp_path / "kept.txt", "new")
    assert "read-only" in err.value.todo and "chmod" not in err.value.todo
