"""The graders as a learner runs them (shipped manifests): without a GPU nothing is graded, so nothing may read as passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from oomlab.course import Course
from oomlab.course.shipped import init_course

REPO = Path(__file__).resolve().parents[1]


def pytest_graders(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "graders", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_without_a_gpu_pytest_graders_says_nothing_was_graded_and_does_not_exit_as_a_pass():
    for args in ((), ("-k", "feature-cache")):
        done = pytest_graders(*args)
        lines = done.stdout.strip().splitlines()
        assert done.returncode == 5, done.stdout + done.stderr  # pytest's "no tests ran", never 0
        assert "skipped" in lines[-1] and "passed" not in lines[-1], lines[-1]
        assert "NOTHING WAS GRADED" in lines[-2] and "CUDA GPU" in lines[-2], done.stdout  # beside the count


def test_the_course_check_without_a_gpu_checks_only_what_needs_none():
    done = pytest_graders("--solutions")
    summary = done.stdout.strip().splitlines()[-1]
    exercises = len(Course(REPO, working_tree=True).exercises)  # one well-formedness check each
    assert done.returncode == 0 and f"{exercises} passed" in summary and "skipped" in summary, summary


def collected(root: Path, *args: str) -> subprocess.CompletedProcess:
    """``pytest graders --collect-only`` in the course folder ``root``: the tests it would run, by id."""
    env = {k: v for k, v in os.environ.items() if k != "OOMLAB_ROOT"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO), GIT_CEILING_DIRECTORIES=str(root.parent))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "graders", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_graders_grade_your_files_with_the_shipped_manifests_and_check_the_course_as_its_folder_has_it(tmp_path):
    root = tmp_path / "my-course"
    init_course(root)
    path = root / "exercises" / "feature-cache" / "exercise.toml"
    text = path.read_text(encoding="utf-8")
    assert text.count('name = "clone-each-chunk"') == 1
    path.write_text(text.replace('name = "clone-each-chunk"', 'name = "my-clone"'), encoding="utf-8")
    yours, course = collected(root), collected(root, "--solutions")
    assert yours.returncode == 0 and course.returncode == 0, yours.stdout + course.stdout
    assert "[feature-cache-clone-each-chunk]" in yours.stdout and "my-clone" not in yours.stdout
    assert "[feature-cache-my-clone]" in course.stdout and "clone-each-chunk" not in course.stdout
    # A manifest of yours that no longer parses stops nothing of yours; the course's own check names it.
    path.write_text(text.replace("step = ", "step = = ", 1), encoding="utf-8")
    yours, course = collected(root), collected(root, "--solutions")
    assert yours.returncode == 0 and "test_your_fix_passes[feature-cache]" in yours.stdout, yours.stdout + yours.stderr
    assert course.returncode != 0 and "exercises/feature-cache/exercise.toml is not valid TOML" in course.stdout + course.stderr
