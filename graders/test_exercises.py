"""The graders: one per exercise, derived from its ``exercise.toml``.

``pytest graders`` grades your files in ``exercises/``. ``pytest graders --solutions``
checks the course itself with the same truth check as ``oomlab dev verify``: the
reference fix passes and repeats its figures, every accepted alternative fix
passes, and the seeded bug, every tempting wrong fix and every generic cheat
fails with the check that must catch it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.originals import shipped_source
from oomlab.grading.truth import explain, run_all, variants
from oomlab.grading.verdict import grade

COURSE = Course(Path(__file__).resolve().parent.parent)
VARIANTS = [v for ex in COURSE.exercises for v in variants(ex)]


@pytest.fixture(scope="session")
def course_runs(request):
    """Every selected variant measured once, all at once (as ``oomlab dev verify`` does), when a test first asks."""
    from oomlab.measure.machine import parallel_runs

    if not request.config.getoption("--solutions"):
        pytest.skip("a check of the course itself: run with --solutions")
    selected = [
        item.callspec.params["variant"]
        for item in request.session.items
        if "variant" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    jobs = parallel_runs([v.exercise.budget_bytes for v in selected])
    _, measured = run_all(selected, jobs=jobs)
    return {v.id: result for v, result in zip(selected, measured, strict=True)}


@pytest.mark.gpu
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_your_fix_passes(ex, request):
    if request.config.getoption("--solutions"):
        pytest.skip("grades your files: run without --solutions")
    report = grade(ex, ex.learner_path)
    assert report.passed, "\n".join(
        [f"{report.measurement.status}: {report.measurement.message} {report.measurement.where}".strip()]
        + [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.measured} (required {c.threshold}) {c.detail}" for c in report.checks]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_the_course_behaves_as_its_manifest_says(variant, course_runs):
    row, report = course_runs[variant.id]
    assert row["as_expected"], explain(row, report)


# A check of the course that needs no GPU: every exercise is well formed, and its variants are real edits.
# It grades nothing of yours, so it runs only with --solutions: without a GPU, `pytest graders` reports
# every grader as skipped, never as passed.
@pytest.mark.parametrize("ex", COURSE.exercises, ids=lambda e: e.id)
def test_exercise_is_well_formed(ex, request):
    if not request.config.getoption("--solutions"):
        pytest.skip("a check of the course itself: run with --solutions")
    bug, sol = shipped_source(ex), ex.solution_path.read_text(encoding="utf-8")
    compile(bug, str(ex.learner_path), "exec")
    compile(sol, str(ex.solution_path), "exec")
    assert bug != sol, "the solution must change the buggy script"
    assert len(ex.hints) == 3, "hints go nudge -> tool -> change"
    assert ex.interview.question and len(ex.interview.answer.split()) >= 150, "a model answer of about two minutes"
    assert ex.wrong_fixes, "each exercise ships at least one tempting wrong fix"
    assert {"no_oom", "same_workload", "same_results"} <= set(ex.checks)
    for fix in (*ex.wrong_fixes, *ex.alternatives):
        variant = fix.apply(bug)
        compile(variant, fix.name, "exec")
        assert variant not in (bug, sol)
    assert "torch.manual_seed(0)" in sol, "the other-seed cheat changes this line: without it the cheat tests nothing"
