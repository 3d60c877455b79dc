"""The per-exercise graders, derived from each exercise.toml.

``pytest graders`` grades your files in exercises/; ``pytest graders --solutions``
grades the reference fixes and checks the course itself: every seeded bug and
every tempting wrong fix must fail, with the check its manifest names.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.grading.verdict import Report, grade
from oomlab.course.progress import pristine_source
from oomlab.grading.truth import write_variant

ROOT = Path(__file__).resolve().parent.parent
COURSE = Course(ROOT)
WRONG_FIXES = [(ex, fix) for ex in COURSE.exercises for fix in ex.wrong_fixes]


def explain(report: Report) -> str:
    m = report.measurement
    if not report.checks:
        return f"{m.status}: {m.message} {m.where}".strip()
    lines = [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.measured} (required {c.threshold}) {c.detail}" for c in report.checks]
    return "\n".join(lines)


@pytest.fixture(scope="session")
def solutions(request) -> bool:
    return request.config.getoption("--solutions")


@pytest.mark.gpu
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_exercise_passes(ex, solutions):
    report = grade(ex, ex.solution_path if solutions else ex.learner_path)
    assert report.passed, explain(report)


@pytest.mark.gpu
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_seeded_bug_fails_with_its_symptom(ex, solutions):
    if not solutions:
        pytest.skip("a check of the course itself: run with --solutions")
    report = grade(ex, write_variant(ex, "original", pristine_source(ex)))
    assert not report.passed and ex.symptom in report.failed(), explain(report)


@pytest.mark.gpu
@pytest.mark.parametrize("ex,fix", WRONG_FIXES, ids=[f"{e.id}-{f.name}" for e, f in WRONG_FIXES])
def test_wrong_fix_is_rejected(ex, fix, solutions):
    if not solutions:
        pytest.skip("a check of the course itself: run with --solutions")
    report = grade(ex, write_variant(ex, fix.name, fix.apply(pristine_source(ex))))
    assert not report.passed and fix.expect in report.failed(), explain(report)


# Cheats that any exercise could be tried with: (name, how to make it from (buggy, solution), the check that catches it).
CHEATS = {
    "lift-the-budget": (
        lambda bug, sol: "import torch\ntorch.cuda.set_per_process_memory_fraction(1.0)\n" + bug,
        {"no_oom", "untampered"},
    ),
    "reset-peak-stats": (lambda bug, sol: sol + "\ntorch.cuda.reset_peak_memory_stats()\n", {"untampered"}),
    "patch-memory-stats": (
        lambda bug, sol: "import torch\ntorch.cuda.memory_stats = lambda *a, **k: {}\n" + bug,
        {"no_oom"},
    ),
    "allocator-settings-at-runtime": (
        lambda bug, sol: "import torch\ntorch.cuda.memory._set_allocator_settings('expandable_segments:True')\n" + bug,
        {"no_oom", "untampered"},
    ),
    "catch-the-oom": (
        lambda bug, sol: "import runpy, torch\ntry:\n    runpy.run_path(__file__.replace('catch-the-oom', 'buggy-copy'), run_name='__main__')\n"
        "except torch.cuda.OutOfMemoryError:\n    pass\n",
        {"no_oom", "same_workload"},
    ),
    "exit-early": (lambda bug, sol: "import sys\nsys.exit(0)\n" + sol, {"same_workload"}),
    "other-seed": (lambda bug, sol: sol.replace("torch.manual_seed(0)", "torch.manual_seed(1)"), {"same_results"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("cheat", CHEATS)
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_cheat_is_caught(ex, cheat, solutions):
    if not solutions:
        pytest.skip("a check of the course itself: run with --solutions")
    make, catchers = CHEATS[cheat]
    bug, sol = pristine_source(ex), ex.solution_path.read_text(encoding="utf-8")
    write_variant(ex, "buggy-copy", bug)
    report = grade(ex, write_variant(ex, cheat, make(bug, sol)))
    assert not report.passed and catchers & set(report.failed()), explain(report)


# What needs no GPU: every exercise is well formed, and its variants are real edits.
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_exercise_is_well_formed(ex):
    bug = ex.learner_path.read_text(encoding="utf-8") if ex.learner_path.exists() else pristine_source(ex)
    sol = ex.solution_path.read_text(encoding="utf-8")
    compile(bug, str(ex.learner_path), "exec")
    compile(sol, str(ex.solution_path), "exec")
    assert bug != sol, "the solution must change the buggy script"
    assert len(ex.hints) >= 3, "hints go nudge -> tool -> change"
    assert ex.wrong_fixes, "each exercise ships at least one tempting wrong fix"
    assert {"no_oom", "same_workload", "same_results"} <= set(ex.checks)
    for fix in ex.wrong_fixes:
        variant = fix.apply(pristine_source(ex))
        compile(variant, fix.name, "exec")
        assert variant not in (bug, sol)
