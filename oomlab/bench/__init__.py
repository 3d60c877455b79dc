"""How long a learner waits, measured on this GPU: ``oomlab dev bench`` writes ``speed.json``.

Every figure is the median of ``repeat`` runs in one sitting, each the wall
time of the command a learner types, run in a course folder made by ``oomlab
init`` (the learner's view: solutions in the package, references cached under
``.oomlab/``):

- ``plain_s``: ``python train.py`` with the reference fix as the learner's file,
  uncapped: what the workload costs without oomlab;
- ``check_cold_s``: ``oomlab check ID`` on that file, reference cached, no server
  (``--no-keep-warm``): the first check of a sitting;
- ``check_kept_s``: ``oomlab check ID`` once the server that a first check
  leaves (:mod:`oomlab.measure.keeper`) is ready: every check after the first
  (``--checks-only`` times these alone, and the first check once:
  :func:`checks_sitting`);
- ``recheck_warm_s``: under ``oomlab watch ID``, from a save to the verdict;
- ``plain_bug_s``: ``python train.py`` as shipped, uncapped;
- ``snapshot_s``, ``hunt_s``, ``profile_s``, ``diagnose_s``: each tool on the
  shipped script, no server; ``<tool>_analysis_s``: of which the probe's
  analysis, after the script (the tool's own ``timing``).

``scripts`` rows time the tools on scripts that are not in the course (this
package's ``long_history.py``: 840 optimizer steps), uncapped, beside their
plain run. ``verify_wall_s`` times the whole ``oomlab dev verify``. ``class``
times ``oomlab nbgrader autograde`` on a class of students made from the
exercises' variants (:mod:`oomlab.bench.classroom`), and says whether every
submission scored as its variant should. ``oom_hook`` is what :mod:`oomlab.oom_hook` costs a real
training loop before any OOM, history recording on and off (:mod:`oomlab.bench.oom_hook`).
``big_snapshot`` is the snapshot tool's own time and memory on a snapshot of a
few hundred MB recorded on this GPU (:mod:`oomlab.bench.big_snapshot`).
``witness`` is what watching each run from outside costs: the driver read every
few milliseconds, against not read at all (:mod:`oomlab.bench.witness`).

A benchmark, not a test: nothing here passes or fails; the targets are written
beside the figures, met or not.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from oomlab.course import Course
from oomlab.course.manifest import CHECK_WAIT_S
from oomlab.course.shipped import init_course
from oomlab.errors import OomLabError
from oomlab.grading.truth import all_runs
from oomlab.measure import warm
from oomlab.measure.harness import child_env
from oomlab.steps import STEPS

TOOLS = (*(s.name for s in STEPS), "diagnose")  # each step's tool (oomlab/steps.py), then diagnose, which runs them all
# The kinds of row a report holds, each merged by id: an exercise's every figure from one sitting, a script's, and an
# exercise's checks alone (``--checks-only``), which leave the rest of its figures where they were.
ROWS = ("exercises", "scripts", "checks")
VERDICTS = ("passes.", "does not pass yet.")


# The figures of an exercise's row, as the measurements page and `oomlab dev bench` show them, in that order.
SPEED_COLUMNS = (  # (speed.json key, column heading)
    ("plain_s", "`python train.py` (fix)"),
    ("check_cold_s", "`oomlab check`, the first"),
    ("check_kept_s", "`oomlab check`, later"),
    ("recheck_warm_s", "re-check under `watch`"),
    ("plain_bug_s", "`python train.py` (bug)"),
    *((f"{s.name}_s", f"`{s.name}`") for s in STEPS),  # each step's tool, from the registry (oomlab/steps.py)
    ("diagnose_s", "`diagnose`"),
)
TARGETS = {  # what each of targets() says is met, in words
    "recheck_warm_under_2_s": "a re-check under `watch` takes under 2 s",
    "check_cold_within_plain_plus_1_5_s": "`oomlab check` takes at most 1.5 s more than `python train.py`",
    "diagnose_within_2x_plain": "`diagnose` takes at most twice the plain run",
    "verify_within_1_2x_floor": "the whole `oomlab dev verify` takes at most 1.2 times its floor, "
    "max(longest run, sum of runs / runs at a time)",
    "check_under_15_s": "`oomlab check` of each timed exercise takes at most 15 s, the reference cached: a check "
    "after the first of a sitting, whose kept server forks it, where one was timed "
    "(an exercise that takes longer says why on its page)",
    "class_of_50_under_5_min": "a class of 50 is graded in under 5 minutes",
}


def _env(alloc_conf: str) -> dict:
    return {**child_env(alloc_conf), "COLUMNS": "160", "TERM": "dumb", "NO_COLOR": "1"}


def timed(args: list[str], cwd: Path, env: dict, ok: tuple[int, ...] = (0,)) -> float:
    """Wall seconds of one command; a command that fails in an unexpected way stops the benchmark."""
    start = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode not in ok:
        raise OomLabError(
            f"`{' '.join(args)}` exited with {done.returncode} during the benchmark: "
            f"{(done.stdout + done.stderr).strip()[-800:]}",
            "Run it by hand in a course folder to see why.",
        )
    return took


def median(samples: list[float]) -> float:
    return round(statistics.median(samples), 2)


def oomlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "oomlab", *args]


def watch_rechecks(root: Path, ex, repeat: int, env: dict) -> list[float]:
    """Seconds from a save to the verdict under ``oomlab watch``, once its server is warm."""
    proc = subprocess.Popen(
        oomlab("watch", ex.id), cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: list[str] = []

    def next_verdict(timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.perf_counter()))
            if not ready:
                break
            line = proc.stdout.readline().decode(errors="replace")
            if not line:
                break
            lines.append(line)
            if any(verdict in line for verdict in VERDICTS):
                return
        raise OomLabError(f"`oomlab watch {ex.id}` gave no verdict: {''.join(lines[-20:])}", "Run it by hand to see why.")

    try:
        next_verdict(300)  # the first check, fresh, while the server imports torch
        info = warm.info_path(root, ex.alloc_conf)
        deadline = time.perf_counter() + 180
        while not info.is_file() and time.perf_counter() < deadline:
            time.sleep(0.1)
        samples = []
        path = root / "exercises" / ex.id / ex.file
        for _ in range(repeat):
            stamp = time.time_ns()
            start = time.perf_counter()
            os.utime(path, ns=(stamp, stamp))  # a save, as an editor makes one
            next_verdict(300)
            samples.append(time.perf_counter() - start)
        return samples
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: watch stops its server before it ends
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kept_conf(root: Path, ex) -> str:
    """The allocator settings whose server a check of ``ex`` keeps: the learner's file's own where it sets them at
    its top (the run starts with those), else the manifest's."""
    from oomlab.measure.declared import declared_alloc_conf

    conf = declared_alloc_conf((root / "exercises" / ex.id / ex.file).read_text(encoding="utf-8"))
    return ex.alloc_conf if conf is None else conf


def await_server(root: Path, conf: str, ex) -> None:
    """Wait until the server a check of ``ex`` left is ready (a learner edits meanwhile)."""
    deadline = time.perf_counter() + warm.READY_TIMEOUT_S
    while warm.WarmServer.find(root, conf) is None:
        if time.perf_counter() > deadline:
            raise OomLabError(f"`oomlab check {ex.id}` left no warm server that got ready.", "Run it by hand to see why.")
        time.sleep(0.2)


def check_times(root: Path, ex, repeat: int, env: dict) -> tuple[list[float], list[float]]:
    """Seconds of ``oomlab check``: ``repeat`` first checks of a sitting, each a fresh process, then ``repeat`` checks
    after them, forked from the server the last first check left (ready by then: a learner edits meanwhile).

    The reference is not measured apart: where it is not cached yet, the first check measures it too, and the
    median of the first checks (``repeat`` is 3 or more) leaves that one out.
    """
    from oomlab.measure.keeper import stop_keepers

    conf = kept_conf(root, ex)
    try:
        cold = [timed(oomlab("check", "--no-keep-warm", ex.id), root, env) for _ in range(repeat - 1)]
        cold.append(timed(oomlab("check", "--keep-warm", ex.id), root, env))  # leaves a keeper, after its verdict
        await_server(root, conf, ex)
        return cold, [timed(oomlab("check", "--keep-warm", ex.id), root, env) for _ in range(repeat)]
    finally:
        stop_keepers(root)


def row_of(ex) -> dict:
    """An exercise's row before its figures; ``says_why``: its page says why its check takes longer than
    ``CHECK_WAIT_S`` (the manifest's ``long_check``; an estimate's page always does: oomlab.site.estimate_page)."""
    return {"id": ex.id, "budget_bytes": ex.budget_bytes, "says_why": bool(ex.long_check) or ex.is_estimate}


PRIME_JOBS = 8  # references measured at once before a checks-only sitting times anything


def learner_file(root: Path, ex) -> Path:
    """The file a learner edits, in the benchmark's course folder."""
    return root / "exercises" / ex.id / ex.file


def write_reference(root: Path, ex) -> None:
    """The exercise's reference fix (an estimate exercise's: its reference estimator) as the learner's file."""
    learner_file(root, ex).write_text(ex.solution_path.read_text(encoding="utf-8"), encoding="utf-8")


@contextlib.contextmanager
def shipped_back(root: Path, exercises: list):
    """The learners' files of ``exercises`` as they are now, written back on leaving, whatever was put there."""
    shipped = {path: path.read_text(encoding="utf-8") for path in (learner_file(root, ex) for ex in exercises)}
    try:
        yield
    finally:
        for path, text in shipped.items():
            path.write_text(text, encoding="utf-8")


def checks_sitting(root: Path, exercises: list, repeat: int, note: Callable[[str], None]) -> Iterator[dict]:
    """The checks of many exercises' reference fixes in one sitting, in minutes of GPU time rather than an hour.

    1. Every reference fix becomes its learner's file, and every reference is measured and cached by an
       untimed check, ``PRIME_JOBS`` at once: a learner's reference is measured once, at their first check ever.
    2. Each exercise's first check of a sitting (``check_cold_s``), once, with no server anywhere: a sitting has
       one, and a server started for one exercise would serve the next.
    3. For each allocator setting, one untimed check leaves a keeper; once its server is ready, each exercise's
       check ``repeat`` times, forked from it (``check_kept_s``): what a learner waits for at every other check.

    Yields a row per exercise after step 2, then again, whole, after step 3: a ``checks`` row, which leaves the
    exercise's other figures (``exercises``) as they were.
    """
    from concurrent.futures import ThreadPoolExecutor

    from oomlab.measure.keeper import stop_keepers

    envs = {ex.id: _env(ex.alloc_conf) for ex in exercises}
    rows = {ex.id: row_of(ex) for ex in exercises}
    with shipped_back(root, exercises):
        try:
            for ex in exercises:
                write_reference(root, ex)
            note(f"measuring {len(exercises)} references, {PRIME_JOBS} at a time")
            with ThreadPoolExecutor(PRIME_JOBS) as pool:
                list(pool.map(lambda ex: timed(oomlab("check", "--no-keep-warm", ex.id), root, envs[ex.id]), exercises))
            for ex in exercises:
                note(f"{ex.id}: the first check of a sitting")
                rows[ex.id]["check_cold_s"] = round(timed(oomlab("check", "--no-keep-warm", ex.id), root, envs[ex.id]), 2)
                yield rows[ex.id]
            kept: set[str] = set()
            for ex in exercises:
                if (conf := kept_conf(root, ex)) not in kept:
                    note(f"{ex.id}: a check that leaves a warm server")
                    timed(oomlab("check", "--keep-warm", ex.id), root, envs[ex.id])
                    await_server(root, conf, ex)
                    kept.add(conf)
                note(f"{ex.id}: checks forked from the kept server")
                rows[ex.id]["check_kept_s"] = median(
                    [timed(oomlab("check", "--keep-warm", ex.id), root, envs[ex.id]) for _ in range(repeat)]
                )
                yield rows[ex.id]

        finally:
            stop_keepers(root)


def estimate_checks(root: Path, ex, repeat: int, note: Callable[[str], None]) -> dict:
    """An estimate exercise's ``checks`` row: ``oomlab check ID`` with the reference estimator as the learner's file,
    ``repeat`` times (``check_cold_s``, their median). Each is a first check: nothing is kept warm or cached for an
    estimate, whose every check runs the estimator in its sandbox and measures its hidden configs on the GPU."""
    row = row_of(ex)
    with shipped_back(root, [ex]):
        write_reference(root, ex)
        note(f"{ex.id}: checks of the reference estimator")
        row["check_cold_s"] = median([timed(oomlab("check", ex.id), root, _env("")) for _ in range(repeat)])
    return row


def learner_check_s(row: dict) -> float | None:
    """What a learner waits for at ``oomlab check`` of an exercise, its reference cached: a check after the first of
    a sitting (``check_kept_s``) where one was timed, else a first one (``check_cold_s``)."""
    return row.get("check_kept_s", row.get("check_cold_s"))


def check_rows(report: dict) -> dict[str, dict]:
    """By exercise, the row with its latest timing of ``oomlab check``: a checks-only sitting's, or a whole one's."""
    latest: dict[str, dict] = {}
    for row in [*report.get("exercises", []), *report.get("checks", [])]:
        if learner_check_s(row) is None:
            continue
        if row["id"] not in latest or str(row.get("created", "")) >= str(latest[row["id"]].get("created", "")):
            latest[row["id"]] = row
    return latest


def tool_runs(target: list[str], cwd: Path, env: dict, repeat: int, out: Path) -> dict:
    """Each tool on ``target`` (an exercise id, or a script): the median wall time and the probe's analysis time."""
    row: dict = {}
    for tool in TOOLS:
        walls, analyses = [], []
        for _ in range(repeat):
            walls.append(timed(oomlab(tool, *target, "--out", str(out / tool)), cwd, env, ok=(0, 1)))
            if tool != "diagnose":  # diagnose's three run at once: its own wall time says it
                result = json.loads((out / tool / f"{tool}.json").read_text(encoding="utf-8"))
                analyses.append(result["timing"]["analysis_s"])
        row[f"{tool}_s"] = median(walls)
        if analyses:
            row[f"{tool}_analysis_s"] = median(analyses)
    return row


def bench_exercise(root: Path, ex, repeat: int, note: Callable[[str], None]) -> dict:
    """One exercise's row: the tools on its shipped script, then plain runs, checks and re-checks of its reference fix."""
    env = _env(ex.alloc_conf)
    learner = learner_file(root, ex)
    row = row_of(ex)
    with shipped_back(root, [ex]):
        note(f"{ex.id}: the tools on the shipped script")
        row["plain_bug_s"] = median([timed([sys.executable, ex.file], learner.parent, env, ok=(0, 1)) for _ in range(repeat)])
        row.update(tool_runs([ex.id], root, env, repeat, root / ".oomlab" / "bench"))

        write_reference(root, ex)
        note(f"{ex.id}: plain runs and checks of the reference fix")
        row["plain_s"] = median([timed([sys.executable, ex.file], learner.parent, env) for _ in range(repeat)])
        cold, kept = check_times(root, ex, repeat, env)
        row["check_cold_s"], row["check_kept_s"] = median(cold), median(kept)
        note(f"{ex.id}: re-checks under watch")
        row["recheck_warm_s"] = median(watch_rechecks(root, ex, repeat, env))
    row["diagnose_vs_plain_bug"] = round(row["diagnose_s"] / row["plain_bug_s"], 2)
    row["check_cold_minus_plain_s"] = round(row["check_cold_s"] - row["plain_s"], 2)
    return row


SCRIPTS = (Path(__file__).with_name("long_history.py"),)


def bench_script(script: Path, folder: Path, repeat: int, note: Callable[[str], None]) -> dict:
    """The tools on a script that is not in the course, uncapped, beside its plain run."""
    work = folder / script.stem
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(script, work / script.name)
    env = _env("")
    note(f"{script.name}: plain runs")
    row: dict = {"id": script.name, "plain_s": median([timed([sys.executable, script.name], work, env) for _ in range(repeat)])}
    note(f"{script.name}: the tools")
    row.update(tool_runs([script.name], work, env, repeat, work / "out"))
    row["diagnose_vs_plain"] = round(row["diagnose_s"] / row["plain_s"], 2)
    return row


def bench(
    only: list[str] | None,
    repeat: int,
    exercises: bool,
    scripts: bool,
    verify: bool,
    note: Callable[[str], None] = lambda _: None,
    class_size: int = 0,
    assignment: str = "snapshot",
    oom_hook_steps: int = 0,
    big_snapshot_events: int = 0,
    witness_runs: int = 0,
    witness_exercises: list[str] | None = None,
    verify_json: Path | None = None,
    checks_only: bool = False,
) -> Iterator[dict]:
    """Time the exercises (those in ``only``, or all), the scripts and the whole truth check.

    Yields a report after each row, so that a sitting cut short keeps what it measured.
    """
    import torch

    folder = Path(tempfile.mkdtemp(prefix="oomlab-bench-"))
    try:
        root = folder / "course"
        init_course(root)
        course = Course(root)
        sitting = {
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "repeat": repeat,
        }
        # A script exercise's run, check, re-check and tools; an estimate exercise's check alone, as nothing of it runs.
        named = [course.get(i) for i in only] if only else course.exercises
        estimates = [ex for ex in named if ex.is_estimate] if exercises else []
        chosen = [ex for ex in named if not ex.is_estimate] if exercises else []
        for ex in estimates:
            yield {**sitting, "checks": [{**estimate_checks(root, ex, repeat, note), **sitting}]}
        if checks_only:
            for row in checks_sitting(root, chosen, repeat, note):
                yield {**sitting, "checks": [{**row, **sitting}]}
        else:
            for ex in chosen:
                yield {**sitting, "exercises": [{**bench_exercise(root, ex, repeat, note), **sitting}]}
        for script in SCRIPTS if scripts else ():
            yield {**sitting, "scripts": [{**bench_script(script, folder / "scripts", repeat, note), **sitting}]}
        if verify:
            note("the whole truth check")
            # Timed once, not `repeat` times: a whole truth check is minutes of GPU time, and its own runs
            # give the figure it is judged by, its floor.
            path = verify_json or folder / "verify.json"
            wall = timed(oomlab("dev", "verify", "--json", str(path)), Path.cwd(), _env(""))
            yield {
                **sitting,
                **verify_row(json.loads(path.read_text(encoding="utf-8")), wall),
                "verify_created": sitting["created"],
            }
        if class_size:
            from oomlab.bench.classroom import bench_class

            note(f"grading a class of {class_size} ({assignment})")
            yield {**sitting, "class": {**bench_class(folder / "class", assignment, class_size), **sitting}}
        if oom_hook_steps:
            from oomlab.bench.oom_hook import measure as bench_oom_hook

            note(f"the OOM hook over {oom_hook_steps} training steps")
            yield {**sitting, "oom_hook": {**bench_oom_hook(repeat, oom_hook_steps), **sitting}}
        if big_snapshot_events:
            from oomlab.bench.big_snapshot import measure as bench_big_snapshot

            note(f"the snapshot tool on a snapshot of {big_snapshot_events:,} events")
            yield {**sitting, "big_snapshot": {**bench_big_snapshot(big_snapshot_events), **sitting}}
        if witness_runs:
            from oomlab.bench.witness import measure as bench_witness

            note(f"the witness, {witness_runs} runs with the driver read and {witness_runs} without")
            yield {**sitting, "witness": {**bench_witness(witness_exercises or [], witness_runs), **sitting}}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def merge(earlier: dict | None, now: dict) -> dict:
    """``now``'s figures over ``earlier``'s: rows timed now replace theirs, the others stay with their own dates.

    The benchmark of a whole course takes longer than one command may run on a
    GPU machine, so it is run an exercise or a few at a time; every row says when
    and where it was measured, and the targets are judged over all of them.
    """
    earlier = earlier or {}
    if any(k.startswith("verify_") for k in now):  # a sitting's verify figures replace the last one's whole
        earlier = {k: v for k, v in earlier.items() if not k.startswith("verify_")}
    merged = {**earlier, **{k: v for k, v in now.items() if k not in ROWS}}
    for kind in ROWS:
        rows = {r["id"]: r for r in earlier.get(kind, [])}
        rows.update({r["id"]: r for r in now.get(kind, [])})
        merged[kind] = list(rows.values())
    merged["targets"] = targets(merged)
    return merged


def verify_row(report: dict, wall_s: float) -> dict:
    """How near its floor a truth check ran: ``max(longest run, sum of runs / jobs)``, which no schedule can beat.

    Each exercise's reference fix is measured before its runs, and counted at its fix's time (the same script).
    Where the report says when each task ran (``task_s``), also how that time was spent: the share of the
    slots' time that tasks held, what tasks spent outside their scripts' own runs (starting the process and
    CUDA, grading), and when the first task started and the last ended.
    """
    runs = [run["wall_s"] or 0.0 for row in report["exercises"] for run in all_runs(row)]
    runs += [row["solution"]["wall_s"] or 0.0 for row in report["exercises"]]
    floor = max(max(runs, default=0.0), sum(runs) / max(1, report["jobs"]))
    spans = [run["task_s"] for row in report["exercises"] for run in all_runs(row) if "task_s" in run]
    spans += [row["reference_task_s"] for row in report["exercises"] if "reference_task_s" in row]
    tasks = {}
    if spans and len(spans) == len(runs):
        held = sum(end - start for start, end in spans)
        tasks = {
            "verify_tasks_sum_s": round(held, 1),
            "verify_outside_runs_s": round(held - sum(runs), 1),
            "verify_slots_held": round(held / (wall_s * max(1, report["jobs"])), 2) if wall_s else None,
            "verify_first_start_s": round(min(start for start, _ in spans), 1),
            "verify_last_end_s": round(max(end for _, end in spans), 1),
        }
    if parts := run_parts(report):
        tasks["verify_run_parts_s"] = parts
    return {
        "verify_wall_s": round(wall_s, 1),
        "verify_runs": report["runs"],
        "verify_parallel": report["jobs"],
        "verify_runner": report.get("runner"),
        "verify_runs_sum_s": round(sum(runs), 1),
        "verify_longest_run_s": round(max(runs, default=0.0), 1),
        "verify_floor_s": round(floor, 1),
        "verify_vs_floor": round(wall_s / floor, 2) if floor else None,
        **tasks,
    }


def measured_verify_row(report: dict) -> dict:
    """The truth check's row from a ``verify.json`` already written, measured in one sitting or several.

    Its time is the sum of its sittings' (each ends with its own tail of slots idle), so a report of several sittings
    is judged against its floor no more kindly than one sitting would be.
    """
    return {
        "gpu": report.get("gpu"),
        "torch": report.get("torch"),
        **verify_row(report, report["wall_s"]),
        "verify_sittings": report.get("sittings", 1),
        "verify_created": report.get("created"),
    }


def run_parts(report: dict) -> dict:
    """Where a typical run's task went, the median of each part over the runs whose witness timed it: ``start``, from
    the measured process's start to its script's (forking, CUDA, the budget, the sandbox); ``script``, its own run;
    ``end``, from the script's end to the process's (the figures, the weights file, CUDA's teardown); ``parent``,
    the rest of its task (asking the server, collecting the result and the weights, grading)."""
    parts: dict[str, list[float]] = {"start": [], "script": [], "end": [], "parent": []}
    for row in report["exercises"]:
        for run in all_runs(row):
            w = run.get("witness") or {}
            if None in (w.get("ready_s"), w.get("process_s"), run.get("wall_s"), run.get("task_s")):
                continue
            start, end = run["task_s"]
            parts["start"].append(w["ready_s"])
            parts["script"].append(run["wall_s"])
            parts["end"].append(w["process_s"] - w["ready_s"] - run["wall_s"])
            parts["parent"].append(end - start - w["process_s"])
    return {k: median(v) for k, v in parts.items()} if parts["start"] else {}


def targets(report: dict) -> dict:
    """The issue's targets, each met or not over every row there is."""
    rows, scripts = report["exercises"], report.get("scripts", [])
    whole = [r for r in rows if "recheck_warm_s" in r]  # rows of every figure, not of --checks-only
    met = {
        "recheck_warm_under_2_s": all(r["recheck_warm_s"] < 2 for r in whole),
        "check_cold_within_plain_plus_1_5_s": all(r["check_cold_minus_plain_s"] <= 1.5 for r in whole),
        "diagnose_within_2x_plain": all(r["diagnose_vs_plain_bug"] <= 2 for r in whole)
        and all(r["diagnose_vs_plain"] <= 2 for r in scripts),
    }
    if report.get("verify_vs_floor") is not None:
        met["verify_within_1_2x_floor"] = report["verify_vs_floor"] <= 1.2
    if checked := check_rows(report).values():
        met["check_under_15_s"] = all(learner_check_s(r) <= CHECK_WAIT_S or r.get("says_why") for r in checked)
    if "class" in report:
        c = report["class"]
        met[f"class_of_{c['students']}_under_5_min"] = c["wall_s"] < 300 and c["verdicts_as_expected"]
    return met
