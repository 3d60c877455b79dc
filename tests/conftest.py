"""Fixtures for the project's own tests; GPU tests skip where there is no GPU."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from oomlab.grading import pytest_plugin
from oomlab.grading.pytest_plugin import pytest_configure  # noqa: F401

REPO = Path(__file__).resolve().parents[1]

# jsonschema, which nbformat and nbgrader import, imports rfc3987-syntax where it is installed (jupyter-events asks for
# it), and rfc3987-syntax builds three Earley parsers from its grammar at import: 1.2 s of CPU in every process that
# reads a notebook, each pytest worker and each nbgrader command the tests start (about ten a run). No schema these
# processes validate has an IRI format, so the tests' processes go without: a package of that name on their path that
# refuses to import, which jsonschema takes as the library being absent.
WITHOUT_RFC3987 = REPO / "tests" / "without_rfc3987"
sys.path.insert(0, str(WITHOUT_RFC3987))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(WITHOUT_RFC3987), os.environ.get("PYTHONPATH"))))

# An `oomlab check` a test runs on a GPU machine leaves no measuring server behind it for ten idle minutes
# (oomlab.measure.keeper): tests/test_warm.py starts keepers itself, and stops them.
os.environ.setdefault("OOMLAB_KEEP_WARM", "0")


def pytest_collection_modifyitems(config, items):
    """GPU tests skip where there is no GPU; and the files marked ``long`` come first.

    `make test` runs the files on pytest-xdist's workers in this order (``--dist loadfile
    --no-loadscope-reorder``): a file of tens of seconds taken last would leave one worker
    running it while the other waits, and the run waits for it.
    """
    pytest_plugin.pytest_collection_modifyitems(config, items)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)  # stable: each file keeps its order


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
    """The course site, built by `mkdocs build --strict` once per test run (needs the docs extra).

    Under pytest-xdist every worker's session asks for it; the first builds it into the run's
    shared temporary folder while the others wait on a lock, so a run builds it once (a build
    takes seconds of CPU that the other tests would wait for). Readers must not write into it.
    """
    import fcntl
    import os
    import subprocess
    import sys

    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="the docs extra is not installed: pip install -e '.[docs]'")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's folder, not an older run's
    out = shared / "built_site"
    with open(shared / "built_site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.is_dir():
            partial = shared / "built_site.partial"
            shutil.rmtree(partial, ignore_errors=True)
            proc = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(partial)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
                env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
            )
            assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
            partial.rename(out)  # whole or not there: a worker never reads a half-built site
    return out
