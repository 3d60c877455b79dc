"""The one truth check on CPU: which runs it makes, how it judges each, and that running them at once changes nothing."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.course.originals import shipped_source
from oomlab.grading import truth
from oomlab.grading.cheats import CHEATS, WRAPPED
from oomlab.grading.checks import CheckResult
from oomlab.grading.verdict import Report
from oomlab.measure.declared import declared_alloc_conf
from oomlab.measure.harness import Measurement

REPO = Path(__file__).resolve().parents[1]
STATS = {"peak_allocated": 100, "peak_reserved": 120, "inactive_split_peak": 10, "retries": 0, "inactive_split_final": 0}


@pytest.fixture
def course(course_copy) -> Course:
    return Course(course_copy, working_tree=True)


def test_every_exercise_is_tried_with_its_fix_bug_wrong_fixes_and_every_cheat(course):
    for ex in course.exercises:
        runs = truth.variants(ex)
        assert [v.kind for v in runs[:2]] == ["solution", "bug"]
        assert [v.name for v in runs if v.kind == "wrong-fix"] == [f.name for f in ex.wrong_fixes]
        if ex.is_estimate:  # no script runs, so no cheat of a script's: its sandbox is tested in tests/test_sizing.py
            assert [v.kind for v in runs] == ["solution", "bug", *["wrong-fix"] * len(ex.wrong_fixes)]
            continue
        # Where the fix is an allocator setting, setting it at run time is a fix, not a cheat.
        skipped = {"allocator-settings-at-runtime"} if ex.learner_settings else set()
        assert [v.name for v in runs if v.kind == "cheat"] == [c.name for c in CHEATS if c.name not in skipped]
        assert runs[0].expect == frozenset() and runs[1].expect == {ex.symptom}
        assert len({v.id for v in runs}) == len(runs)


def test_variant_scripts_are_written_under_the_state_folder_and_the_fix_is_used_in_place(course):
    ex = course.get("one-hot-peak")
    by_name = {v.name: v for v in truth.variants(ex)}
    assert by_name["solution"].script() == ex.solution_path
    bug = by_name["bug"].script()
    assert bug.is_relative_to(course.root / ".oomlab" / "variants") and bug.read_text() == ex.learner_path.read_text()
    wrapped = by_name["catch-the-oom"].script()
    assert (wrapped.parent / "wrapped.py").read_text() == ex.learner_path.read_text()  # the cheat runs the bug


def test_a_cheat_declares_truly_whether_the_bug_runs_inside_it(course):
    # The truth check trusts runs_the_bug to add the symptom to a cheat's catchers: hold it to what make() builds.
    for ex in course.exercises:
        bug, sol = shipped_source(ex), ex.solution_path.read_text(encoding="utf-8")
        for cheat in CHEATS:
            made = cheat.make(bug, sol, ex)
            compile(made, cheat.name, "exec")
            if cheat.wraps_the_bug:  # it runs the bug from a file beside it, so the source only names that file
                assert cheat.runs_the_bug and f"{WRAPPED}.py" in made and bug not in made, cheat.name
            else:
                assert cheat.runs_the_bug == (bug in made), (ex.id, cheat.name)


def test_a_cheat_that_runs_the_bug_under_the_budget_is_caught_by_the_symptom_too(course):
    for ex in course.exercises:
        cheats = {v.name: v for v in truth.variants(ex) if v.kind == "cheat"}
        for cheat in CHEATS:
            if cheat.name in cheats:
                capped = (
                    cheat.runs_the_bug and not cheat.uncapped
                )  # a cheat that lifts the budget first fits: only its own checks
                assert cheats[cheat.name].expect == cheat.caught_by | ({ex.symptom} if capped else set())


def test_every_way_a_grade_was_forged_is_tried_on_every_exercise(course):
    ways = {cheat.way for cheat in CHEATS}
    assert ways == {0, 1, 2, 3, 4, 5}
    # The cheats that run the bug without its budget are caught from outside the process: by the driver.
    for cheat in CHEATS:
        if cheat.uncapped:
            assert "driver" in cheat.caught_by and cheat.caught_by <= {"driver", "untampered"}, cheat.name
    for ex in course.scripts:
        names = {v.name for v in truth.variants(ex) if v.kind == "cheat"}
        assert {c.name for c in CHEATS if c.way} <= names, ex.id


def test_allocator_settings_are_read_from_the_source_without_writing_the_script(course):
    ex = course.get("allocator-settings")
    runs = truth.variants(ex)
    confs = [truth.declared_conf(v) for v in runs]
    assert not list((course.root / ".oomlab").rglob("*.py"))  # nothing written yet
    assert confs == [declared_alloc_conf(v.script().read_text(encoding="utf-8")) for v in runs]
    assert any(confs)  # the exercise's fixes do set the allocator's settings
    assert [v.source() for v in runs] == [v.script().read_text(encoding="utf-8") for v in runs]


def fake_report(ex, failed: list[str], stats=STATS) -> Report:
    m = Measurement(script="x.py", status="ok", stats=dict(stats))
    checks = [CheckResult(name, name not in failed, "", "", "") for name in ["untampered", *ex.checks]]
    return Report(ex, m, None, checks)


@pytest.mark.parametrize(
    "name,failed,as_expected",
    [
        ("solution", [], True),
        ("solution", ["same_results"], False),
        ("bug", ["no_oom"], True),  # its symptom
        ("bug", ["same_results"], False),  # fails, but not with the symptom the manifest names
        ("bug", [], False),
        ("lift-the-budget", ["untampered"], True),  # any one of the checks that catch it
        ("exit-early", ["no_oom"], False),
    ],
)
def test_a_run_is_as_expected_only_when_it_fails_the_check_that_must_catch_it(course, monkeypatch, name, failed, as_expected):
    ex = course.get("feature-cache")
    variant = next(v for v in truth.variants(ex) if v.name == name)
    monkeypatch.setattr(truth, "grade", lambda ex, script, reference, strict: fake_report(ex, failed))
    row, _ = truth.check(variant, Measurement(script="ref.py", status="ok", stats=dict(STATS)))
    assert row["as_expected"] is as_expected


@pytest.mark.parametrize(
    "name,status,checks,as_expected",
    [
        ("run-the-solution", "error", ["sandbox"], True),  # it reached for the answers, and the sandbox stopped it
        ("run-the-solution", "error", [], False),  # it failed, but not because the sandbox stopped it
        ("activations-on-the-host", "timeout", [], True),  # so slow, copying to the host, that it ran out of time
        ("activations-on-the-host", "crashed", [], False),
    ],
)
def test_a_run_that_did_not_finish_is_as_expected_when_what_ended_it_is_what_must_catch_it(
    course, monkeypatch, name, status, checks, as_expected
):
    ex = course.get("feature-cache")
    variant = next(v for v in truth.variants(ex) if v.name == name)
    failed = [CheckResult(c, False, "", "", "") for c in checks]
    report = Report(ex, Measurement(script="x.py", status=status), None, failed)
    monkeypatch.setattr(truth, "grade", lambda ex, script, reference, strict: report)
    row, _ = truth.check(variant, Measurement(script="ref.py", status="ok", stats=dict(STATS)))
    assert row["verdict"] == "fail" and row["as_expected"] is as_expected


def test_a_fix_whose_figures_do_not_repeat_the_reference_is_not_as_expected(course, monkeypatch):
    ex = course.get("eval-graphs")
    monkeypatch.setattr(
        truth, "grade", lambda ex, script, reference, strict: fake_report(ex, [], {**STATS, "peak_reserved": 122})
    )
    row, _ = truth.check(truth.variants(ex)[0], Measurement(script="ref.py", status="ok", stats=dict(STATS)))
    assert row["repeatable"] is False and row["as_expected"] is False


def test_running_at_once_reports_exactly_what_one_at_a_time_does(course, monkeypatch):
    def reference(ex):
        time.sleep(random.random() / 500)
        return Measurement(
            script="ref.py",
            status="ok",
            stats={**STATS, "peak_allocated": len(ex.id)},
            gpu="G",
            torch="T",
            workload={"optimizer_steps": 3, "train_samples": 9, "inference_samples": 0},
        )

    def check(variant, ref):
        time.sleep(random.random() / 500)  # runs end in any order (at 4 and 16 at a time)
        row = {
            "name": variant.name,
            "kind": variant.kind,
            "as_expected": True,
            "peak_allocated": hash(variant.id) % 1000,
            "reference": ref.stats["peak_allocated"],
        }
        if variant.kind == "solution":
            row["repeatable"] = True
        return row, None

    monkeypatch.setattr(truth, "reference_of", reference)
    monkeypatch.setattr(truth, "check", check)
    # fresh=True: the measuring is faked, so no warm server (a process that imports torch) has anything to serve.
    # The scripts: an estimate's configs are measured one sitting after another, on the whole GPU (check_estimates).
    reports = [truth.verify(course.scripts, jobs=jobs, fresh=True) for jobs in (1, 4, 16)]
    for report in reports:
        for key in ("created", "wall_s", "jobs"):
            report.pop(key)
        # When each task ran is the one thing that differs: every run and reference fix says it, within the sitting.
        spans = [row.pop("reference_task_s") for row in report["exercises"]]
        spans += [run.pop("task_s") for row in report["exercises"] for run in truth.all_runs(row)]
        assert len(spans) == report["runs"] and all(0 <= start <= end for start, end in spans)
    assert reports[0] == reports[1] == reports[2]
    first = reports[0]["exercises"][0]
    assert first["id"] == course.scripts[0].id and first["solution"]["reference"] == len(first["id"])
    assert reports[0]["ok"] and reports[0]["runs"] == sum(len(truth.variants(ex)) + 1 for ex in course.scripts)


@pytest.mark.parametrize(
    "free,cores,expected",
    [(140 << 30, 16, 16), (140 << 30, 2, 2), (7 << 30, 16, 2), (2 << 30, 16, 1), (None, 16, 1)],
    ids=["cores-bound", "few-cores", "memory-bound", "too-little-memory", "no-driver"],
)
def test_runs_at_once_are_bounded_by_cores_and_by_the_gpus_free_memory(monkeypatch, free, cores, expected):
    from oomlab.measure import machine

    monkeypatch.setattr(machine, "gpu_free_bytes", lambda: free)
    monkeypatch.setattr(machine.os, "cpu_count", lambda: cores)
    assert machine.parallel_runs([1 << 30, int(2.2 * (1 << 30))]) == expected  # the largest budget + 1 GiB each
