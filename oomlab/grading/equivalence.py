"""Proof that a run forked from a warm server measures what a fresh process measures.

:func:`compare` makes every run of the truth check twice, once in fresh Python
processes and once forked from warm servers, and sets the two side by side:
the figures the checks read (peak allocated, peak reserved, non-releasable,
retries, the OOM), every other allocator statistic, the workload (down to the
final weights' sum) and the verdict. ``oomlab dev equivalence`` commits the
table as ``course/measurements/equivalence.json``.

Not every run is bit-equal both ways, and the table says which are not: kernels whose
sums are not deterministic (scaled_dot_product_attention's backward) move a loss in its
last bits, runs that fail under memory pressure can end with other final figures or
another retry count, and the compute-on-the-cpu cheat moves work by the CPU time it has
used, which a fresh process partly spent on its imports. What is a defect of the server
(:func:`defects`) is a verdict that differs, or a run that must pass measuring other
allocator figures.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

from oomlab.grading.truth import FIGURES, check_estimates, fingerprint, run_all, variants, verify_report
from oomlab.measure.harness import Measurement

SHOWN = ("status", "oom", *FIGURES)
PASSING = ("reference", "solution", "alternative")  # the kinds of run that must pass


def defects(report: dict) -> list[str]:
    """The rows of an equivalence table that show a defect of the server, each as one line; none, where it has none.

    A run forked from a warm server must get the verdict a fresh one gets, and a run that must pass (the
    reference, the fix, an alternative) the same allocator figures: those are what a grade reads.
    """
    found = [
        f"{r['exercise']} {r['run']}: verdict {r['fresh']['verdict']} fresh, {r['forked']['verdict']} forked"
        for r in report["rows"]
        if r["fresh"]["verdict"] != r["forked"]["verdict"]
    ]
    found += [
        f"{r['exercise']} {r['run']}: {r['stats_differ'] or {k: [r['fresh'][k], r['forked'][k]] for k in ('status', 'oom')}}"
        for r in report["rows"]
        if r["kind"] in PASSING and (not r["stats_equal"] or any(r["fresh"][k] != r["forked"][k] for k in ("status", "oom")))
    ]
    return found


def _side(m: Measurement, verdict: str) -> dict:
    stats = m.stats or {}
    return {"runner": m.runner, "verdict": verdict, "status": m.status, "oom": m.oom, **{k: stats.get(k) for k in FIGURES}}


def _row(exercise: str, name: str, kind: str, fresh: Measurement, forked: Measurement, verdicts=("", "")) -> dict:
    a, b = fresh.stats or {}, forked.stats or {}
    row = {
        "exercise": exercise,
        "run": name,
        "kind": kind,
        "fresh": _side(fresh, verdicts[0]),
        "forked": _side(forked, verdicts[1]),
        "stats_equal": fresh.stats == forked.stats,  # every statistic read, not only those shown
        "stats_differ": {k: [a.get(k), b.get(k)] for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)},
        "workload_equal": fresh.workload == forked.workload,
        "tamper_equal": fresh.tamper == forked.tamper,
    }
    row["equal"] = (
        row["stats_equal"]
        and row["workload_equal"]
        and row["tamper_equal"]
        and all(row["fresh"][k] == row["forked"][k] for k in ("verdict", *SHOWN))
        and forked.runner == "forked"
        and fresh.runner == "fresh"
    )
    return row


def compare(exercises, note: Callable[[str], None] = lambda _: None, jobs: int = 1) -> tuple[dict, dict]:
    """Every run of the course, fresh and forked, side by side: the report ``equivalence.json`` holds.

    Also returns the truth check's report (``verify.json``) of the forked runs, the same runs
    ``oomlab dev verify`` makes, so that one sitting can write both.
    """
    exercises = list(exercises)
    # An estimate exercise runs no script to fork: its grade is measured once, for the truth check's half only.
    runs = [v for ex in exercises if not ex.is_estimate for v in variants(ex)]
    walls = {}
    measured = {}
    spans = {"fresh": {}, "forked": {}}
    for way in ("fresh", "forked"):
        start = time.perf_counter()
        measured[way] = run_all(runs, lambda s, way=way: note(f"{way}: {s}"), jobs, fresh=way == "fresh", spans=spans[way])
        walls[way] = round(time.perf_counter() - start, 1)
    (fresh_refs, fresh_runs), (forked_refs, forked_runs) = measured["fresh"], measured["forked"]
    rows = []
    for ex in (ex for ex in exercises if not ex.is_estimate):
        rows.append(_row(ex.id, "reference", "reference", fresh_refs[ex.id], forked_refs[ex.id]))
        for v, (fresh_row, fresh), (forked_row, forked) in zip(runs, fresh_runs, forked_runs, strict=True):
            if v.exercise is ex:
                verdicts = (fresh_row["verdict"], forked_row["verdict"])
                rows.append(_row(ex.id, v.name, v.kind, fresh.measurement, forked.measurement, verdicts))
    ref = fresh_refs[rows[0]["exercise"]] if rows else None
    estimated = check_estimates([ex for ex in exercises if ex.is_estimate], note)
    verified = verify_report(exercises, runs, forked_refs, forked_runs, jobs, False, walls["forked"], spans["forked"], estimated)
    return {
        "gpu": ref.gpu if ref else None,
        "torch": ref.torch if ref else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code": fingerprint(),
        "jobs": jobs,
        "runs": len(rows),
        "fresh_wall_s": walls["fresh"],
        "forked_wall_s": walls["forked"],
        "all_equal": all(r["equal"] for r in rows),
        "rows": rows,
    }, verified
