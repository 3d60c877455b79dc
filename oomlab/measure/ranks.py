"""A torchrun job, measured rank by rank: each rank a measuring child of its own, the job watched from here.

``torchrun --nproc-per-node N train.py`` starts N copies of the script, which find each other
through ``torch.distributed``. :func:`launch` starts the same job with torch's own launcher
(``python -m torch.distributed.run --standalone``) whose workers are
:mod:`oomlab.measure.rank_child`: each rank runs as one script does under
:mod:`oomlab.measure.child` (budget, workload observer, the tool's probe), with a folder of
its own for its result, output and report.

While the job runs, this process watches it, every :data:`TICK_S`:

- **the driver** (NVML): each rank's bytes on the GPUs, by the pid its worker wrote, kept at their
  peak. The driver counts what the allocator does not: the CUDA context and NCCL's buffers;
- **each rank's end**, in the order they come: the moment its result appears, or the moment its
  process is gone without one (a signal: the kernel's OOM killer, an abort, torchrun stopping the
  others once one failed), with the exit status torchrun's summary gives each rank that failed;
- **the ranks left waiting.** When one rank fails, the others usually wait for it in their next
  collective: NCCL waits out its timeout (ten minutes by default), gloo sees the peer's connection
  close, or not, if the peer's process lives on. :data:`GRACE_S` after the first failure, every
  rank still running is asked for its threads' stacks (``SIGUSR1``, :mod:`faulthandler`) and
  interrupted (``SIGINT``), which ends a wait Python can interrupt so that its probe still reports;
  :data:`STOP_S` later, whatever is left of the job is killed. A rank still running
  :data:`ENDED_GRACE_S` after another *finished* is stopped the same way: ranks that skipped
  different collectives end at different times, and the one left waits for a peer that is gone,
  while a rank with more to do alone (saving a checkpoint) has a minute for it.

This is for the workflow's tools, on the learner's own scripts: it trusts what each rank says
of itself, as ``python train.py`` would. Grading does not use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from oomlab.course.state import read_json_object
from oomlab.measure.harness import Measurement, _tail, child_env, collect
from oomlab.measure.witness import Driver

__all__ = ["ENDED_GRACE_S", "GONE", "GRACE_S", "RankRun", "exit_codes", "launch", "stop_at"]

RANK_CHILD = Path(__file__).with_name("rank_child.py")
TICK_S = 0.1
GRACE_S = 10.0  # how long the others may go on after a rank failed, before they are asked where they wait
ENDED_GRACE_S = 60.0  # how long the others may go on after a rank finished
STOP_S = 5.0  # how long an interrupted rank has to write its result, before the job is killed
GONE = "gone"  # a rank whose process ended without writing its result
# A failed rank in the summary torchrun prints when a job fails: "rank : 1 (local_rank: 1)", then "exitcode : -9 (pid: ...)"
_FAILED_RANK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class RankRun:
    """One rank of the job: its measurement, and what the watcher saw of it."""

    rank: int
    measurement: Measurement
    pid: int | None = None
    ended_s: float | None = None  # seconds from the job's start to this rank's result; None if it never wrote one
    stopped_s: float | None = None  # when it was stopped (still running GRACE_S after another rank failed,
    # ENDED_GRACE_S after one finished, or at the time limit): asked for its threads' stacks and interrupted
    stacks: str = ""  # its threads' stacks, as faulthandler wrote them when it was asked
    driver_peak_bytes: int | None = None  # the most the driver counted for its process, on every GPU
    returncode: int | None = None  # its own exit status, where torchrun's summary gave it (a signal: negative)
    collectives: dict | None = None  # the script's torch.distributed calls by name; None if the rank never said
    issued: int | None = None  # every collective it issued on the default group, torch's own included; None if unknown


def launch(
    script: Path,
    nproc: int,
    *,
    budget_bytes: int | None,
    alloc_conf: str = "",
    time_limit_s: float = 600,
    args: tuple[str, ...] = (),
    tool: dict | None = None,
    require_cuda: bool = True,
    grace_s: float | None = None,
    seed: int = 0,
) -> tuple[list[RankRun], dict]:
    """Run ``script`` as a torchrun job of ``nproc`` ranks on this machine; each rank's run, and the job's end.

    ``tool`` is :func:`oomlab.measure.harness.measure`'s: its ``out_dir`` gets a folder
    ``rank<R>`` per rank, where each rank's probe writes its report. The job's end is
    ``{"wall_s", "timed_out", "returncode", "launcher"}``: the launcher's own last lines say
    why it stopped when no rank could. ``grace_s`` is :data:`GRACE_S` unless given.
    """
    script = Path(script).resolve()
    with tempfile.TemporaryDirectory(prefix="oomlab-ranks-") as tmp:
        tmp = Path(tmp)
        for rank in range(nproc):
            folder = tmp / f"rank{rank}"
            folder.mkdir()
            rank_tool = None if tool is None else {**tool, "out_dir": str(Path(tool["out_dir"]) / f"rank{rank}")}
            # The child's spec in harness.measure's form: a script of the learner's own, unsandboxed, free to set
            # its allocator settings, as the tools run one.
            spec = {
                "script": str(script),
                "args": list(args),
                "budget_bytes": budget_bytes,
                "seed": seed,
                "require_cuda": require_cuda,
                "result_path": str(folder / "result.json"),
                "weights_path": str(folder / "weights.f32"),
                "work_dir": str(folder),
                "tool": rank_tool,
                "serving": False,
                "settings_free": True,
                "sandbox": None,
                "sandbox_required": False,
            }
            (folder / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(RANK_CHILD),
            str(tmp),
        ]
        env = child_env(alloc_conf)
        # Every GPU the caller sees: a rank picks its own (rank_child), where one run would keep to the first.
        if "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        watch = Watch(tmp, nproc, time_limit_s, GRACE_S if grace_s is None else grace_s, require_cuda)
        with open(tmp / "launcher.txt", "wb") as log:
            proc = subprocess.Popen(
                command,
                cwd=script.parent,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            job = watch.run(proc)
        job["launcher"] = _tail(tmp / "launcher.txt", 12)
        with contextlib.suppress(OSError):
            job["exit_codes"] = exit_codes((tmp / "launcher.txt").read_text(encoding="utf-8", errors="replace"))
        runs = [watch.rank_run(rank, script, budget_bytes, job) for rank in range(nproc)]
    return runs, job


def exit_codes(launcher: str) -> dict[int, int]:
    """Each failed rank's exit status, from the summary torchrun prints when a job fails (a signal is negative).

    torchrun exits with one code for the whole job; its summary lists every rank that failed, the
    first observed among them under "Root Cause", as ``rank : 1 (local_rank: 1)`` followed by
    ``exitcode : -9 (pid: 4321)``.
    """
    return {int(rank): int(code) for rank, code in _FAILED_RANK.findall(launcher)}


def _gone(pid: int) -> bool:
    """Whether the process has ended: it is no longer there, or it is a zombie its parent has not reaped yet."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:  # no /proc here: ask the kernel whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


def stop_at(ended: dict[int, tuple[float, str]], grace_s: float, ended_grace_s: float = ENDED_GRACE_S) -> float | None:
    """When the ranks still running are stopped, in seconds from the job's start; None while no rank has ended.

    ``ended`` is ``{rank: (seconds when it ended, status)}``: ``grace_s`` after the first
    failure, or ``ended_grace_s`` after the first rank that finished, whichever comes first.
    """
    failed = [t for t, status in ended.values() if status != "ok"]
    finished = [t for t, status in ended.values() if status == "ok"]
    due = [min(failed) + grace_s] if failed else []
    due += [min(finished) + ended_grace_s] if finished else []
    return min(due) if due else None


class Watch:
    """The job seen from outside: each rank's pid, end and driver peak; the ranks left waiting are stopped."""

    def __init__(self, tmp: Path, nproc: int, time_limit_s: float, grace_s: float, driver: bool):
        self.tmp, self.nproc, self.time_limit_s, self.grace_s = tmp, nproc, time_limit_s, grace_s
        self.pids: dict[int, int] = {}
        self.ended: dict[int, tuple[float, str]] = {}  # rank -> (seconds from the start, status)
        self.peak: dict[int, int] = {}
        self.stopped: dict[int, float] = {}  # rank -> seconds from the start when it was stopped
        self.driver = Driver() if driver else None
        self.start = 0.0

    def run(self, proc: subprocess.Popen) -> dict:
        self.start = time.perf_counter()
        sampling = self.driver is not None and self.driver.start()
        interrupted_at, timed_out = None, False
        try:
            while True:
                now = time.perf_counter() - self.start
                self._read_ranks(now)
                if sampling:
                    self._sample()
                if proc.poll() is not None:
                    break
                running = [r for r in self.pids if r not in self.ended]
                due = stop_at(self.ended, self.grace_s)
                if interrupted_at is None and running and due is not None and now >= due:
                    self._stop(running, now)
                    interrupted_at = now
                if interrupted_at is not None and now - interrupted_at >= STOP_S:
                    break
                if now >= self.time_limit_s:
                    timed_out = True
                    self._stop([r for r in self.pids if r not in self.ended], now)
                    time.sleep(min(STOP_S, 1.0))  # the stacks are written at once; the probes get no more time
                    break
                time.sleep(TICK_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the job, the launcher included
            proc.wait()
            if sampling:
                self.driver.stop()
        self._read_ranks(time.perf_counter() - self.start)
        return {"wall_s": round(time.perf_counter() - self.start, 3), "timed_out": timed_out, "returncode": proc.returncode}

    def _read_ranks(self, now: float) -> None:
        for rank in range(self.nproc):
            folder = self.tmp / f"rank{rank}"
            if rank not in self.pids:
                with contextlib.suppress(OSError, ValueError):
                    self.pids[rank] = int((folder / "pid").read_text(encoding="utf-8"))
            if rank not in self.ended:
                result = read_json_object(folder / "result.json")  # None: not written yet, or half written
                if result is not None:
                    self.ended[rank] = (round(now, 3), str(result.get("status", "")))
                elif rank in self.pids and _gone(self.pids[rank]):
                    # Ended without a result (killed by a signal), unless it wrote one just before it went.
                    result = read_json_object(folder / "result.json")
                    self.ended[rank] = (round(now, 3), str(result.get("status", "")) if result is not None else GONE)

    def _sample(self) -> None:
        used = self.driver.sample()
        for rank, pid in self.pids.items():
            if used.get(pid) is not None:
                self.peak[rank] = max(self.peak.get(rank, 0), used[pid])

    def _stop(self, ranks: list[int], now: float) -> None:
        """Ask each rank where its threads are, then interrupt it."""
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pids[rank], signal.SIGUSR1)
            self.stopped[rank] = round(now, 3)
        time.sleep(0.2)  # faulthandler writes from its signal handler at once; the interrupt waits for Python
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pids[rank], signal.SIGINT)

    def rank_run(self, rank: int, script: Path, budget_bytes: int | None, job: dict) -> RankRun:
        folder = self.tmp / f"rank{rank}"
        ended = self.ended.get(rank)
        returncode = (job.get("exit_codes") or {}).get(rank)
        if ended is None and job["timed_out"]:
            end = {"timed_out": True}
        else:  # the rank's own exit status where torchrun gave it; the job's for a rank it did not list
            end = {"returncode": job["returncode"] if returncode is None else returncode}
        result = collect(folder, end, self.time_limit_s)
        m = Measurement.from_json({**result, "script": str(script), "budget_bytes": budget_bytes})
        counted = read_json_object(folder / "collectives.json") or {}
        calls, issued = counted.get("calls"), counted.get("issued")
        return RankRun(
            rank=rank,
            measurement=m,
            pid=self.pids.get(rank),
            ended_s=ended[0] if ended else None,
            stopped_s=self.stopped.get(rank),
            stacks=_tail(folder / "stacks.txt", 200),
            driver_peak_bytes=self.peak.get(rank),
            returncode=returncode,
            collectives=calls if isinstance(calls, dict) else None,
            issued=issued if isinstance(issued, int) and not isinstance(issued, bool) else None,
        )
