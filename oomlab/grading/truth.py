"""The course's own truth check: every seeded bug fails, every reference fix passes.

For each exercise, on this GPU:

- the reference solution is measured twice: once as the reference, once graded
  against it (which also shows the figures repeat from run to run);
- the shipped buggy script must fail, and fail the check its manifest names as
  the symptom (an OOM, or the fragmentation or peak figure over threshold);
- each tempting wrong fix must fail the check its manifest names.
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path
from typing import Callable

from oomlab.grading.verdict import Report, grade, machine_error
from oomlab.measure.harness import MACHINE_PROBLEMS
from oomlab.course.progress import pristine_source, write_atomic
from oomlab.grading.reference import measure_reference

FIGURES = ("peak_allocated", "peak_reserved", "inactive_split_peak", "retries")


def write_variant(ex, name: str, source: str) -> Path:
    """A variant of the exercise's script (the original, a wrong fix, a cheat), where a grader can run it."""
    path = ex.root / ".oomlab" / "variants" / ex.id / name / ex.file
    write_atomic(path, source)
    return path


def summarize(report: Report, expect: str | None) -> dict:
    """One run as the report records it; ``expect`` is the check that must fail (None: must pass)."""
    m = report.measurement
    stats = m.stats or {}
    failed = report.failed()
    as_expected = report.passed if expect is None else (not report.passed and expect in failed)
    row = {
        "verdict": report.verdict,
        "status": m.status,
        "oom": m.oom,
        **{k: stats.get(k) for k in FIGURES},
        "inactive_split_final": stats.get("inactive_split_final"),
        "wall_s": round(m.wall_s, 3) if m.wall_s is not None else None,
        "failed_checks": failed,
        "expected_failure": expect,
        "as_expected": as_expected,
    }
    if m.oom or m.status not in ("ok", "oom"):
        row["message"] = (m.message.splitlines() or [""])[0][:300]
        row["where"] = m.where
    return row


def verify_exercise(ex, note: Callable[[str], None] = lambda _: None):
    note(f"{ex.id}: reference solution")
    ref = measure_reference(ex)
    if ref.status in MACHINE_PROBLEMS:
        raise machine_error(ref, ex)
    note(f"{ex.id}: solution, graded")
    solution = grade(ex, ex.solution_path, reference=ref)
    note(f"{ex.id}: buggy script")
    original = pristine_source(ex)
    buggy = grade(ex, write_variant(ex, "original", original), reference=ref)
    wrong = []
    for fix in ex.wrong_fixes:
        note(f"{ex.id}: wrong fix {fix.name}")
        path = write_variant(ex, fix.name, fix.apply(original))
        wrong.append({"name": fix.name, **summarize(grade(ex, path, reference=ref), fix.expect)})
    row = {
        "id": ex.id,
        "budget_bytes": ex.budget_bytes,
        "repeatable": ref.stats == solution.measurement.stats,
        "reference_workload": {k: ref.workload.get(k) for k in ("optimizer_steps", "train_samples", "inference_samples")},
        "buggy": summarize(buggy, ex.symptom),
        "solution": summarize(solution, None),
        "wrong_fixes": wrong,
    }
    return row, ref


def verify(exercises, note: Callable[[str], None] = lambda _: None) -> dict:
    start = time.perf_counter()
    results = [verify_exercise(ex, note) for ex in exercises]
    rows = [row for row, _ in results]
    ref = results[0][1] if results else None
    report = {
        "gpu": ref.gpu if ref else None,
        "torch": ref.torch if ref else None,
        "cuda": ref.cuda if ref else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - start, 1),
        "exercises": rows,
    }
    report["ok"] = all(
        r["buggy"]["as_expected"] and r["solution"]["as_expected"] and all(w["as_expected"] for w in r["wrong_fixes"]) and r["repeatable"]
        for r in rows
    )
    return report
