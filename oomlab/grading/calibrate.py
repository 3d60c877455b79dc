"""Sizing an exercise's budget: its fixes and its bug measured under a generous ceiling instead of the budget.

A budget is right when every honest fix fits it with room to spare and the
seeded bug does not. ``oomlab dev calibrate`` measures the reference fix, the
accepted alternatives, the bug and the wrong fixes of each exercise under one
ceiling far above any budget, and proposes the budget that leaves the fixes a
margin; ``oomlab dev verify`` then shows whether the bug fails under it. The
bug's uncapped figures are only a guide: under a cap the allocator flushes its
cache and retries before it gives up, so fragmentation shows as retries first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.errors import OomLabError
from oomlab.grading.truth import variants
from oomlab.measure.harness import measure_exercise_file
from oomlab.oom import first_line
from oomlab.units import MIB

__all__ = ["calibrate", "fitting_failures", "proposed_budget", "write_budget"]

MARGIN = 0.10  # the room a fix gets above its own peak reserved memory
STEP_BYTES = 64 * MIB  # budgets are whole multiples of this


def proposed_budget(fix_peaks: list[int]) -> int:
    """The smallest multiple of 64 MiB that is :data:`MARGIN` above the largest peak reserved of the fixes."""
    need = max(fix_peaks) * (1 + MARGIN)
    return int(-(-need // STEP_BYTES) * STEP_BYTES)


def calibrate(exercises: list[Exercise], ceiling: int, jobs: int, note: Callable[[str], None] = lambda _: None) -> list[dict]:
    """One row per exercise: each of its runs (cheats aside) under ``ceiling``, and the budget they suggest."""
    runs = [v for ex in exercises for v in variants(ex) if v.kind != "cheat"]

    def one(variant):
        # Every setting of a graded run but the budget, so the figures are the ones grading will see.
        m = measure_exercise_file(variant.exercise, variant.script(), budget_bytes=ceiling)
        note(f"{variant.id}: {m.status}")
        stats = m.stats or {}
        return {
            "name": variant.name,
            "kind": variant.kind,
            "expect": sorted(variant.expect),
            "status": m.status,
            "alloc_conf": m.alloc_conf,
            **{k: stats.get(k) for k in ("peak_allocated", "peak_reserved", "inactive_split_peak", "retries", "ooms")},
            "wall_s": round(m.wall_s, 2) if m.wall_s is not None else None,
            "message": first_line(m.message) if m.status != "ok" else "",
            "where": m.where,
            "losses": (m.workload or {}).get("losses", [])[:3],
        }

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        measured = list(pool.map(one, runs))
    report = []
    for ex in exercises:
        rows = [r for v, r in zip(runs, measured, strict=True) if v.exercise is ex]
        fixes = [r["peak_reserved"] for r in rows if r["kind"] in ("solution", "alternative") and r["peak_reserved"]]
        report.append(
            {
                "id": ex.id,
                "budget_bytes": ex.budget_bytes,
                "fixes_peak_reserved_bytes": max(fixes) if fixes else None,
                "proposed_budget_bytes": proposed_budget(fixes) if fixes else None,
                "runs": rows,
            }
        )
    return report


def fitting_failures(row: dict, budget: int) -> list[str]:
    """The runs of a calibrate row that must run out of memory (the bug, wrong fixes that fail ``no_oom``) yet fit ``budget``.

    Under the budget they would end without an OOM: the budget is too big for them, or the bug too small.
    """
    return [
        r["name"]
        for r in row["runs"]
        if "no_oom" in r.get("expect", []) and r["status"] == "ok" and (r["peak_reserved"] or 0) <= budget
    ]


BUDGET_LINE = re.compile(r"^budget_bytes\s*=.*$", re.M)


def write_budget(manifest: Path, row: dict, gpu: str, torch_version: str) -> int:
    """Write ``row``'s proposed budget into ``manifest`` (its ``budget_bytes`` line, with the figures behind it); the budget."""
    budget = row["proposed_budget_bytes"]
    line = (
        f"budget_bytes = {budget:_}  # {budget / MIB:,.0f} MiB. {gpu}, torch {torch_version}: the fixes peak at "
        f"{row['fixes_peak_reserved_bytes'] / MIB:,.0f} MiB reserved (oomlab dev calibrate)"
    )
    text = manifest.read_text(encoding="utf-8")
    if len(BUDGET_LINE.findall(text)) != 1:
        raise OomLabError(f"{manifest} has no single budget_bytes line to rewrite.", "Write one, then calibrate again.")
    manifest.write_text(BUDGET_LINE.sub(line, text, count=1), encoding="utf-8")
    return budget
