"""Measuring a training script in a process of its own, whose caching allocator starts empty.

Each measurement runs in a new process so that the same script gives the same
figures every run: a fresh Python process, or a child forked from a warm server
(:mod:`oomlab.measure.warm`) that has imported torch but never touched CUDA.
The child (``child.py``) sets the memory budget, seeds, guards and hooks before
the learner's code runs and writes one JSON result and the final weights; a
supervisor that runs none of the learner's code (``supervisor.py``, or the
warm server's fork) enforces the time limit and reports what the driver and
the kernel saw (:mod:`oomlab.measure.witness`). This side turns every way a
run can end into a :class:`Measurement`, with the witness's report and the
weights' digest (:mod:`oomlab.measure.weights`) beside what the child said.

A run for a grade is **sandboxed** (:mod:`oomlab.measure.confine`): the script
cannot read the answers or the harness's files, or write where grading reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from oomlab.measure import confine, warm, weights
from oomlab.measure.declared import declared_alloc_conf
from oomlab.measure.stats import ALLOCATOR_VARIABLES, FIGURES
from oomlab.oom import first_line

CHILD = Path(__file__).with_name("child.py")
SUPERVISOR = Path(__file__).with_name("supervisor.py")
REPORT_GRACE_S = 60  # beyond the run's own limit, which the supervisor enforces: its start, and stopping what ran

# Statuses where the learner's script did not run to its end, through its own doing.
SCRIPT_FAILURES = {"missing", "syntax", "error", "exit", "timeout", "crashed", "forged"}
# Statuses where this machine, not the script, is the problem.
MACHINE_PROBLEMS = {"no_torch", "torch_too_old", "no_cuda", "gpu_too_small", "gpu_busy", "no_sandbox", "no_supervisor"}


@dataclass
class Measurement:
    """What one run did: how it ended, the allocator's figures, and the workload."""

    script: str
    status: str  # ok, oom, syntax, error, exit, timeout, crashed, forged, or a machine problem
    message: str = ""
    error_type: str = ""
    line_no: int | None = None
    line: str = ""
    traceback: str = ""
    stats: dict | None = None
    workload: dict | None = None
    tamper: list = field(default_factory=list)
    alloc_conf: str = ""  # the allocator settings the run started with
    alloc_conf_declared: bool = False  # the script set them itself, at its top (see oomlab.measure.declared)
    alloc_conf_changed: list = field(default_factory=list)  # set too late, so without effect
    wall_s: float | None = None  # the script itself
    process_s: float | None = None
    runner: str = ""  # "fresh": a new process; "forked": a child of a warm server
    runner_note: str = ""  # why a fresh process measured a run that a warm server could not take
    gpu: str = ""
    gpu_total_bytes: int = 0
    gpu_free_bytes: int = 0
    torch: str = ""
    cuda: str | None = None
    budget_bytes: int | None = 0
    tool_error: str = ""
    stdout: str = ""
    stderr: str = ""
    # What the child said of its own set-up (checked against the parent's settings by the grader).
    sandbox: dict = field(default_factory=dict)  # {"applied", "abi"} or {"applied": False, "reason"}
    settings_at_start: dict = field(default_factory=dict)  # allocator variables set when CUDA started
    settings_at_exit: dict = field(default_factory=dict)
    caching_at_start: bool | None = None
    allocator_backend: str = ""
    blocking_sync: str | None = None  # "" when waiting threads sleep; else why not
    figures_witnessed: bool | None = None
    weights: list = field(default_factory=list)  # the shapes the child wrote
    # Added by this side, from outside the measured process.
    witness: dict | None = None  # oomlab.measure.witness.Witness's report
    weights_digest: dict | None = None  # oomlab.measure.weights.digest of the final weights

    @property
    def oom(self) -> bool:
        return self.status == "oom" or bool(self.stats and self.stats.get("ooms"))

    @property
    def where(self) -> str:
        """``train.py:42`` where the run stopped, if it stopped inside the script."""
        return f"{Path(self.script).name}:{self.line_no}" if self.line_no else ""

    def ending(self) -> str:
        """How the run ended, in one line, for messages that have no room for more."""
        where = f" at {self.where}" if self.where else ""
        first = first_line(self.message)
        return {
            "missing": "the file does not exist",
            "syntax": f"syntax error{where}: {first}",
            "timeout": first,
            "crashed": first,
            "error": f"{self.error_type or 'an error'}{where}: {first}",
        }.get(self.status, f"{self.status}{where}: {first}")

    def to_json(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict) -> Measurement:
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in known})


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def check_syntax(script: Path, source: str) -> Measurement | None:
    """A syntax error needs no GPU to find: report it before starting anything."""
    try:
        compile(source, str(script), "exec")
    except SyntaxError as err:
        return Measurement(
            script=str(script),
            status="syntax",
            error_type=type(err).__name__,
            message=err.msg,
            line_no=err.lineno,
            line=(err.text or "").rstrip("\n"),
        )
    return None


def child_env(alloc_conf: str) -> dict:
    """The measured run's environment: the caller's, less every allocator variable, plus the exercise's setting.

    A whitelist: of :data:`~oomlab.measure.stats.ALLOCATOR_VARIABLES` only
    ``PYTORCH_CUDA_ALLOC_CONF`` can be set, and only to ``alloc_conf``.
    """
    env = dict(os.environ)
    for var in ALLOCATOR_VARIABLES:
        env.pop(var, None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    # One visible GPU, so the budget caps everything the script can reach.
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    # OpenMP's threads sleep between parallel regions instead of spinning, so the run's CPU time is the work it
    # did (the grader compares it with the reference's), whatever else the machine runs.
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def measure(
    script: Path,
    *,
    budget_bytes: int | None,
    alloc_conf: str = "",
    time_limit_s: float = 120,
    seed: int = 0,
    args: tuple[str, ...] = (),
    require_cuda: bool = True,
    tool: dict | None = None,
    course_root: Path | None = None,
    server: warm.WarmServer | None = None,
    serving: bool = False,
    settings_free: bool = False,
    sandboxed: bool = False,
    sandbox_required: bool = False,
    hide: tuple[Path, ...] = (),
    witness_driver: bool = True,
) -> Measurement:
    """Run ``script`` once under the budget in a fresh process and measure it.

    ``require_cuda=False`` runs it without a GPU and without memory figures; the
    project's own tests use it to exercise every way a run can end on CI.
    ``budget_bytes=None`` runs it uncapped (a script that is not an exercise).
    ``tool`` names a tool's probe to run around the script, by its module:
    ``{"name": "snapshot", "probe": "oomlab.tools.snapshot.probe", "out_dir": "...", "options": {...}}``.
    ``course_root`` names the course the script belongs to: a warm server
    (:mod:`oomlab.measure.warm`) kept for it with the same allocator settings
    forks the run. ``server`` names the server outright. Where none can take
    the run, a fresh process measures it and the result's ``runner_note`` says why.
    A script that sets its own allocator settings at its top runs with them
    instead of ``alloc_conf``, as it would under ``python``.
    ``serving`` samples the allocator after every inference forward and sums
    each one's output, for the checks of a long-lived inference worker.
    ``settings_free`` lets the script change the allocator's settings while it
    runs (``_set_allocator_settings``), as it could under ``python``.
    ``sandboxed`` confines the script for a grade (:mod:`oomlab.measure.confine`;
    ``hide`` adds folders to keep from it); ``sandbox_required`` makes a
    kernel that cannot confine it a machine problem rather than a note.
    ``witness_driver=False`` leaves the driver unread (``oomlab dev bench`` times what reading it costs).
    """
    script = Path(script).resolve()
    if not script.is_file():
        return Measurement(script=str(script), status="missing", message=f"{script} does not exist")
    source = script.read_text(encoding="utf-8", errors="replace")
    if failed := check_syntax(script, source):
        failed.budget_bytes = budget_bytes
        return failed
    declared = declared_alloc_conf(source)
    if declared is not None:
        alloc_conf = declared

    with tempfile.TemporaryDirectory(prefix="oomlab-") as tmp:
        tmp = Path(tmp)
        work = tmp / "work"  # the script's own folder while it runs sandboxed
        work.mkdir()
        spec = {
            "script": str(script),
            "args": list(args),
            "budget_bytes": budget_bytes,
            "seed": seed,
            "require_cuda": require_cuda,
            "result_path": str(tmp / "result.json"),
            "weights_path": str(tmp / "weights.f32"),
            "work_dir": str(work),
            "tool": tool,
            "serving": serving,
            "settings_free": settings_free,
            "sandbox": confine.grading_policy(script, tmp, work, course_root, hide).to_json() if sandboxed else None,
            "sandbox_required": sandbox_required,
        }
        (tmp / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        run = {
            "spec": str(tmp / "spec.json"),
            "stdout": str(tmp / "stdout.txt"),
            "stderr": str(tmp / "stderr.txt"),
            "cwd": str(script.parent),
            "env": child_env(alloc_conf),
            "time_limit_s": time_limit_s,
            "driver": witness_driver,
        }
        runner, note = "fresh", ""
        if server is None and course_root is not None:
            server, note = warm.for_run(course_root, alloc_conf)
        if server is not None:
            try:
                ended = server.request(run)
                runner = "forked"
            except warm.Unavailable as err:
                note = f"measured in a fresh process: {err}"
                (tmp / "result.json").unlink(missing_ok=True)  # never read half a run as the result
        if runner == "fresh":
            ended = run_fresh(run, tmp)
        result = collect(tmp, ended, time_limit_s)
        digest = weights.digest(tmp / "weights.f32", result.get("weights") or []) if result.get("status") == "ok" else None

    m = Measurement.from_json({**result, "script": str(script), "budget_bytes": budget_bytes})
    m.alloc_conf, m.alloc_conf_declared = alloc_conf, declared is not None
    m.process_s = ended.get("process_s")
    m.runner, m.runner_note = runner, note
    m.witness, m.weights_digest = ended, digest
    if sandboxed:
        m.sandbox = {**m.sandbox, "asked": True}
        if m.sandbox.get("applied"):
            m.sandbox["hidden"] = spec["sandbox"]["hidden"]  # for saying what a failed run reached for
    if "settings_at_exit" in result:  # what the script set once CUDA and the allocator had started: without effect
        start, end = m.settings_at_start, m.settings_at_exit
        m.alloc_conf_changed = sorted(k for k in start.keys() | end.keys() if start.get(k) != end.get(k))
    return m


def run_fresh(run: dict, tmp: Path) -> dict:
    """Run the measuring child in a new Python process, under a supervisor of its own; the supervisor's report.

    The supervisor (``supervisor.py``) enforces the time limit and watches the
    run; this process only waits for it, with a grace beyond the limit in
    case the supervisor itself is stopped.
    """
    config = {
        "command": [sys.executable, str(CHILD), run["spec"]],
        "cwd": run["cwd"],
        "env": run["env"],
        "stdout": run["stdout"],
        "stderr": run["stderr"],
        "time_limit_s": run["time_limit_s"],
        "driver": run["driver"],
        "report": str(tmp / "witness.json"),
    }
    (tmp / "supervisor.json").write_text(json.dumps(config), encoding="utf-8")
    start = time.perf_counter()
    with open(tmp / "supervisor.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), str(tmp / "supervisor.json")],
            cwd=run["cwd"],
            env=run["env"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=run["time_limit_s"] + REPORT_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        return json.loads((tmp / "witness.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        said = _tail(tmp / "supervisor.log", 5)
        return {
            "supervisor_failed": f"the supervisor of the run ended without a report (exit code {proc.returncode})"
            + (f": {said}" if said else ""),
            "process_s": time.perf_counter() - start,
        }


# The result's form, as the measuring child writes it. The file is open in the script's process, so the script
# could write it: whatever it says is checked against the witness, and first its form is checked here, so that no
# check ever reads a figure of the wrong kind (and a forged result fails as one, not as an error of the grader).
_NUMBER = (int, float)
PARENT_SAYS = {
    "script",
    "budget_bytes",
    "alloc_conf",
    "alloc_conf_declared",
    "alloc_conf_changed",
    "process_s",
    "runner",
    "runner_note",
    "stdout",
    "stderr",
    "witness",
    "weights_digest",
}
_RESULT_FORM = {
    **dict.fromkeys(("status", "message", "error_type", "line", "traceback", "gpu", "torch", "allocator_backend"), str),
    **dict.fromkeys(("line_no",), (int, type(None))),
    **dict.fromkeys(("cuda", "blocking_sync"), (str, type(None))),
    **dict.fromkeys(("gpu_total_bytes", "gpu_free_bytes"), int),
    **dict.fromkeys(("wall_s",), (*_NUMBER, type(None))),
    **dict.fromkeys(("caching_at_start", "figures_witnessed"), (bool, type(None))),
    **dict.fromkeys(("stats", "workload"), (dict, type(None))),
    **dict.fromkeys(("sandbox", "settings_at_start", "settings_at_exit"), dict),
    **dict.fromkeys(("tamper", "weights"), list),
}
_WORKLOAD_COUNTS = (
    "optimizer_steps",
    "train_forwards",
    "train_samples",
    "train_elements",
    "inference_forwards",
    "inference_samples",
    "inference_elements",
    "backward_calls",
    "failed_backwards",
    "param_count",
)


def _numbers(value, kind=_NUMBER) -> bool:
    return isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)


def malformed(result) -> str:
    """Why ``result`` is not in the form the measuring child writes, or "" when it is."""
    if not isinstance(result, dict):
        return "it is not a JSON object"
    for key, kind in _RESULT_FORM.items():
        if key in result and not isinstance(result[key], kind):
            return f"{key} is {type(result[key]).__name__}"
    if not result.get("status"):
        return "it has no status"
    stats = result.get("stats")
    if stats is not None and (set(stats) != set(FIGURES) or not all(type(v) is int for v in stats.values())):
        return "its figures are not the allocator's, each a whole number"
    if result.get("tamper") and not all(isinstance(t, str) for t in result["tamper"]):
        return "tamper lists something other than names"
    work = result.get("workload")
    if work is None:
        return ""
    missing = [k for k in (*_WORKLOAD_COUNTS, "samples_per_step", "backward_per_step", "losses", "devices") if k not in work]
    if missing:
        return f"the workload has no {', '.join(missing)}"
    if not all(type(work[k]) is int for k in _WORKLOAD_COUNTS):
        return "a count of the workload is not a whole number"
    if not (_numbers(work["samples_per_step"], int) and _numbers(work["backward_per_step"], int) and _numbers(work["losses"])):
        return "the workload's steps are not lists of numbers"
    if len(work["samples_per_step"]) != work["optimizer_steps"]:
        return "the workload's steps do not add up"
    outputs = work.get("inference_outputs", {})
    if not isinstance(outputs, dict) or not all(isinstance(v, _NUMBER) for v in outputs.values()):
        return "the workload's evaluation outputs are not numbers"
    if not isinstance(work["devices"], list) or not all(isinstance(d, str) for d in work["devices"]):
        return "the workload's devices are not names"
    serving = work.get("serving", {})
    if not isinstance(serving, dict) or not all(_numbers(v) for v in serving.values()):
        return "the workload's serving figures are not lists of numbers"
    return ""


def collect(tmp: Path, ended: dict, time_limit_s: float) -> dict:
    """The child's result, or what its end says when it left none."""
    result_path = tmp / "result.json"
    if "supervisor_failed" in ended:
        result = {"status": "no_supervisor", "message": ended["supervisor_failed"]}
    elif ended.get("timed_out"):
        result = {"status": "timeout", "message": f"the script ran longer than its limit of {time_limit_s:g} s"}
    else:
        try:
            result = json.loads(result_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            result = None
        if result is None or (isinstance(result, dict) and not result):
            code = ended.get("returncode")
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            result = {"status": "crashed", "message": f"the process {how} before the harness could measure it"}
        elif why := malformed(result):
            result = {
                "status": "forged",
                "message": f"the run's result is not in the form the harness writes ({why}): the script wrote it",
            }
        else:  # what this side measures is never taken from the file
            result = {k: v for k, v in result.items() if k not in PARENT_SAYS}
    result.update(stdout=_tail(tmp / "stdout.txt"), stderr=_tail(tmp / "stderr.txt"))
    return result


def measure_exercise_file(
    exercise,
    script: Path,
    *,
    budget_bytes: int | None = None,
    sandboxed: bool = True,
    sandbox_required: bool = False,
    hide: tuple[Path, ...] = (),
    witness_driver: bool = True,
) -> Measurement:
    """Measure ``script`` under ``exercise``'s budget, allocator settings and time limit, sandboxed for a grade.

    A warm server of the exercise's course, if one runs with its settings, forks the run.
    ``budget_bytes`` replaces the exercise's budget and nothing else (None keeps
    the exercise's own): sizing a budget (:mod:`oomlab.grading.calibrate`) has to
    measure a run exactly as grading does, under another cap. ``witness_driver=False``
    only for timing what reading the driver costs (:mod:`oomlab.bench.witness`).
    """
    return measure(
        script,
        budget_bytes=exercise.budget_bytes if budget_bytes is None else budget_bytes,
        alloc_conf=exercise.alloc_conf,
        time_limit_s=exercise.time_limit_s,
        course_root=exercise.root,
        serving="plateau" in exercise.checks,
        settings_free=exercise.learner_settings,
        sandboxed=sandboxed,
        sandbox_required=sandbox_required,
        hide=hide,
        witness_driver=witness_driver,
    )
