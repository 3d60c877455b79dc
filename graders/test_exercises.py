"""The graders: one per exercise, derived from its ``exercise.toml``.

``pytest graders`` grades your files in ``exercises/`` with the course's own manifests: an
edited ``exercise.toml`` changes nothing. ``pytest graders --solutions`` checks the course
itself, as its folder has it, with the same truth check as ``oomlab dev verify``: the
reference fix passes and repeats its figures, every accepted alternative fix
passes, and the seeded bug, every tempting wrong fix and every generic cheat
fails with the check that must catch it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.originals import manifest_note, shipped_source
from oomlab.grading.truth import check_estimate, explain, explain_estimate, run_all, variants
from oomlab.grading.verdict import grade

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def course(solutions: bool) -> Course:
    """The course this run reads.

    Your files are graded with its shipped manifests, whatever yours say; ``--solutions``
    checks the course itself, whose manifests are the files in its folder.
    """
    return Course(ROOT, working_tree=solutions)


def pytest_generate_tests(metafunc):
    """Each test once per exercise (``ex``) or per run of the truth check (``variant``), of the course this run reads."""
    exercises = course(metafunc.config.getoption("--solutions")).exercises
    if "ex" in metafunc.fixturenames:
        metafunc.parametrize("ex", exercises, ids=lambda e: e.id)
    if "variant" in metafunc.fixturenames:
        metafunc.parametrize("variant", [v for ex in exercises for v in variants(ex)], ids=lambda v: v.id)


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
    scripts = [v for v in selected if not v.exercise.is_estimate]
    jobs = parallel_runs([v.exercise.budget_bytes for v in scripts])
    _, measured = run_all(scripts, jobs=jobs) if scripts else ({}, [])
    runs = {v.id: result for v, result in zip(scripts, measured, strict=True)}
    # An estimator's configs are measured by the course's code, one estimator after another on the whole GPU.
    runs.update({v.id: check_estimate(v) for v in selected if v.exercise.is_estimate})
    return runs


@pytest.mark.gpu
def test_your_fix_passes(ex, request):
    if request.config.getoption("--solutions"):
        pytest.skip("grades your files: run without --solutions")
    if ex.is_estimate:
        from oomlab.grading.estimates import grade_estimate
        from oomlab.sizing import brief

        sized = grade_estimate(ex, ex.learner_path)
        assert sized.passed, "\n".join(
            f"FAIL config {i} ({brief(c.as_dict())}) {s.part}: {s.error:+.1%}, tolerance {s.tolerance:.0%}"
            for i, (c, row) in enumerate(zip(sized.configs, sized.scores, strict=True), 1)
            for s in row
            if not s.within
        )
        return
    report = grade(ex, ex.learner_path)
    assert report.passed, "\n".join(
        ([f"Note: {note}"] if (note := manifest_note(ex)) else [])
        + [f"{report.measurement.status}: {report.measurement.message} {report.measurement.where}".strip()]
        + [f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.measured} (required {c.threshold}) {c.detail}" for c in report.checks]
    )


@pytest.mark.gpu
def test_the_course_behaves_as_its_manifest_says(variant, course_runs):
    row, report = course_runs[variant.id]
    assert row["as_expected"], (explain_estimate if variant.exercise.is_estimate else explain)(row, report)


# A check of the course that needs no GPU: every exercise is well formed, and its variants are real edits.
# It grades nothing of yours, so it runs only with --solutions: without a GPU, `pytest graders` reports
# every grader as skipped, never as passed.
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
    for fix in (*ex.wrong_fixes, *ex.alternatives):
        variant = fix.apply(bug)
        compile(variant, fix.name, "exec")
        assert variant not in (bug, sol)
    if ex.is_estimate:  # an estimator: no checks, no seed; its examples are checked when the manifest loads
        assert "def estimate(" in bug and "def estimate(" in sol, "the learner writes estimate(config)"
        return
    assert {"no_oom", "same_workload", "same_results"} <= set(ex.checks)
    assert "torch.manual_seed(0)" in sol, "the other-seed cheat changes this line: without it the cheat tests nothing"
