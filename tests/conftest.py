"""Fixtures for the project's own tests; GPU tests skip where there is no GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from oomlab.grading.pytest_plugin import pytest_collection_modifyitems, pytest_configure  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def course_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the real course (exercises/ and solutions/) that a test may break; not a git checkout."""
    root = (tmp_path / "course").resolve()
    for folder in ("exercises", "solutions"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    # Never let git find a repository above the copy (pytest's tmp folder could sit inside one).
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.resolve()))
    monkeypatch.delenv("OOMLAB_ROOT", raising=False)
    return root
