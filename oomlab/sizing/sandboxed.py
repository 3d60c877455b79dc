"""Run a learner's estimator where it can neither measure nor read an answer: a sandboxed process with no GPU.

An estimate is worth grading only if it was computed from the config. So the
estimator's file runs in a child process of its own (:func:`run_estimator`) that,
before any of the learner's code runs, takes away for good (Landlock, as a graded
script's run does: :mod:`oomlab.measure.confine`):

- the **GPU**: every ``/dev/nvidia*`` device file is hidden, so no CUDA context can
  be made whatever the code does to ``CUDA_VISIBLE_DEVICES`` (which is emptied too);
- the **answers**: the course folder (the reference estimator, the measured configs
  cached in ``.oomlab/``, git's history), the package's copy of the course, and the
  run's own files;
- **torch**: every copy of it, so the step cannot be simulated on the CPU or the meta
  device instead of sized. An estimate is the arithmetic a whiteboard holds; a finder in
  front of the imports says so in words (:class:`NoTorch`), and the file system keeps it
  so where the code removes the finder: the estimator reads only what it runs on
  (:func:`estimator_policy`: this Python's own folders, less the torch they hold; the
  modules in the estimator's folder; the system's shared libraries), so neither this
  environment's torch nor another's (a second virtualenv, a conda install, a copy beside
  the estimator) can be opened;
- the **network**: every socket (:mod:`oomlab.measure.socket_filter`), so no torch can be
  downloaded into its working folder and no other process asked to measure.

The child loads the file as a module (its ``if __name__ == "__main__":`` part does
not run), calls ``estimate(config)`` once per config with a fresh dict, and writes
the answers as JSON on a pipe only it and the parent hold; what the code prints goes
to the log. The parent checks every answer (:func:`oomlab.sizing.score.checked_estimate`);
an answer is only ever the learner's own claim, so a forged one harms no one else.
The estimates are all made before any config is measured, so no measurement of
this grading exists yet while the estimator runs.

The child imports only the standard library before the sandbox is in place: Landlock
can only restrict a process that runs one thread.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.measure.sandbox import Policy
from oomlab.sizing import PARTS, brief
from oomlab.sizing.score import checked_estimate

__all__ = [
    "ANSWER_FD",
    "NO_TORCH",
    "TIME_LIMIT_S",
    "estimator_file",
    "estimator_modules",
    "estimator_policy",
    "gpu_devices",
    "run_estimator",
    "torch_folders",
]

ANSWER_FD = "OOMLAB_ANSWER_FD"  # the descriptor the child writes its answers on
TIME_LIMIT_S = 120.0  # for every config together: arithmetic takes milliseconds
NO_TORCH = (
    "torch cannot be imported by an estimator: an estimate is arithmetic on the config, made before anything runs, "
    "not the step simulated on the CPU or the meta device."
)
NO_TORCH_TODO = "Count the bytes from the config's numbers; `oomlab run` shows the CPU's count of the examples beside yours."
LOG_TAIL = 2000  # characters of the estimator's output kept for an error message
AFTER_ANSWER_S = 2.0  # how long the estimator's process may take to end once it has answered


def gpu_devices() -> list[str]:
    """The device files through which a process reaches an NVIDIA GPU (none on a machine without one)."""
    return sorted(set(glob.glob("/dev/nvidia*")) | set(glob.glob("/dev/dri")))


# Where the system's shared libraries are, which an extension module the estimator imports (numpy's) may load.
SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache")
# Where, below a folder the estimator may read, a Python installation keeps its packages: a torch there is hidden.
PACKAGE_FOLDERS = (
    "",
    "lib/python3*/site-packages",
    "lib/python3*/dist-packages",
    "lib/python3/dist-packages",
    "local/lib/python3*/site-packages",
    "local/lib/python3*/dist-packages",
    "python3*/site-packages",
    "python3*/dist-packages",
)


def torch_folders(readable: Iterable[Path]) -> list[Path]:
    """Every torch package an estimator could otherwise open: the one this Python imports (found without importing
    it), and any copy in the package folders of a ``readable`` folder (a base installation's site-packages, a
    system Python's dist-packages in /usr/lib)."""
    import importlib.util

    found = set()
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("torch")
        found.update(Path(p) for p in ((spec.submodule_search_locations or []) if spec else []))
    for folder in readable:
        for packages in PACKAGE_FOLDERS:
            found.update(Path(p) for p in glob.glob(os.path.join(folder, packages, "torch")) if os.path.isdir(p))
    return sorted(found)


def estimator_modules(script: Path) -> list[Path]:
    """The files of the estimator's folder it may read: its modules (``*.py``), itself among them, by name."""
    return sorted(p for p in Path(script).resolve().parent.glob("*.py") if p.is_file())


def estimator_policy(script: Path, run_dir: Path, work_dir: Path, course_root: Path | None, hide=()) -> Policy:
    """What the estimator's process may read: a graded script's allow-list and less. Everything is hidden (the
    root is), but for this Python's own folders (as a graded script has them,
    :func:`oomlab.measure.confine.grading_policy`), the modules (``*.py``) in the estimator's folder and the
    system's shared libraries; within them the GPU's device files, every torch those folders hold, the course and
    ``hide`` stay hidden. A torch installed anywhere else is outside what it may read."""
    from oomlab.measure import confine

    script = Path(script).resolve()
    base = confine.grading_policy(script, run_dir, work_dir, course_root, hide=(*map(Path, gpu_devices()), *hide))
    # Of the estimator's folder, only its modules: a package or a library copied there (torch's compiled core is a
    # shared object in a folder) cannot be opened, whatever name it is imported under.
    folder = str(script.parent)
    modules = [str(p) for p in estimator_modules(script)]
    readable = (*(v for v in base.visible if v != folder), *SYSTEM_LIBRARIES)
    hidden = (os.sep, folder, *base.hidden, *map(str, torch_folders(map(Path, readable))))
    return Policy(hidden=hidden, visible=(*readable, *modules), writable=base.writable)


def estimator_file(script: Path) -> Path:
    """``script`` resolved, or the error a learner sees where it is missing."""
    script = Path(script).resolve()
    if not script.is_file():
        raise OomLabError(f"{script} does not exist.", "Restore it with `oomlab reset`, or name the file that holds estimate().")
    return script


def run_estimator(
    script: Path,
    configs: list[dict],
    course_root: Path | None,
    sandbox_required: bool = True,
    time_limit_s: float = TIME_LIMIT_S,
    hide: tuple[Path, ...] = (),
    parts: tuple[str, ...] = PARTS,
) -> list[dict[str, float]]:
    """``estimate(config)`` of ``script`` for each config, computed in the sandbox; an OomLabError says what went wrong.

    ``sandbox_required=False`` runs it unconfined where this kernel cannot confine it (the message is then kept off
    the grade by the caller); a grade always requires it. ``hide`` keeps more folders from it (a class's), and
    ``parts`` are what each answer must hold.
    """
    script = estimator_file(script)
    with tempfile.TemporaryDirectory(prefix="oomlab-estimate-") as tmp:
        tmp = Path(tmp)
        work = tmp / "work"
        work.mkdir()
        policy = estimator_policy(script, tmp, work, course_root, hide)
        request = {"script": str(script), "configs": configs, "policy": policy.to_json(), "required": sandbox_required}
        log = tmp / "log.txt"
        read_end, write_end = os.pipe()
        env = {**os.environ, ANSWER_FD: str(write_end), "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
        env.update(TMPDIR=str(work), HOME=str(work), MPLCONFIGDIR=str(work))
        with open(log, "wb") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "oomlab.sizing.sandboxed"],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=work,
                env=env,
                pass_fds=(write_end,),
                start_new_session=True,  # its whole group is stopped at the time limit
            )
        os.close(write_end)
        try:
            child.stdin.write(json.dumps(request).encode())
            child.stdin.close()
        except BrokenPipeError:
            pass
        answer = _read_until(read_end, child, time.monotonic() + time_limit_s)
        try:  # what the estimator left running (a thread, a process) does not keep the grade waiting
            status = child.wait(timeout=AFTER_ANSWER_S)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            status = child.wait()
        tail = log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:].strip()
    if answer is None:
        raise OomLabError(
            f"{script.name}'s estimate() did not answer within {time_limit_s:.0f} s.",
            "An estimate is arithmetic on the config: leave out loops over real tensors of the config's size.",
        )
    try:
        reply = json.loads(answer)
    except ValueError:
        reply = None
    if not isinstance(reply, dict) or not ("estimates" in reply or "error" in reply):
        raise OomLabError(
            f"{script.name}'s estimator ended (exit status {status}) without its answers.\n{tail}".rstrip(),
            "Run `python estimate.py` to see it fail, then check again.",
        )
    if "error" in reply:
        raise OomLabError(str(reply["error"]), str(reply.get("todo", "")))
    estimates = reply["estimates"]
    if not isinstance(estimates, list) or len(estimates) != len(configs):
        raise OomLabError(
            f"{script.name}'s estimator answered {len(estimates) if isinstance(estimates, list) else 'no list'} of {len(configs)} configs."
        )
    return [checked_estimate(e, f"estimate() for config {i + 1}", parts) for i, e in enumerate(estimates)]


def _read_until(fd: int, child: subprocess.Popen, deadline: float) -> bytes | None:
    """The first line written on ``fd`` (or all of it, if its writers close it first), or None when the deadline comes
    first (the child's group is then killed). A line is enough: a process the estimator started may hold the pipe."""
    import selectors

    chunks = []
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    _kill_group(child)
                    return None
                data = os.read(fd, 1 << 16)
                chunks.append(data)
                if not data or b"\n" in data:
                    return b"".join(chunks).split(b"\n", 1)[0]
        finally:
            os.close(fd)


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        child.kill()


# -- the child --------------------------------------------------------------------------------------------------------


def _child() -> int:
    answers = os.fdopen(int(os.environ.pop(ANSWER_FD)), "w", encoding="utf-8")
    request = json.loads(sys.stdin.read())
    script = request["script"]

    def reply(**fields) -> int:
        answers.write(json.dumps(fields) + "\n")  # one line: the parent reads to its end, not to the pipe's
        answers.close()
        return 0

    from oomlab.measure import sandbox, socket_filter  # standard library only

    try:
        sandbox.apply(sandbox.Policy.from_json(request["policy"]))
    except sandbox.Unavailable as err:
        if request["required"]:
            return reply(
                error=f"The estimator cannot be graded here: the sandbox that keeps it from the GPU and the answers is unavailable ({err}).",
                todo="Grade on a Linux 5.13 or newer with Landlock enabled, as `oomlab doctor` describes.",
            )
    try:
        socket_filter.apply()
    except socket_filter.Unavailable as err:
        if request["required"]:
            return reply(
                error=f"The estimator cannot be graded here: the filter that keeps it off the network is unavailable ({err}).",
                todo="Grade on an x86-64 or arm64 Linux that allows seccomp filters (a container's seccomp profile may not).",
            )
    import runpy
    import traceback

    sys.meta_path.insert(0, NoTorch())
    sys.path.insert(0, os.path.dirname(script))  # a helper module beside the estimator imports, as under python
    try:
        namespace = runpy.run_path(script, run_name="oomlab_estimate")
    except NoTorchError:
        return reply(error=f"{os.path.basename(script)} imports torch. {NO_TORCH}", todo=NO_TORCH_TODO)
    except BaseException as err:  # noqa: BLE001 - the learner's code may raise anything; the parent says what
        return reply(
            error=f"Loading {os.path.basename(script)} failed:\n{_last_frames(err, traceback)}", todo="Fix it, then check again."
        )
    estimate = namespace.get("estimate")
    if not callable(estimate):
        return reply(
            error=f"{os.path.basename(script)} defines no function estimate(config).",
            todo="Define it, as the exercise's file does.",
        )
    estimates = []
    for i, cfg in enumerate(request["configs"], 1):
        try:
            estimates.append(_plain(estimate(dict(cfg))))
        except NoTorchError:
            return reply(error=f"estimate() imports torch. {NO_TORCH}", todo=NO_TORCH_TODO)
        except BaseException as err:  # noqa: BLE001
            return reply(
                error=f"estimate() failed on config {i} ({brief(cfg)}):\n{_last_frames(err, traceback)}",
                todo="Run it on that config with `python estimate.py`, fix it, then check again.",
            )
    return reply(estimates=estimates)


class NoTorchError(ImportError):
    pass


class NoTorch:
    """A finder ahead of every other: importing torch (or a part of it) fails with :data:`NO_TORCH`."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise NoTorchError(NO_TORCH, name=name)
        return None


def _plain(value):
    """The answer as JSON can carry it: numbers of any kind (numpy's, a tensor's item) become floats."""
    if isinstance(value, dict):
        out = {}
        for key, number in value.items():
            try:
                out[str(key)] = number if isinstance(number, (int, float)) else float(number)
            except (TypeError, ValueError):
                out[str(key)] = repr(number)[:80]  # refused by the parent, with the value in the message
        return out
    try:
        json.dumps(value)
        return value  # not a dict, and refused by the parent, which names its type
    except (TypeError, ValueError):
        return repr(value)[:80]


def _last_frames(err: BaseException, traceback) -> str:
    return "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-3)).strip()


if __name__ == "__main__":
    sys.exit(_child())
