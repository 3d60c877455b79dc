"""The course's one truth check: every seeded bug, wrong fix and cheat fails as its exercise says, every fix passes.

For each exercise, on this GPU, :func:`variants` lists the runs and what each
must show:

- ``solution``: the reference fix, graded against its own reference measurement,
  must pass every check *and* repeat that measurement's figures exactly;
- ``bug``: the script as shipped must fail the check its manifest names as the symptom;
- each tempting **wrong fix** (an edit of the bug) must fail the check it names;
- each accepted **alternative** (another honest fix, an edit of the bug) must pass every check;
- each generic **cheat** (:mod:`oomlab.grading.cheats`) must fail one of the checks that catch it.

An estimate exercise (``kind = "estimate"``) has the same runs but the cheats, each an estimator graded on the
hidden configs its own source draws (:func:`check_estimate`): the reference must pass, the estimator as shipped
must get some part wrong, each wrong fix the part it names, and each alternative must pass. Its row in the
report counts configs and parts where a script's has memory figures (:func:`estimate_row`).

``oomlab dev verify`` (which writes ``course/measurements/verify.json``) and
``pytest graders --solutions`` both run :func:`check` over :func:`variants`,
so the two cannot disagree.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oomlab.course import reports
from oomlab.course.manifest import Exercise
from oomlab.course.originals import shipped_source
from oomlab.course.state import StateDir, write_atomic
from oomlab.figure_names import COMPARED
from oomlab.grading.cheats import CHEATS, WRAPPED
from oomlab.grading.checks import context_at_end, host_growth, script_cpu, validate
from oomlab.grading.reference import measure_reference
from oomlab.grading.schedule import Task, run_longest_first
from oomlab.grading.verdict import Report, grade
from oomlab.measure import MEASURING_CODE, digest, warm, weights
from oomlab.measure.declared import declared_alloc_conf
from oomlab.measure.harness import MACHINE_PROBLEMS, SCRIPT_FAILURES, Measurement, child_env
from oomlab.measure.machine import machine_error
from oomlab.oom import first_line

__all__ = ["Variant", "check", "fingerprint", "run_all", "source_digest", "variants", "verify"]

FIGURES = COMPARED  # the figures a variant must repeat
# The code whose change makes a committed report stale: the measuring, the checks, the verdict, the cheats.
GRADING_CODE = (*MEASURING_CODE, *(Path(__file__).with_name(f) for f in ("checks.py", "verdict.py", "cheats.py")))


@dataclass(frozen=True)
class Variant:
    """One run of the truth check: a script made from the exercise, and what it must show."""

    exercise: Exercise
    kind: str  # "solution", "bug", "wrong-fix", "alternative" or "cheat"
    name: str
    expect: frozenset[str]  # checks (or a failed run's status) of which at least one must fail; empty: every check must pass
    make: Callable[[str, str, Exercise], str] | None = None  # (bug, solution, exercise) -> source; None for the fix itself
    wraps_the_bug: bool = False

    @property
    def id(self) -> str:
        return f"{self.exercise.id}-{self.name}"

    def source(self) -> str:
        """The text of the run's script, made in memory: what :meth:`script` writes (or, for the fix, points at)."""
        ex = self.exercise
        sol = ex.solution_path.read_text(encoding="utf-8")
        return sol if self.make is None else self.make(shipped_source(ex), sol, ex)

    def script(self) -> Path:
        """Where the run's script is: the reference fix itself, or a variant written under ``.oomlab/variants/``."""
        ex = self.exercise
        if self.make is None:
            return ex.solution_path
        path = StateDir(ex.root).variant(ex.id, self.name, ex.file)
        write_atomic(path, self.source())
        if self.wraps_the_bug:
            write_atomic(path.with_name(f"{WRAPPED}.py"), shipped_source(ex))
        return path


def variants(ex: Exercise) -> list[Variant]:
    """Every run the truth check makes for ``ex``, the reference fix first.

    An estimate exercise's bug (the estimator as shipped) must get some part of some config wrong, each wrong fix the
    part it names; a cheat is a script's, so it has none.
    """
    validate_exercise(ex)  # a check, a part or an example the grading does not know is said before anything runs
    if ex.is_estimate:
        from oomlab.grading.estimates import parts_of

        missed = frozenset(parts_of(ex))
    else:
        missed = frozenset({ex.symptom})
    runs = [
        Variant(ex, "solution", "solution", frozenset()),
        Variant(ex, "bug", "bug", missed, lambda bug, sol, ex: bug),
    ]
    for fix in ex.wrong_fixes:
        runs.append(Variant(ex, "wrong-fix", fix.name, frozenset({fix.expect}), lambda bug, sol, ex, fix=fix: fix.apply(bug)))
    for alt in ex.alternatives:
        runs.append(Variant(ex, "alternative", alt.name, frozenset(), lambda bug, sol, ex, alt=alt: alt.apply(bug)))
    if ex.is_estimate:
        return runs
    for cheat in CHEATS:
        if ex.learner_settings and cheat.name == "allocator-settings-at-runtime":
            continue  # where the fix is a setting, setting it at run time is a fix, not a cheat
        caught_by = cheat.caught_by
        if cheat.runs_the_bug and not cheat.uncapped:  # the bug still runs inside it, capped: its symptom catches it too
            caught_by = caught_by | {ex.symptom}
        runs.append(Variant(ex, "cheat", cheat.name, caught_by, cheat.make, cheat.wraps_the_bug))
    return runs


def validate_exercise(ex: Exercise) -> None:
    """Raise the OomLabError that says what in ``ex``'s manifest the grading does not know, before anything runs: a
    script's checks (:func:`oomlab.grading.checks.validate`), an estimate's sizing (:func:`oomlab.grading.estimates.validate`)."""
    if ex.is_estimate:
        from oomlab.grading.estimates import validate as validate_estimate

        validate_estimate(ex)
    else:
        validate(ex)


def check_estimate(variant: Variant):
    """Grade one estimator of an estimate exercise, strictly (sandboxed, or nothing is graded); ``(row, report)``.

    It needs the GPU its configs are measured on: :class:`oomlab.sizing.grade.MeasuringFailed` says so without one.
    """
    from oomlab.grading.estimates import failed_parts
    from oomlab.sizing.grade import grade_estimator

    ex = variant.exercise
    start = time.perf_counter()
    report = grade_estimator(variant.script(), ex.root, ex.sizes, sandbox_required=True)
    failed = failed_parts(report)
    as_expected = (not report.passed and bool(variant.expect & set(failed))) if variant.expect else report.passed
    row = {
        "name": variant.name,
        "kind": variant.kind,
        "verdict": "pass" if report.passed else "fail",
        "configs": len(report.configs),
        "within": report.within,
        "total": report.total,
        "failed_parts": failed,
        "expected_failure": sorted(variant.expect) or None,
        "as_expected": as_expected,
        "wall_s": round(time.perf_counter() - start, 3),
    }
    return row, report


def estimate_row(ex: Exercise, rows: list[dict], gpu: str = "", torch: str = "") -> dict:
    """One estimate exercise's part of the report, from its variants' rows (in :func:`variants` order)."""
    return {
        "id": ex.id,
        "kind": "estimate",
        "sizes": ex.sizes,
        "sources": source_digest(ex),
        "code": estimate_fingerprint(),
        "gpu": gpu,
        "torch": torch,
        **runs_by_kind(rows),
    }


def check_estimates(exercises, note: Callable[[str], None] = lambda _: None) -> dict[str, dict]:
    """Every estimate exercise's runs, one after another (each measures its configs on the whole GPU); rows by id."""
    done = {}
    for ex in exercises:
        measured = []
        for v in variants(ex):
            measured.append(check_estimate(v))
            note(f"{v.id}: {measured[-1][0]['within']} of {measured[-1][0]['total']} parts within")
        report = measured[0][1]
        done[ex.id] = estimate_row(ex, [row for row, _ in measured], report.gpu, report.torch)
    return done


def explain_estimate(row: dict, report) -> str:
    """Why an estimator did not behave as expected, for a test failure."""
    want = f"get one of {', '.join(row['expected_failure'])} wrong" if row["expected_failure"] else "pass"
    lines = [f"{row['name']} should {want}; {row['within']} of {row['total']} parts were within tolerance."]
    lines += [
        f"{'PASS' if s.within else 'FAIL'} config {i} {s.part}: estimated {s.estimated:,.0f}, measured {s.measured:,} "
        f"({s.error:+.1%}, tolerance {s.tolerance:.0%})"
        for i, scores in enumerate(report.scores, 1)
        for s in scores
    ]
    return "\n".join(lines)


def check(variant: Variant, reference: Measurement) -> tuple[dict, Report]:
    """Run one variant against the reference; the row says whether it behaved as the course says."""
    report = grade(variant.exercise, variant.script(), reference=reference, strict=True)
    m = report.measurement
    # A run that did not get to its checks fails as what ended it (a timeout, say), or as the sandbox's check.
    failed = report.failed() or ([m.status] if m.status in SCRIPT_FAILURES else [])
    if variant.expect:
        as_expected = not report.passed and bool(variant.expect & set(failed))
    else:
        as_expected = report.passed
    stats = m.stats or {}
    row = {
        "name": variant.name,
        "kind": variant.kind,
        "verdict": report.verdict,
        "status": m.status,
        "oom": m.oom,
        **{k: stats.get(k) for k in FIGURES},
        "inactive_split_final": stats.get("inactive_split_final"),
        "wall_s": round(m.wall_s, 3) if m.wall_s is not None else None,
        "runner": m.runner,
        "witness": witness_figures(m, reference),
        "failed_checks": failed,
        "expected_failure": sorted(variant.expect) or None,
        "as_expected": as_expected,
    }
    if variant.kind == "solution":  # the same code gives the same figures: the verdicts rest on it
        row["repeatable"] = m.stats == reference.stats
        row["as_expected"] = as_expected and row["repeatable"]
    if m.oom or m.status not in ("ok", "oom"):
        row["message"] = first_line(m.message, limit=None)  # whole: the site shows the error as a learner meets it
        row["where"] = m.where
    return row, report


def witness_figures(m: Measurement, reference: Measurement) -> dict:
    """What the witness saw of a run, beside what the run said: the figures its tolerances are set from."""
    w = m.witness or {}
    driver = w.get("driver") or {}
    distance, _ = weights.compare(m.weights_digest, reference.weights_digest)
    return {
        "driver_peak": driver.get("peak_bytes"),
        "context_at_start": driver.get("at_ready_bytes"),
        "context_at_end": context_at_end(m),
        "samples": driver.get("samples"),
        "sample_ms_mean": round(1000 * driver["sample_s_mean"], 3) if driver.get("sample_s_mean") is not None else None,
        "other_gpu_processes": len(w.get("other_gpu_processes") or []),
        "script_cpu_s": script_cpu(m),
        "host_growth": host_growth(m),
        "weights_distance": distance,
        # Where a run's time goes besides its script: the measured process's whole life as its supervisor saw it, and
        # how far into it the script was about to start (imports, CUDA, the budget); its task's span is the row's task_s.
        "process_s": w.get("process_s"),
        "ready_s": ((w.get("marks") or {}).get("ready") or {}).get("t"),
    }


def explain(row: dict, report: Report) -> str:
    """Why a variant did not behave as expected, for a test failure."""
    m = report.measurement
    want = (
        f"fail one of {', '.join(row['expected_failure'])}"
        if row["expected_failure"]
        else "pass, repeating the reference's figures"
    )
    lines = [f"{row['name']} should {want}; it got {row['verdict']} ({m.status})."]
    if row.get("repeatable") is False:
        lines.append("Its figures differ from the reference measurement's: the run is not repeatable.")
    if not report.checks:
        lines.append(f"{m.message} {m.where}".strip())
    lines += [
        f"{'PASS' if c.passed else 'FAIL'} {c.name}: {c.measured} (required {c.threshold}) {c.detail}" for c in report.checks
    ]
    return "\n".join(lines)


def reference_of(ex: Exercise) -> Measurement:
    """The reference fix measured now, in a fresh process: the truth check never trusts a cached one."""
    ref = measure_reference(ex)
    if ref.status in MACHINE_PROBLEMS:
        raise machine_error(ref, ex)
    return ref


def source_digest(ex: Exercise) -> str:
    """A hash of what the exercise is made of: its manifest, its shipped script and its reference fix."""
    return digest([ex.manifest_path, ex.solution_path], shipped_source(ex))


def fingerprint() -> str:
    """A hash of the measuring and grading code: what a report's figures and verdicts depend on besides the course."""
    return digest(GRADING_CODE)


def estimate_fingerprint() -> str:
    """A hash of the code an estimate exercise's grade depends on (:data:`oomlab.grading.estimates.ESTIMATE_CODE`)."""
    from oomlab.grading.estimates import ESTIMATE_CODE

    return digest(ESTIMATE_CODE)


def stale(row: dict, ex: Exercise) -> str | None:
    """Why a verify row no longer describes ``ex``, or None while it does (the report's own code aside)."""
    if row.get("sources") != source_digest(ex):
        return "its manifest, script or reference fix changed since"
    if ex.is_estimate and row.get("code") != estimate_fingerprint():
        return "the sizing code it was graded with changed since"
    return None


def exercise_row(ex: Exercise, ref: Measurement, rows: list[dict]) -> dict:
    """One exercise's part of the report, from its reference and its variants' rows (in :func:`variants` order)."""
    row = {
        "id": ex.id,
        "sources": source_digest(ex),
        "budget_bytes": ex.budget_bytes,
        "reference_workload": {k: ref.workload.get(k) for k in ("optimizer_steps", "train_samples", "inference_samples")},
        **runs_by_kind(rows),
    }
    row["repeatable"] = row["solution"]["repeatable"]
    return row


def runs_by_kind(rows: list[dict]) -> dict:
    """A report row's runs by kind (:func:`all_runs` reads them back): the fix, the bug, wrong fixes, alternatives, cheats."""
    by_kind = lambda kind: [r for r in rows if r["kind"] == kind]  # noqa: E731
    return {
        "solution": by_kind("solution")[0],
        "buggy": by_kind("bug")[0],
        "wrong_fixes": by_kind("wrong-fix"),
        "alternatives": by_kind("alternative"),
        "cheats": by_kind("cheat"),
    }


def declared_conf(variant: Variant) -> str | None:
    """The allocator settings a variant's script sets for itself (a server with them forks its runs).

    Read from the source in memory: :func:`check` writes the script when it runs it.
    """
    return declared_alloc_conf(variant.source())


MOST_CORES = 8.0  # a run is expected to keep at most this many cores busy, whatever its figures say


def expected_costs(exercises) -> dict[tuple[str, str], tuple[float, float]]:
    """How long each run took in the committed ``verify.json``, and how many CPU cores it kept busy (its script's CPU
    time over its wall time, as the witness counted it), by (exercise, run; ``reference`` for the fix).

    Only an order for :func:`run_all`: a run the report lacks is expected to cost what its exercise's
    reference fix did, or the longest run known on one core if that is missing too.
    """
    costs: dict[tuple[str, str], tuple[float, float]] = {}

    def cost(run: dict) -> tuple[float, float]:
        wall = run.get("wall_s") or 0.0
        cpu = (run.get("witness") or {}).get("script_cpu_s") or 0.0
        if wall < 1.0:  # the script's own time says little where it ended at once, or went on after its figures
            return max(wall, cpu), 1.0
        return wall, min(max(1.0, cpu / wall), MOST_CORES)

    for root in {ex.root for ex in exercises}:
        try:
            report = json.loads((root / reports.VERIFY).read_text(encoding="utf-8"))
            for row in report["exercises"]:
                costs[(row["id"], "reference")] = cost(row["solution"])
                costs.update({(row["id"], run["name"]): cost(run) for run in all_runs(row)})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # no report, or another shape: course order it is
    return costs


def run_all(
    runs: list[Variant],
    note: Callable[[str], None] = lambda _: None,
    jobs: int = 1,
    fresh: bool = False,
    spans: dict | None = None,
):
    """Measure the variants and their exercises' references, ``jobs`` at a time; ``(references, [(row, report)])``.

    Every run is its own process under its own budget, so runs can go at once.
    Each exercise's reference is measured first (its variants are graded against
    it) and its variants start as soon as it is done; among the runs that can
    start, the longest expected goes first (:mod:`oomlab.grading.schedule`), so a
    sitting ends near ``max(longest run, sum of runs / jobs)``; a run expected to keep
    several cores busy waits for room among this machine's cores. Runs are forked
    from warm servers, one per allocator setting (``fresh``: each in a new Python
    process instead, as ``equivalence.json`` compares).

    Each run's row says when its task started and ended (``task_s``, seconds since this call began: the servers'
    start, the process, the grading and the wait for a slot are in them, none of which its ``wall_s`` counts);
    ``spans`` receives the same for each exercise's reference fix, by exercise id.
    """
    began = time.perf_counter()
    spans = {} if spans is None else spans
    exercises = list({v.exercise.id: v.exercise for v in runs}.values())
    finished = itertools.count(1)  # next() on it is atomic: safe from the worker threads
    expected = expected_costs(exercises)
    longest = (max((w for w, _ in expected.values()), default=0.0), 1.0)

    def since_began() -> float:
        return round(time.perf_counter() - began, 2)

    def counted(variant: Variant, done: dict):
        start = since_began()
        measured = check(variant, done[variant.exercise.id])
        measured[0]["task_s"] = [start, since_began()]
        note(f"{next(finished)} of {len(runs)} runs measured ({variant.id})")
        return measured

    def reference_task(ex: Exercise) -> Measurement:
        start = since_began()
        ref = reference_of(ex)
        spans[ex.id] = [start, since_began()]
        return ref

    def guess(ex_id: str, name: str) -> tuple[float, float]:
        return expected.get((ex_id, name), expected.get((ex_id, "reference"), longest))

    tasks = [
        Task(
            ex.id,
            lambda _, ex=ex: reference_task(ex),
            first=True,  # the references unblock everything else: those with the most work behind them first
            seconds=sum(guess(v.exercise.id, v.name)[0] for v in runs if v.exercise is ex),
            cores=guess(ex.id, "reference")[1],
        )
        for ex in exercises
    ]
    for i, v in enumerate(runs):
        seconds, cores = guess(v.exercise.id, v.name)
        tasks.append(Task(i, lambda done, v=v: counted(v, done), seconds=seconds, cores=cores, after=v.exercise.id))
    roots = {ex.root for ex in exercises}
    with contextlib.ExitStack() as stack:
        if fresh:
            stack.enter_context(warm.fresh_only())
        else:
            note("starting the warm measuring servers (importing torch once)")
            for root in roots:
                confs = [ex.alloc_conf for ex in exercises if ex.root == root]
                confs += [conf for v in runs if v.exercise.root == root and (conf := declared_conf(v)) is not None]
                servers = stack.enter_context(warm.serving(root, confs, child_env))
                for server in servers:
                    server.wait_ready()
        note(f"{len(exercises)} reference fixes, then {len(runs)} runs, {jobs} at a time, the longest first")
        done = run_longest_first(tasks, jobs, cores=os.cpu_count())  # the runs' CPU work shares this machine's cores
    return {ex.id: done[ex.id] for ex in exercises}, [done[i] for i in range(len(runs))]


def verify(exercises, note: Callable[[str], None] = lambda _: None, jobs: int = 1, fresh: bool = False) -> dict:
    """The whole course's truth check, as the report ``verify.json`` holds it."""
    start = time.perf_counter()
    exercises = list(exercises)
    runs = [v for ex in exercises if not ex.is_estimate for v in variants(ex)]
    spans: dict = {}
    refs, measured = run_all(runs, note, jobs, fresh, spans) if runs else ({}, [])
    estimated = check_estimates([ex for ex in exercises if ex.is_estimate], note)
    return verify_report(exercises, runs, refs, measured, jobs, fresh, time.perf_counter() - start, spans, estimated)


def verify_report(
    exercises,
    runs,
    refs,
    measured,
    jobs: int,
    fresh: bool,
    wall_s: float,
    spans: dict | None = None,
    estimated: dict[str, dict] | None = None,
) -> dict:
    """The report of :func:`verify` from runs already measured (``oomlab dev equivalence`` writes it from its forked half).

    The report is assembled in course order whatever order the runs end in, so
    it reads the same for any ``jobs``. ``spans``: when each reference fix's task ran (:func:`run_all`);
    ``estimated``: the estimate exercises' rows (:func:`check_estimates`), by id.
    """
    rows = [row for row, _ in measured]
    estimated = estimated or {}
    report_rows = [
        estimated[ex.id]
        if ex.is_estimate
        else exercise_row(ex, refs[ex.id], [row for v, row in zip(runs, rows, strict=True) if v.exercise is ex])
        for ex in exercises
    ]
    for row in report_rows:
        if row["id"] in (spans or {}):
            row["reference_task_s"] = spans[row["id"]]
    scripts = [ex for ex in exercises if not ex.is_estimate]
    ref = refs[scripts[0].id] if scripts else None
    # A sitting of estimate exercises alone ran no reference: its GPU and torch are those its configs were measured on.
    first = next(iter(estimated.values()), {})
    report = {
        "gpu": ref.gpu if ref else first.get("gpu"),
        "torch": ref.torch if ref else first.get("torch"),
        "cuda": ref.cuda if ref else None,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code": fingerprint(),
        "jobs": jobs,
        "runner": "fresh" if fresh else "forked",
        "runs": sum(row_runs(row) for row in report_rows),
        "wall_s": round(wall_s, 1),
        "exercises": report_rows,
    }
    report["ok"] = all_as_expected(report_rows)
    return report


def all_runs(row: dict) -> list[dict]:
    """Every run of one exercise's report row."""
    return [row["solution"], row["buggy"], *row.get("wrong_fixes", []), *row.get("alternatives", []), *row.get("cheats", [])]


def row_runs(row: dict) -> int:
    """How many runs one exercise's row stands for: its variants' and, for a script exercise, its reference's."""
    return len(all_runs(row)) + (row.get("kind") != "estimate")


def all_as_expected(rows: list[dict]) -> bool:
    """A report's ``ok``: every run of every exercise's row behaved as the course expects."""
    return all(r["as_expected"] for row in rows for r in all_runs(row))
