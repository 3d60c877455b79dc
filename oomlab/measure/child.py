"""Runs inside the measured process; never imported by the parent.

Usage: ``python child.py SPEC.json``, started by a supervisor
(:mod:`oomlab.measure.supervisor`, or a warm server's fork) that watches it
from outside. The spec names the script, the memory budget, the seed, the
sandbox and where the result and the final weights go. Of oomlab it imports
only standard-library-only modules (and a tool's probe, by the module name the
spec gives, when one is asked for: it knows no tool), so that the learner's script sees a process as close to
``python train.py`` as possible.

Order matters, and is the reason this file exists:

1. open the result and weights files, then **sandbox** the process
   (:mod:`oomlab.measure.sandbox`) while it has one thread, before torch or
   CUDA start any: from here on the script can reach neither the answers nor
   the harness's files;
2. set up CUDA, ask the driver to let waiting threads sleep rather than spin
   (so CPU time is work, whatever the GPU's load), initialise the caching
   allocator with one allocation (so a variable the script sets later cannot
   change it: the allocator reads its settings once) and check that it
   caches, then set the budget (``set_per_process_memory_fraction``);
3. keep private references to the statistics the grader reads, and turn the
   calls that would change them (resetting peaks, lifting the budget, changing
   allocator settings) into recorded no-ops;
4. observe the workload through global module and optimizer hooks and the
   autograd engine itself, so that a "fix" that trains on less cannot hide it;
5. mark *ready* for the supervisor's witness, run the script as ``__main__``,
   read the figures, mark *figures read*, then hand over the final weights and
   one JSON result, whatever happened;
6. from the script's end until its figures are read, keep its globals alive (as
   ``python train.py`` does, whatever the ending) and the garbage collector still,
   so that nothing the harness does moves a figure; and start the script with the
   collector in the same state however the process began.

Nothing this process reports is trusted on its own: the supervisor's witness
(:mod:`oomlab.measure.witness`) checks the memory against the driver, and the
parent compares the weights and counts against the reference's.

A warm server (``server.py``) forks this code with :data:`PRELOAD` imported;
a fresh process imports it too, before the script, so the two measure alike.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import random
import re
import runpy
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a file: make the oomlab package importable, after the script's own folder
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oomlab.frames import failed_at  # noqa: E402 - after the path above
from oomlab.measure import sandbox  # noqa: E402
from oomlab.measure.stats import ALLOCATOR_VARIABLES, read_figures  # noqa: E402
from oomlab.measure.witness import MARK_FIGURES, MARK_READY, mark  # noqa: E402
from oomlab.oom import is_oom  # noqa: E402
from oomlab.steps import STEPS  # noqa: E402

MIN_TORCH = (2, 4)
MARKS_FD = "OOMLAB_MARKS_FD"  # supervisor.MARKS_FD: the descriptor of the socket that marks moments for the witness

# The harness's own uses of functions a script could replace: taken now, before any script runs.
_collect, _disable, _enable, _freeze, _unfreeze, _isenabled = (
    gc.collect,
    gc.disable,
    gc.enable,
    gc.freeze,
    gc.unfreeze,
    gc.isenabled,
)
_dumps, _write, _close, _perf = json.dumps, os.write, os.close, time.perf_counter

# Imported before every script, by a fresh process and by a warm server alike, in the order a training
# script imports them. Not only for speed: torch imports torch._dynamo lazily, on the first optimizer
# use, and a traceback stored during that import keeps the frames of the script that triggered it,
# and so their tensors, alive. Imported before the script in every runner, it keeps nothing of it.
PRELOAD = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.optim",
    "torch._dynamo",  # what the first optimizer step imports: 3.5 s of a fresh run on an H200
    "torch.utils.checkpoint",
    "torch.utils.data",
    "torch.profiler",
    "numpy",
    *(s.probe for s in STEPS),  # every tool's probe, by the registry's names
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; what is not installed is skipped (a script that needs it fails on its own)."""
    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            pass
    return loaded


# The private functions that change what the grader measures, and what each would do.
GUARDED = {
    r"^_(cuda|accelerator)_reset(Peak)": "reset the peak memory statistics the grader reads",
    r"^_(cuda|accelerator)_reset(Accumulated)": "reset the retry and OOM counters the grader reads",
    r"^_cuda_setMemoryFraction$": "changed the exercise's memory budget",
    r"^_(cuda|accelerator)\w*(set_allocator_settings|setAllocatorSettings)$": "changed the allocator settings the exercise fixes",
}
SETTINGS_EFFECT = "changed the allocator settings the exercise fixes"


def main(spec_path: str, marks: socket.socket | None = None) -> int:
    """Run one measurement; ``marks`` is the witness's socket (a fresh process finds it by :data:`MARKS_FD`)."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    if marks is None and os.environ.get(MARKS_FD, "").isdigit():
        marks = socket.socket(fileno=int(os.environ[MARKS_FD]))
    os.environ.pop(MARKS_FD, None)
    # Opened before the sandbox closes the folder they are in: written at the end through these descriptors only.
    result_fd = os.open(spec["result_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    weights_fd = os.open(spec["weights_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    result: dict = {"status": "error", "message": "the measuring process stopped before it finished"}
    try:
        if enter_sandbox(spec, result):
            run(spec, result, marks, weights_fd)
    finally:
        _write_all(result_fd, _dumps(result).encode())
        _close(result_fd)
        _close(weights_fd)
        if marks is not None:
            marks.close()
    return 0


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[_write(fd, view) :]


def enter_sandbox(spec: dict, result: dict) -> bool:
    """Apply the spec's sandbox and move into the run's private folder; False when a required sandbox cannot be had."""
    policy = spec.get("sandbox")
    if policy is None:
        result["sandbox"] = {"applied": False, "reason": "not asked for"}
        return True
    work = spec["work_dir"]
    try:
        abi = sandbox.apply(sandbox.Policy.from_json(policy))
        result["sandbox"] = {"applied": True, "abi": abi}
    except sandbox.Unavailable as err:
        result["sandbox"] = {"applied": False, "reason": str(err)}
        if spec.get("sandbox_required"):
            result.update(status="no_sandbox", message=str(err))
            return False
    # The script's own files go to its private folder: the only place besides /dev it may write.
    for var in (
        "TMPDIR",
        "TEMP",
        "TMP",
        "XDG_CACHE_HOME",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "CUDA_CACHE_PATH",
        "MPLCONFIGDIR",
    ):
        os.environ[var] = work
    tempfile.tempdir = work
    sys.dont_write_bytecode = True  # a helper module beside the script would write __pycache__ there
    os.chdir(work)
    return True


def run(spec: dict, result: dict, marks: socket.socket | None, weights_fd: int) -> None:
    try:
        import torch
    except ImportError as err:
        result.update(status="no_torch", message=str(err))
        return
    result["torch"] = torch.__version__
    result["cuda"] = torch.version.cuda
    version = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if version < MIN_TORCH:
        result.update(status="torch_too_old", message=f"torch {torch.__version__} is older than 2.4")
        return
    preload()  # a no-op in a child forked from a warm server, which imported all of it already

    cuda = spec["require_cuda"]
    result["settings_at_start"] = {k: os.environ.get(k) for k in ALLOCATOR_VARIABLES if os.environ.get(k) is not None}
    if cuda and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        result.update(status="no_cuda", message=f"torch {torch.__version__} ({build}) sees no CUDA device")
        return
    if cuda:
        result["blocking_sync"] = blocking_sync()
        if not setup_budget(torch, spec["budget_bytes"], result):
            return

    tamper: list[str] = []
    stats = install_guards(torch, tamper, spec.get("settings_free", False)) if cuda else None
    observer = WorkloadObserver(torch, stats if spec.get("serving") else None)
    observer.install()

    seed = spec["seed"]
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass

    probe = load_probe(torch, spec.get("tool"), result)
    script = os.path.abspath(spec["script"])
    sys.argv = [script, *spec.get("args", [])]
    sys.path[0] = os.path.dirname(script)
    script_globals, probe_finished, kept = None, False, None
    # The cyclic garbage collector starts from the same state in a fresh process and in a forked one:
    # its counts at zero, everything imported so far frozen out of its reach. It then collects at the
    # same points of the script either way, and frees what reference cycles hold (GPU tensors among
    # them) at the same moments, so the two runners measure the same figures.
    _collect()
    _freeze()
    collecting = _isenabled()
    mark(marks, MARK_READY)
    start = _perf()
    try:
        script_globals = runpy.run_path(script, run_name="__main__")
        _disable()
        _unfreeze()  # the tools walk every object again: gc.get_referrers() skips frozen ones
        result.update(status="ok", message="")
    except SystemExit as exc:
        _disable()
        _unfreeze()
        kept = script_namespace(exc, script)
        code = exc.code
        if code in (None, 0):
            result.update(status="ok", message="")
        else:
            result.update(status="exit", message=f"the script called sys.exit({code!r})")
    except BaseException as exc:  # the learner's error, whatever it is, becomes data
        _disable()
        _unfreeze()
        kept = script_namespace(exc, script)
        result.update(
            status="oom" if is_oom(exc) else "error",
            error_type=type(exc).__name__,
            message=str(exc).strip(),
            **failed_at(exc, script),
        )
        result["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
        if probe is not None:  # here, while the failed frames and their locals are still alive
            result["wall_s"] = _perf() - start
            finish_probe(probe, spec["tool"], exc, None, result)
            probe_finished = True
    if cuda:
        torch.cuda.synchronize()
    result.setdefault("wall_s", _perf() - start)
    if probe is not None and not probe_finished:
        finish_probe(probe, spec["tool"], None, script_globals, result)

    if stats is not None:
        result["stats"] = read_figures(stats())
    result["tamper"] = sorted(set(tamper))
    result["settings_at_exit"] = {k: os.environ.get(k) for k in ALLOCATOR_VARIABLES if os.environ.get(k) is not None}
    result["workload"] = observer.summary()
    result["figures_witnessed"] = mark(marks, MARK_FIGURES)  # the driver is read now, beside reserved_final
    result["weights"] = write_weights(torch, observer.parameters(), weights_fd)
    del kept
    if collecting:
        _enable()


def script_namespace(exc: BaseException, script: str) -> dict | None:
    """The global namespace of the script that ``exc`` ended, found in its traceback.

    Run as ``python train.py``, a script's globals live until the process exits,
    even when it ends with an exception; runpy drops them as the exception leaves
    it. Held until the figures are read, they are freed when they would be.
    """
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == "<module>" and os.path.abspath(frame.f_code.co_filename) == script:
            return frame.f_globals
        tb = tb.tb_next
    return None


def load_probe(torch, tool_spec: dict | None, result: dict):
    """Start the probe of an ``oomlab`` tool around the script, if one was asked for."""
    if not tool_spec:
        return None
    try:
        probe_class = importlib.import_module(tool_spec["probe"]).Probe
        probe = probe_class(torch, Path(tool_spec["out_dir"]), tool_spec.get("options", {}))
        probe.start()
        return probe
    except Exception as err:  # the run goes on unprobed; the parent says why
        result["tool_error"] = f"{tool_spec['name']} could not start: {type(err).__name__}: {err}"
        return None


def finish_probe(probe, tool_spec: dict, exc, script_globals, result: dict) -> None:
    try:
        probe.finish(exc, script_globals)
    except Exception as err:  # Probe.finish never raises; this guards a broken subclass
        result["tool_error"] = f"{tool_spec['name']} failed: {type(err).__name__}: {err}"


def blocking_sync() -> str:
    """Ask the driver to put threads that wait for the GPU to sleep instead of spinning; "" when done, else why not.

    By default a thread waiting for the GPU (``synchronize``, ``.item()``) spins,
    so the CPU time of a run grows with the GPU's load from other runs. Asleep,
    it counts only work done on the CPU, which the grader compares with the
    reference's. It must happen before the primary context exists (the
    harness's first CUDA call comes after it); it changes no memory figure.
    """
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), 0):
            return "the driver did not start"
        set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or cuda.cuDevicePrimaryCtxSetFlags
        code = set_flags(device, 0x4)  # CU_CTX_SCHED_BLOCKING_SYNC
        return "" if code == 0 else f"cuDevicePrimaryCtxSetFlags returned {code}"
    except (OSError, AttributeError) as err:
        return f"{type(err).__name__}: {err}"


def setup_budget(torch, budget: int | None, result: dict) -> bool:
    """Start the caching allocator and cap it at the budget (none for a script run without one); refuse GPUs that cannot hold it.

    The allocator reads its settings (``PYTORCH_CUDA_ALLOC_CONF``, and whether
    to cache at all, ``PYTORCH_NO_CUDA_MEMORY_CACHING``) once, at its first
    allocation: one made here, before the script, fixes them as the parent set
    them. It must stay cached: a run where every free goes straight back to the
    driver would read near-empty figures and pass any limit.
    """
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    result["gpu"] = props.name
    result["gpu_total_bytes"] = props.total_memory
    free, _ = torch.cuda.mem_get_info(device)
    result["gpu_free_bytes"] = free
    backend = torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else "native"
    result["allocator_backend"] = backend
    first = torch.empty(1, device="cuda")  # the allocator starts now, with the parent's settings
    del first
    result["caching_at_start"] = torch.cuda.memory_reserved() > 0
    torch.cuda.empty_cache()  # and gives its first segment back: the script starts with nothing reserved
    if budget is None:
        return True
    if props.total_memory < budget:
        result.update(status="gpu_too_small", message=f"{props.name} has {props.total_memory} bytes, the budget is {budget}")
        return False
    if free < budget:
        result.update(status="gpu_busy", message=f"only {free} bytes of {props.name} are free, the budget is {budget}")
        return False
    torch.cuda.set_per_process_memory_fraction(float(budget / props.total_memory), device)
    return True


def install_guards(torch, tamper: list[str], settings_free: bool = False):
    """Make the calls that would falsify the figures record themselves and do nothing.

    ``settings_free``: the allocator's settings are the script's to change (an
    exercise whose fix is a setting, or a script outside the course), so
    ``torch.cuda.memory._set_allocator_settings`` keeps working.

    Returns the original statistics function, kept out of the learner's easy reach
    (patching ``torch.cuda.memory_stats`` later changes nothing we read). A script
    that digs it out and replaces it changes the figures it reports, not what the
    driver saw: the witness compares the two.
    """
    stats = torch._C._cuda_memoryStats
    device = torch.cuda.current_device()
    torch._C._cuda_resetPeakMemoryStats(device)
    torch._C._cuda_resetAccumulatedMemoryStats(device)
    for name in dir(torch._C):
        for pattern, effect in GUARDED.items():
            if settings_free and effect == SETTINGS_EFFECT:
                continue
            if re.search(pattern, name):
                setattr(torch._C, name, _refuse(name, effect, tamper))
    return lambda: stats(device)


def _refuse(name: str, effect: str, tamper: list[str]):
    def refused(*args, **kwargs):
        tamper.append(f"{effect} (torch._C.{name})")
        print(f"[oomlab] ignored a call that {effect} (torch._C.{name})", file=sys.stderr)

    return refused


def write_weights(torch, params: list, fd: int) -> list[list[int]]:
    """Write the final weights, each as float32 in order, for the parent to compare tensor by tensor; their shapes.

    After the figures are read, so the copies to the host move none of them.
    """
    shapes = []
    for p in params:
        host = p.detach().to("cpu", torch.float32).contiguous()
        _write_all(fd, host.numpy().tobytes() if host.numel() else b"")
        shapes.append(list(host.shape))
    return shapes


class WorkloadObserver:
    """What the script actually did, read through global hooks it cannot bypass by accident.

    A forward call counts when it is the outermost call of a module with
    parameters (the model, not its layers). It is a training forward when the
    module is in training mode with autograd on, else an inference forward
    (evaluation, feature extraction, serving).

    Backward passes are counted by the autograd engine itself
    (``Variable._execution_engine``, which ``Tensor.backward``,
    ``torch.autograd.backward``, ``torch.autograd.grad`` and
    ``torch.autograd.graph._engine_run_backward`` all go through). A training
    forward's samples and elements count once a backward that reached its
    output completes (a hook on the output says it did): a batch that fails, in
    its loss or in its backward, did not train, so a batch retried in halves
    counts its samples once, and a batch split before any attempt the same.

    Results are judged by what the optimizer saw: the loss of an optimizer step
    is the sum of the scalar losses whose backward completed since the previous
    step, so a batch split into micro-batches (each loss divided by their
    number) has the loss of the whole batch, however many times backward ran.
    The final weights go to the parent, which compares them tensor by tensor.

    Every inference forward's output adds its sum and sum of squares (on the
    host, from a copy that allocates nothing on the GPU) to a running total, so
    evaluation is judged by what it computed, not by a line it printed.

    ``stats`` (a serving run): after every inference forward, the allocator's
    reserved and non-releasable bytes and the output's sum (float64) are kept,
    so that memory over uptime and the results of a worker with no optimizer
    can be judged.
    """

    DIGEST_MAX_ELEMENTS = 1 << 26  # an output over 256 MiB is not copied to the host to be summed

    def __init__(self, torch, stats=None):
        self.torch = torch
        self.stats = stats
        self.depth = 0
        self.pending = [0, 0]  # samples and elements of training forwards whose output cannot be followed
        self.awaiting: list[list] = []  # [samples, elements, reached] of training forwards awaiting their backward
        self.trained = 0  # training samples of this step whose backward completed
        self.samples_per_step: list[int] = []
        self.forward = {"train": [0, 0, 0], "inference": [0, 0, 0]}  # calls, samples, elements
        self.devices: set[str] = set()
        self.step_loss = 0.0  # the losses backpropagated since the last optimizer step
        self.step_backwards = 0
        self.losses: list[float] = []  # one per optimizer step
        self.backward_per_step: list[int] = []
        self.backward_calls = 0
        self.failed_backwards = 0
        self.optimizers: list = []
        self.inference_now = False
        self.counted: tuple[bool, int, int] | None = None  # the outermost forward now running, as tallied
        self.outputs = [0, 0.0, 0.0]  # inference outputs digested: count, sum, sum of squares
        self.serving: dict[str, list] = {"reserved": [], "inactive_split": [], "output_sums": []}

    def install(self) -> None:
        torch = self.torch
        from torch.autograd.variable import Variable
        from torch.optim.optimizer import register_optimizer_step_post_hook

        torch.nn.modules.module.register_module_forward_pre_hook(self._pre)
        try:  # called when a forward raises too (an OOM inside the model), so the nesting depth stays right
            torch.nn.modules.module.register_module_forward_hook(self._post, always_call=True)
        except TypeError:  # a torch without always_call: a forward that raises leaves the depth off
            torch.nn.modules.module.register_module_forward_hook(self._post)
        register_optimizer_step_post_hook(self._step)
        Variable._execution_engine = _Engine(Variable._execution_engine, self)

    def backward(self, engine, roots, args, kwargs):
        """One call into the autograd engine: counted, its scalar roots added to the step's loss, once it completes.

        A backward that another backward starts (reentrant checkpointing recomputing a block) is part of it.
        """
        if self.in_backward():
            return engine.run_backward(roots, *args, **kwargs)
        try:
            result = engine.run_backward(roots, *args, **kwargs)
        except BaseException:
            self.failed_backwards += 1
            self.pending = [0, 0]  # the forwards this backward reached did not train
            self.awaiting = [entry for entry in self.awaiting if not entry[2]]
            raise
        self.backward_calls += 1
        self.step_backwards += 1
        done = [self.pending] + [entry for entry in self.awaiting if entry[2]]
        self.awaiting = [entry for entry in self.awaiting if not entry[2]]
        self.pending = [0, 0]
        for samples, elements, *_ in done:
            self.trained += samples
            self.forward["train"][1] += samples
            self.forward["train"][2] += elements
        for t in roots if isinstance(roots, (list, tuple)) else [roots]:
            if isinstance(t, self.torch.Tensor) and t.numel() == 1:
                self.step_loss += float(t.detach())
        return result

    def _pre(self, module, args):
        self.depth += 1
        if self.depth != 1 or next(module.parameters(), None) is None:
            return
        if self.in_backward():  # activation checkpointing recomputing a block: not a forward of new data
            return
        tensor = next((a for a in args if isinstance(a, self.torch.Tensor)), None)
        samples = (tensor.shape[0] if tensor.dim() else 1) if tensor is not None else 0
        elements = tensor.numel() if tensor is not None else 0
        if tensor is not None:
            self.devices.add(tensor.device.type)
        training = module.training and self.torch.is_grad_enabled()
        self.counted = (training, samples, elements)
        self._tally(training, samples, elements, +1)
        self.inference_now = not training

    def in_backward(self) -> bool:
        """Whether autograd's backward is running on this thread (it recomputes checkpointed blocks)."""
        task = getattr(self.torch._C, "_current_graph_task_id", None)
        return task is not None and task() != -1

    def _tally(self, training: bool, samples: int, elements: int, sign: int) -> None:
        if training:  # counted once a backward completes after it (see backward)
            self.forward["train"][0] += sign
            self.pending[0] += sign * samples
            self.pending[1] += sign * elements
            return
        tally = self.forward["inference"]
        tally[0] += sign
        tally[1] += sign * samples
        tally[2] += sign * elements

    def _post(self, module, args, output):
        self.depth -= 1
        if self.depth == 0 and self.counted is not None and output is None and sys.exc_info()[1] is not None:
            # The model's forward raised (torch calls always_call hooks with no output, while the error
            # propagates): the batch it was given was not trained on or answered, so it does not count.
            self._tally(*self.counted, -1)
            self.counted, self.inference_now = None, False
            return
        if self.depth == 0 and self.counted is not None and self.counted[0]:
            self._await_backward(output, self.counted)
        if self.depth == 0:
            self.counted = None
        if self.depth == 0 and self.inference_now:
            self.inference_now = False
            tensor = output if isinstance(output, self.torch.Tensor) else None
            if isinstance(output, (tuple, list)):
                tensor = next((o for o in output if isinstance(o, self.torch.Tensor)), None)
            self._digest(tensor)
            if self.stats is not None:
                if tensor is not None and tensor.is_floating_point():
                    with self.torch.no_grad():
                        self.serving["output_sums"].append(float(tensor.detach().sum(dtype=self.torch.float64)))
                figures = read_figures(self.stats())
                self.serving["reserved"].append(figures["reserved_final"])
                self.serving["inactive_split"].append(figures["inactive_split_final"])

    def _await_backward(self, output, counted: tuple[bool, int, int]) -> None:
        """Follow a training forward's output to the backward that reaches it, through a hook that holds no tensor."""
        outputs = output if isinstance(output, (tuple, list)) else [output]
        tensor = next((o for o in outputs if isinstance(o, self.torch.Tensor) and o.requires_grad), None)
        if tensor is None:
            return  # nothing to follow: counted by the next backward that completes
        entry = [counted[1], counted[2], False]
        self.pending[0] -= counted[1]
        self.pending[1] -= counted[2]
        self.awaiting.append(entry)
        tensor.register_hook(lambda grad, entry=entry: entry.__setitem__(2, True))

    def _digest(self, tensor) -> None:
        """Add an inference output to the running sums, from a host copy (a contiguous copy allocates nothing on the GPU)."""
        if tensor is None or not tensor.is_floating_point() or not tensor.is_contiguous():
            return
        if tensor.numel() > self.DIGEST_MAX_ELEMENTS:
            return
        with self.torch.no_grad():
            host = tensor.detach().to("cpu").double()
        self.outputs[0] += 1
        self.outputs[1] += float(host.sum())
        self.outputs[2] += float((host * host).sum())

    def _step(self, optimizer, args, kwargs):
        self.samples_per_step.append(self.trained)
        self.losses.append(self.step_loss)
        self.backward_per_step.append(self.step_backwards)
        self.pending, self.awaiting, self.trained, self.step_loss, self.step_backwards = [0, 0], [], 0, 0.0, 0
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)

    def parameters(self) -> list:
        """The parameters of every optimizer that stepped, each once, in the order the optimizers hold them."""
        params, seen = [], set()
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        return params

    def summary(self) -> dict:
        summary = {
            "optimizer_steps": len(self.samples_per_step),
            "samples_per_step": self.samples_per_step,
            "train_forwards": self.forward["train"][0],
            "train_samples": self.forward["train"][1],
            "train_elements": self.forward["train"][2],
            "inference_forwards": self.forward["inference"][0],
            "inference_samples": self.forward["inference"][1],
            "inference_elements": self.forward["inference"][2],
            "inference_outputs": {"digested": self.outputs[0], "sum": self.outputs[1], "sum_squares": self.outputs[2]},
            "devices": sorted(self.devices),
            "backward_calls": self.backward_calls,
            "failed_backwards": self.failed_backwards,
            "backward_per_step": self.backward_per_step,
            "losses": self.losses,
            "param_count": sum(p.numel() for p in self.parameters()),
        }
        if self.stats is not None:
            summary["serving"] = self.serving
        return summary


class _Engine:
    """The autograd engine, seen through :meth:`WorkloadObserver.backward` for every backward pass."""

    def __init__(self, engine, observer: WorkloadObserver):
        self._engine, self._observer = engine, observer

    def run_backward(self, roots, *args, **kwargs):
        return self._observer.backward(self._engine, roots, args, kwargs)

    def __getattr__(self, name):  # queue_callback and the rest, as the engine has them
        return getattr(self._engine, name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
