"""Sizing a budget from the fixes' peaks (a margin above the largest, in whole 64 MiB steps), measured as grading measures."""

from __future__ import annotations

from pathlib import Path

from oomlab.grading.calibrate import MARGIN, STEP_BYTES, proposed_budget
from oomlab.units import MIB


def test_the_budget_leaves_the_largest_fix_its_margin_in_whole_steps():
    budget = proposed_budget([900 * MIB, 1000 * MIB])
    assert budget % STEP_BYTES == 0
    assert budget >= 1000 * MIB * (1 + MARGIN)
    assert budget - STEP_BYTES < 1000 * MIB * (1 + MARGIN)  # the smallest such step
    assert proposed_budget([1000 * MIB]) == budget  # only the largest fix counts


def test_calibrating_measures_each_run_as_grading_does_under_the_ceiling(course_copy, monkeypatch):
    from oomlab.course import Course
    from oomlab.grading.calibrate import calibrate
    from oomlab.measure import harness

    calls = []

    def measure(script, **kwargs):
        calls.append((Path(script), kwargs))
        return harness.Measurement(script=str(script), status="ok", stats={"peak_reserved": 100 * MIB})

    monkeypatch.setattr(harness, "measure", measure)
    ex = Course(course_copy, working_tree=True).get("allocator-settings")  # its fixes set the allocator themselves
    ceiling = 12 << 30
    [row] = calibrate([ex], ceiling, jobs=1)
    assert row["proposed_budget_bytes"] == proposed_budget([100 * MIB])
    calibrated = list(calls)
    calls.clear()
    for script, _ in calibrated:
        harness.measure_exercise_file(ex, script)
    graded = [(script, {**kwargs, "budget_bytes": ceiling}) for script, kwargs in calls]
    assert calibrated == graded and len(graded) == len(row["runs"])
