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


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The course site, built once per session by `mkdocs build --strict` into a tmp dir (needs the docs extra)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("built_site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out
