"""Cheats any exercise could be tried with, and the checks that must catch them.

Each is made from the seeded bug and the reference fix (their sources), as a
learner in a hurry, or one set on forging a pass, might write it. The truth
check measures every one on every exercise: a cheat that passes is a hole in
the grader. They come in the five ways a grade was found forgeable:

1. a line the grader never reads (an allocator variable set in the script);
2. reading the answers (the reference fix, the cached reference measurement);
3. forging the result (a result written by the script, losses that train nothing);
4. disarming the harness from inside (builtins rebuilt through ctypes, the
   statistics reader replaced, the job run after the figures are read);
5. work or memory where no figure looks (a subprocess, memory taken around the
   allocator, activations on the host, compute on the CPU).

The first seven are the older, simpler ones each of these grew from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CHEATS", "Cheat"]

# A cheat that wraps the buggy script runs it from a file of this name beside itself.
WRAPPED = "wrapped"

# A torch._C builtin made again from its entry in the module's method table, so that the harness's
# replacement of the module attribute is bypassed: what a determined script can do inside its process.
# It walks forward from a builtin the harness leaves alone to the table's end, so it reads only the table.
REBUILD = """
import ctypes as _ctypes
import torch as _torch


def _rebuilt(name):
    new = _ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = _ctypes.py_object, [_ctypes.c_void_p, _ctypes.py_object, _ctypes.py_object]
    for anchor in ("_cuda_init", "_cuda_getDevice", "_cuda_getDeviceCount"):
        entry = _ctypes.c_void_p.from_address(id(getattr(_torch._C, anchor)) + 16).value  # PyCFunctionObject.m_ml
        while True:
            name_at = _ctypes.c_void_p.from_address(entry).value  # PyMethodDef.ml_name; NULL ends the table
            if not name_at:
                break
            if _ctypes.string_at(name_at) == name.encode():
                return new(entry, _torch._C, None)
            entry += 32  # sizeof(PyMethodDef)
    raise RuntimeError("not found: " + name)


_rebuilt("_cuda_setMemoryFraction")(1.0, _torch.cuda.current_device())  # the budget lifted, nothing recorded
"""

RESET_AT_END = """
_torch.cuda.empty_cache()
_rebuilt("_cuda_resetPeakMemoryStats")(_torch.cuda.current_device())  # the peaks forgotten, nothing recorded
"""

# What the harness keeps in the frames that called the script: a determined script walks up to them.
CALLERS = """
import sys as _sys


def _callers():
    frame = _sys._getframe(1)
    while frame is not None:
        yield from list(frame.f_locals.values())
        frame = frame.f_back
"""

# The harness's statistics reader, found in its caller's frame and made to report nothing.
SWAP_STATISTICS = (
    CALLERS
    + """
for _f in _callers():
    for _cell in getattr(_f, "__closure__", None) or ():
        try:
            if _cell.cell_contents is _torch._C._cuda_memoryStats:
                _cell.cell_contents = lambda device: {}
        except ValueError:  # an empty cell
            pass
"""
)

# The harness's workload observer, found in its caller's frame: the job runs when it is asked for its summary,
# after the figures were read and before the weights are written.
JOB_AFTER_FIGURES = (
    CALLERS
    + f"""
import os as _os
import runpy as _runpy


def _job():
    _runpy.run_path(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "{WRAPPED}.py"), run_name="__main__")


for _o in _callers():
    if type(_o).__name__ == "WorkloadObserver":
        _o.summary = lambda _summary=_o.summary: (_job(), _summary())[1]
"""
)

# The reference fix, looked for wherever a course keeps it: beside the course, in the package, in git.
FIND_THE_SOLUTION = """
import os, pathlib, runpy
here = pathlib.Path(os.path.abspath(__file__))
places = [folder / "solutions" / {id!r} / {file!r} for folder in here.parents]
try:
    from oomlab.course.shipped import shipped_root
    places.append(shipped_root() / "solutions" / {id!r} / {file!r})
except Exception:
    pass
found = [p for p in places if p.exists()]
if not found:
    raise SystemExit("no reference fix found")
"""

READ_THE_REFERENCE = """
import json, os, pathlib
here = pathlib.Path(os.path.abspath(__file__))
for folder in here.parents:
    for cached in sorted((folder / ".oomlab" / "reference").glob({pattern!r})):
        reference = json.loads(cached.read_text())  # its figures, losses and log: everything a forger needs
        print(reference["stdout"])
        raise SystemExit(0)
raise SystemExit("no reference measurement found")
"""

FORGE_THE_RESULT = """
import json, os
# In the harness's own form (a malformed one fails as forged before any check reads it): figures under any budget, and
# a workload of the steps the script would have run, whose losses and weights the script cannot know without training.
figures = ("peak_allocated", "peak_reserved", "peak_requested", "inactive_split_peak", "inactive_split_final",
           "allocated_final", "reserved_final", "retries", "ooms", "segments_peak")
counts = ("optimizer_steps", "train_forwards", "train_samples", "train_elements", "inference_forwards",
          "inference_samples", "inference_elements", "backward_calls", "failed_backwards", "param_count")
workload = dict.fromkeys(counts, 0)
workload.update(samples_per_step=[], backward_per_step=[], losses=[], devices=["cuda"], inference_outputs={})
forged = {"status": "ok", "message": "", "stats": dict.fromkeys(figures, 0), "workload": workload, "tamper": [],
          "weights": [], "sandbox": {"applied": True, "abi": 7}, "figures_witnessed": True}
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if target.endswith("result.json"):
        os.write(int(fd), json.dumps(forged).encode())
os._exit(0)
"""

BACKWARD_ON_A_CONSTANT = """
import torch as _torch
_backward = _torch.Tensor.backward
# The loss goes to backward by value only: the optimizer sees no gradient, nothing trains, the memory of backward is gone.
_torch.Tensor.backward = lambda self, *a, **k: _backward(self.detach().clone().requires_grad_(), *a, **k)
"""

MEMORY_AROUND_THE_ALLOCATOR = """
import ctypes as _ctypes
import torch as _torch
_torch.cuda.init()
_held = _ctypes.c_uint64()
# 256 MiB from the driver directly: the caching allocator, and so its statistics and budget, never see it.
assert _ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2(_ctypes.byref(_held), 256 << 20) == 0
"""

ACTIVATIONS_ON_THE_HOST = """
import torch as _torch

_moved = [0]


def _pack(t):  # what autograd saves for backward goes to the host, 3 GiB of it, the rest where it was
    if t.is_cuda and _moved[0] < (3 << 30):
        _moved[0] += t.numel() * t.element_size()
        return (t.device, t.to("cpu"))
    return (None, t)


_offload = _torch.autograd.graph.saved_tensors_hooks(_pack, lambda held: held[1] if held[0] is None else held[1].to(held[0]))
_offload.__enter__()
"""

COMPUTE_ON_THE_CPU = """
import time as _time
import torch as _torch
import torch.nn.functional as _F
from torch.optim.optimizer import register_optimizer_step_post_hook as _after_each_step

_linear, _conv2d, _until = _F.linear, _F.conv2d, _time.process_time() + 45.0
_cpu = [True]


def _decide(*_):  # 45 s of the layers' work on the CPU; the GPU holds the results
    _cpu[0] = _time.process_time() < _until


# Training decides again only after an optimizer step: a checkpoint recomputes its forward during backward, and
# must find the layers where its forward left them. No-grad work (evaluation, serving) decides at every call.
_after_each_step(_decide)


def _on_the_cpu(op, x, w, b=None, *rest, **kw):
    if not _torch.is_grad_enabled():
        _decide()
    if not (_cpu[0] and x.is_cuda):
        return op(x, w, b, *rest, **kw)
    return op(x.cpu(), w.cpu(), None if b is None else b.cpu(), *rest, **kw).to(x.device)


_F.linear = lambda *a, **k: _on_the_cpu(_linear, *a, **k)
_F.conv2d = lambda *a, **k: _on_the_cpu(_conv2d, *a, **k)
"""

# A helper process that takes GPU memory for the run (the job, or its heavy part, moved out of the budget's reach).
GPU_HELPER = """
import subprocess as _subprocess, sys as _sys
_helper = _subprocess.Popen(
    [_sys.executable, "-c", "import sys, time, torch; x = torch.empty(1 << 28, device='cuda'); print('on the GPU', flush=True); time.sleep(600)"],
    stdout=_subprocess.PIPE,
)
_helper.stdout.readline()  # it holds its GiB now
"""


@dataclass(frozen=True)
class Cheat:
    """One cheat: how to make it, and which checks must catch it.

    ``runs_the_bug`` says whether the seeded bug still runs inside the cheat
    (pasted below a line that hides its effect, or wrapped and run from beside
    it). Such a cheat fails as the bug does, so the exercise's symptom catches it
    too, unless ``uncapped``: it lifts the budget first, so the bug fits and
    only ``caught_by`` can catch it. A cheat built on the reference fix can only
    be caught by ``caught_by``. The truth check reads these fields instead of
    building every cheat to find out, and a test holds them to what ``make`` does.

    ``caught_by`` names checks, and two more ways a run fails: ``sandbox`` (the
    script reached for something grading keeps from it) and ``timeout``.
    """

    name: str
    make: Callable[..., str]  # (buggy source, solution source, exercise) -> the cheat's source
    caught_by: frozenset[str]  # at least one of these must fail
    runs_the_bug: bool  # the seeded bug runs inside the cheat
    wraps_the_bug: bool = False  # the cheat runs the buggy script, kept beside it as WRAPPED
    uncapped: bool = False  # the bug runs without the budget: its symptom cannot catch it
    way: int = 0  # which of the five ways above it tries (0: the older, simpler cheats)


def _run_wrapped() -> str:
    return f"import os, runpy\nrunpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), '{WRAPPED}.py'), run_name='__main__')\n"


CHEATS: tuple[Cheat, ...] = (
    Cheat(
        "lift-the-budget",
        lambda bug, sol, ex: "import torch\ntorch.cuda.set_per_process_memory_fraction(1.0)\n" + bug,
        frozenset({"no_oom", "untampered"}),
        runs_the_bug=True,
    ),
    Cheat(
        "reset-peak-stats",
        lambda bug, sol, ex: sol + "\ntorch.cuda.reset_peak_memory_stats()\n",
        frozenset({"untampered"}),
        runs_the_bug=False,
    ),
    Cheat(
        "patch-memory-stats",
        lambda bug, sol, ex: "import torch\ntorch.cuda.memory_stats = lambda *a, **k: {}\n" + bug,
        frozenset({"no_oom"}),
        runs_the_bug=True,
    ),
    Cheat(
        "allocator-settings-at-runtime",
        lambda bug, sol, ex: "import torch\ntorch.cuda.memory._set_allocator_settings('expandable_segments:True')\n" + bug,
        frozenset({"no_oom", "untampered"}),
        runs_the_bug=True,
    ),
    Cheat(
        "catch-the-oom",
        lambda bug, sol, ex: (
            "import os, runpy, torch\ntry:\n"
            f"    runpy.run_path(os.path.join(os.path.dirname(__file__), '{WRAPPED}.py'), run_name='__main__')\n"
            "except torch.cuda.OutOfMemoryError:\n    pass\n"
        ),
        frozenset({"no_oom", "same_workload"}),
        runs_the_bug=True,
        wraps_the_bug=True,
    ),
    Cheat("exit-early", lambda bug, sol, ex: "import sys\nsys.exit(0)\n" + sol, frozenset({"same_workload"}), runs_the_bug=False),
    Cheat(
        "other-seed",
        lambda bug, sol, ex: sol.replace("torch.manual_seed(0)", "torch.manual_seed(1)"),
        frozenset({"same_results"}),
        runs_the_bug=False,
    ),
    # 1. A line the grader never reads: the allocator reads its variables once, at its start, before the script.
    Cheat(
        "no-caching-variable",
        lambda bug, sol, ex: 'import os\nos.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"\n' + bug,
        frozenset(),
        runs_the_bug=True,
        way=1,
    ),
    # 2. Reading the answers: the sandbox keeps them out of the run's reach.
    Cheat(
        "run-the-solution",
        lambda bug, sol, ex: (
            FIND_THE_SOLUTION.format(id=ex.id, file=ex.file) + "runpy.run_path(str(found[0]), run_name='__main__')\n"
        ),
        frozenset({"sandbox"}),
        runs_the_bug=False,
        way=2,
    ),
    Cheat(
        "read-the-reference",
        lambda bug, sol, ex: READ_THE_REFERENCE.format(pattern=f"{ex.id}-*.json"),
        frozenset({"sandbox"}),
        runs_the_bug=False,
        way=2,
    ),
    Cheat(
        "copy-the-solution-over",
        lambda bug, sol, ex: (
            FIND_THE_SOLUTION.format(id=ex.id, file=ex.file)
            + "found[0].write_text(here.read_text())  # the reference becomes this very script\n"
        ),
        frozenset({"sandbox"}),
        runs_the_bug=False,
        way=2,
    ),
    # 3. Forging the result.
    Cheat(
        "forge-the-result",
        lambda bug, sol, ex: FORGE_THE_RESULT,
        frozenset({"driver", "same_workload", "same_results"}),
        runs_the_bug=False,
        way=3,
    ),
    Cheat(
        "backward-on-a-constant",
        lambda bug, sol, ex: BACKWARD_ON_A_CONSTANT + bug,
        frozenset({"same_results"}),
        runs_the_bug=True,
        way=3,
    ),
    # 4. Disarming the harness from inside: only the driver, outside the process, sees what happened.
    Cheat(
        "rebuilt-builtins",
        lambda bug, sol, ex: REBUILD + bug + RESET_AT_END,
        # Where the bug's memory stays cached to the end, forgetting the peaks hides nothing: reserved is over budget.
        frozenset({"driver", "untampered"}),
        runs_the_bug=True,
        uncapped=True,
        way=4,
    ),
    Cheat(
        "swap-the-statistics",
        lambda bug, sol, ex: REBUILD + SWAP_STATISTICS + bug,
        frozenset({"driver"}),
        runs_the_bug=True,
        uncapped=True,
        way=4,
    ),
    Cheat(
        "job-after-the-figures",
        lambda bug, sol, ex: REBUILD + JOB_AFTER_FIGURES,
        frozenset({"driver"}),
        runs_the_bug=True,
        wraps_the_bug=True,
        uncapped=True,
        way=4,
    ),
    # 5. Work or memory where no figure looks.
    Cheat(
        "job-in-a-subprocess",
        lambda bug, sol, ex: GPU_HELPER + sol,
        frozenset({"driver"}),
        runs_the_bug=False,
        way=5,
    ),
    Cheat(
        "memory-around-the-allocator",
        lambda bug, sol, ex: MEMORY_AROUND_THE_ALLOCATOR + sol,
        frozenset({"driver"}),
        runs_the_bug=False,
        way=5,
    ),
    Cheat(
        "activations-on-the-host",
        lambda bug, sol, ex: ACTIVATIONS_ON_THE_HOST + bug,
        frozenset({"host_memory", "timeout"}),
        runs_the_bug=True,
        way=5,
    ),
    Cheat(
        "compute-on-the-cpu",
        lambda bug, sol, ex: COMPUTE_ON_THE_CPU + sol,
        # Where twenty runs share the machine's cores, moving that much work can also outlast the time limit.
        frozenset({"cpu_time", "timeout"}),
        runs_the_bug=False,
        way=5,
    ),
)
