"""Sizing a budget from the fixes' peaks (a margin above the largest, in whole 64 MiB steps), measured as grading measures."""

from __future__ import annotations

import shutil
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


def test_a_draft_is_calibrated_by_its_id_and_its_budget_written_into_its_manifest(course_copy, monkeypatch):
    """`oomlab dev calibrate --write ID` on a draft: its budget line rewritten with the figures behind it, the rest kept."""
    from oomlab.course import Course
    from oomlab.grading.calibrate import calibrate, fitting_failures, write_budget
    from oomlab.grading.truth import variants
    from oomlab.measure import harness
    from tests.test_modules import add_draft, add_folder

    add_folder(course_copy, "not-measured-yet")  # a copy of eval-graphs, with its reference fix
    shutil.copytree(course_copy / "solutions" / "eval-graphs", course_copy / "solutions" / "not-measured-yet")
    add_draft(course_copy, "not-measured-yet")
    course = Course(course_copy, working_tree=True)
    ex = course.draft("not-measured-yet")
    assert ex.id == "not-measured-yet" and ex.module is None

    fixes = {v.source() for v in variants(ex) if v.kind in ("solution", "alternative")}

    def measure(script, **kwargs):  # the fixes peak at 700 MiB, the bug and wrong fixes at 900
        fix = Path(script).read_text(encoding="utf-8") in fixes
        return harness.Measurement(script=str(script), status="ok", stats={"peak_reserved": (700 if fix else 900) * MIB})

    monkeypatch.setattr(harness, "measure", measure)
    [row] = calibrate([ex], 12 << 30, jobs=1)
    budget = row["proposed_budget_bytes"]
    assert budget == proposed_budget([700 * MIB]) < 900 * MIB and not fitting_failures(row, budget)
    assert fitting_failures(row, 1024 * MIB) == [r["name"] for r in row["runs"] if "no_oom" in r["expect"]]

    before = ex.manifest_path.read_text(encoding="utf-8")
    write_budget(ex.manifest_path, row, "NVIDIA H200", "2.11.0")
    after = ex.manifest_path.read_text(encoding="utf-8")
    assert f"budget_bytes = {budget:_}  # {budget // MIB} MiB. NVIDIA H200, torch 2.11.0: the fixes peak at 700 MiB" in after
    assert [line for line in before.splitlines() if not line.startswith("budget_bytes")] == [
        line for line in after.splitlines() if not line.startswith("budget_bytes")
    ]
    assert Course(course_copy, working_tree=True).draft("not-measured-yet").budget_bytes == budget
