"""The graders as a learner runs them: without a GPU nothing is graded, so nothing may read as passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from oomlab.course import Course

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


def test_without_a_gpu_pytest_graders_reports_every_grader_skipped_and_none_passed():
    for args in ((), ("-k", "feature-cache")):
        done = pytest_graders(*args)
        summary = done.stdout.strip().splitlines()[-1]
        assert done.returncode == 0, done.stdout + done.stderr
        assert "skipped" in summary and "passed" not in summary, summary


def test_the_course_check_without_a_gpu_checks_only_what_needs_none():
    done = pytest_graders("--solutions")
    summary = done.stdout.strip().splitlines()[-1]
    exercises = len(Course(REPO).exercises)  # one well-formedness check each
    assert done.returncode == 0 and f"{exercises} passed" in summary and "skipped" in summary, summary
