"""Measuring a training script in a process of its own, whose caching allocator starts empty.

Each measurement runs in a new process so that the same script gives the same
figures every run: a fresh Python process, or a child forked from a warm server
(:mod:`oomlab.measure.warm`) that has imported torch but never touched CUDA.
The child (``child.py``) sets the memory budget, seeds, guards and hooks before
the learner's code runs and writes one JSON result; this side adds the time
limit and turns every way a run can end into a :class:`Measurement`.
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

from oomlab.measure import warm
from oomlab.measure.declared import declared_alloc_conf
from oomlab.measure.stats import ALLOC_CONF_VARS
from oomlab.oom import first_line

CHILD = Path(__file__).with_name("child.py")

# Statuses where the learner's script did not run to its end, through its own doing.
SCRIPT_FAILURES = {"missing", "syntax", "error", "exit", "timeout", "crashed"}
# Statuses where this machine, not the script, is the problem.
MACHINE_PROBLEMS = {"no_torch", "torch_too_old", "no_cuda", "gpu_too_small", "gpu_busy"}


@dataclass
class Measurement:
    """What one run did: how it ended, the allocator's figures, and the workload."""

    script: str
    status: str  # ok, oom, syntax, error, exit, timeout, crashed, or a machine problem
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
    env = dict(os.environ)
    for var in ALLOC_CONF_VARS:
        env.pop(var, None)
    if alloc_conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    # One visible GPU, so the budget caps everything the script can reach.
    env["CUDA_VISIBLE_DEVICES"] = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
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
) -> Measurement:
    """Run ``script`` once under the budget in a fresh process and measure it.

    ``require_cuda=False`` runs it without a GPU and without memory figures; the
    project's own tests use it to exercise every way a run can end on CI.
    ``budget_bytes=None`` runs it uncapped (a script that is not an exercise).
    ``tool`` names a probe from oomlab/tools to run around the script:
    ``{"name": "snapshot", "out_dir": "...", "options": {...}}``.
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
        spec = {
            "script": str(script),
            "args": list(args),
            "budget_bytes": budget_bytes,
            "seed": seed,
            "require_cuda": require_cuda,
            "result_path": str(tmp / "result.json"),
            "tool": tool,
            "serving": serving,
            "settings_free": settings_free,
        }
        (tmp / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        run = {
            "spec": str(tmp / "spec.json"),
            "stdout": str(tmp / "stdout.txt"),
            "stderr": str(tmp / "stderr.txt"),
            "cwd": str(script.parent),
            "env": child_env(alloc_conf),
            "time_limit_s": time_limit_s,
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
            ended = run_fresh(run)
        result = collect(tmp, ended, time_limit_s)

    m = Measurement.from_json({**result, "script": str(script), "budget_bytes": budget_bytes})
    m.alloc_conf, m.alloc_conf_declared = alloc_conf, declared is not None
    m.process_s = ended["process_s"]
    m.runner, m.runner_note = runner, note
    return m


def run_fresh(run: dict) -> dict:
    """Run the measuring child in a new Python process to its end or its time limit; how it ended."""
    status = None
    start = time.perf_counter()
    with open(run["stdout"], "wb") as fout, open(run["stderr"], "wb") as ferr:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), run["spec"]],
            cwd=run["cwd"],
            env=run["env"],
            stdin=subprocess.DEVNULL,
            stdout=fout,
            stderr=ferr,
            start_new_session=True,  # so a timeout can stop everything the script started
        )
        try:
            proc.wait(timeout=run["time_limit_s"])
        except subprocess.TimeoutExpired:
            status = "timeout"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return {"returncode": proc.returncode, "timed_out": status == "timeout", "process_s": time.perf_counter() - start}


def collect(tmp: Path, ended: dict, time_limit_s: float) -> dict:
    """The child's result, or what its end says when it left none."""
    result_path = tmp / "result.json"
    if ended["timed_out"]:
        result = {"status": "timeout", "message": f"the script ran longer than its limit of {time_limit_s:g} s"}
    elif result_path.exists():
        result = json.loads(result_path.read_text(encoding="utf-8"))
    else:
        code = ended["returncode"]
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        result = {"status": "crashed", "message": f"the process {how} before the harness could measure it"}
    result.update(stdout=_tail(tmp / "stdout.txt"), stderr=_tail(tmp / "stderr.txt"))
    return result


def measure_exercise_file(exercise, script: Path, *, budget_bytes: int | None = None) -> Measurement:
    """Measure ``script`` under ``exercise``'s budget, allocator settings and time limit.

    A warm server of the exercise's course, if one runs with its settings, forks the run.
    ``budget_bytes`` replaces the exercise's budget and nothing else (None keeps
    the exercise's own): sizing a budget (:mod:`oomlab.grading.calibrate`) has to
    measure a run exactly as grading does, under another cap.
    """
    return measure(
        script,
        budget_bytes=exercise.budget_bytes if budget_bytes is None else budget_bytes,
        alloc_conf=exercise.alloc_conf,
        time_limit_s=exercise.time_limit_s,
        course_root=exercise.root,
        serving="plateau" in exercise.checks,
        settings_free=exercise.learner_settings,
    )
