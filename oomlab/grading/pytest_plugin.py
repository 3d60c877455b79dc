"""pytest hooks for the graders and the project's tests: whose files to grade, and GPU tests without a GPU.

``graders/conftest.py`` and ``tests/conftest.py`` import these hooks; a test
marked ``gpu`` is skipped, with the reason, where torch sees no CUDA device.
A session that was to grade the learner's fixes (``pytest graders``, without
``--solutions``) and graded none of them ends with exit status 5, pytest's "no
tests ran", and says so beside the final count: skipped grading must never read as a pass.
"""

from __future__ import annotations

import pytest

__all__ = [
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_runtest_logreport",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
]

GRADER = "test_your_fix_passes"  # the test that grades a learner's file (graders/test_exercises.py)
_graded = {"ran": 0, "skipped": 0}


def pytest_addoption(parser):
    parser.addoption(
        "--solutions",
        action="store_true",
        help="check the course itself: every reference fix passes, every seeded bug, wrong fix and cheat fails",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where none is present")


def cuda_available() -> bool:
    from oomlab.measure.machine import why_no_gpu

    return not why_no_gpu()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: none is visible here (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    """Count the learner's graders that ran, and those skipped before they could (no GPU, or -k)."""
    if GRADER not in report.nodeid:
        return
    if report.when == "call":
        _graded["ran"] += 1
    elif report.when == "setup" and report.skipped:
        _graded["skipped"] += 1


def nothing_graded(config) -> bool:
    return not config.getoption("--solutions", False) and _graded["skipped"] > 0 and _graded["ran"] == 0


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    if nothing_graded(session.config) and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.NO_TESTS_COLLECTED


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # the outermost wrapper: after the short summary, by the final count
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    yield
    if nothing_graded(config):
        terminalreporter.write_sep(
            "=",
            f"NOTHING WAS GRADED: {_graded['skipped']} of your fixes skipped, none checked "
            "(grading needs a CUDA GPU; `oomlab doctor` says what this machine lacks)",
            red=True,
            bold=True,
        )
