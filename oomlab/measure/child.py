"""Runs inside the fresh measuring subprocess; never imported by the parent.

Usage: ``python child.py SPEC.json``. The spec names the script, the memory
budget, the seed and where to write the result. Of oomlab it imports only
standard-library-only modules (and a tool's probe, when one is asked for), so
that the learner's script sees a process as close to ``python train.py`` as
possible.

Order matters, and is the reason this file exists:

1. set up CUDA and the budget (``set_per_process_memory_fraction``) before any
   learner code runs;
2. keep private references to the statistics the grader reads, and turn the
   calls that would change them (resetting peaks, lifting the budget, changing
   allocator settings) into recorded no-ops;
3. observe the workload through global module, optimizer and autograd hooks, so
   that a "fix" that trains on less cannot hide it;
4. run the script as ``__main__`` and write one JSON result, whatever happens;
5. from the script's end until its figures are read, keep its globals alive (as
   ``python train.py`` does, whatever the ending) and the garbage collector still,
   so that nothing the harness does moves a figure; and start the script with the
   collector in the same state however the process began.

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
import sys
import time
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a file: make the oomlab package importable, after the script's own folder
    sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from oomlab.frames import failed_at  # noqa: E402 - after the path above
from oomlab.measure.stats import ALLOC_CONF_VARS, read_figures  # noqa: E402
from oomlab.oom import is_oom  # noqa: E402

MIN_TORCH = (2, 4)

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
    "oomlab.tools.snapshot.probe",
    "oomlab.tools.hunt.probe",
    "oomlab.tools.profile.probe",
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


def main(spec_path: str) -> int:
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    result: dict = {"status": "error", "message": "the measuring process stopped before it finished"}
    try:
        run(spec, result)
    finally:
        tmp = spec["result_path"] + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(result, f)
        os.replace(tmp, spec["result_path"])
    return 0


def run(spec: dict, result: dict) -> None:
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
    if cuda and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        result.update(status="no_cuda", message=f"torch {torch.__version__} ({build}) sees no CUDA device")
        return
    if cuda and not setup_budget(torch, spec["budget_bytes"], result):
        return

    tamper: list[str] = []
    stats = install_guards(torch, tamper, spec.get("settings_free", False)) if cuda else None
    observer = WorkloadObserver(torch, stats if spec.get("serving") else None)
    observer.install()
    conf_before = {k: os.environ.get(k) for k in ALLOC_CONF_VARS}

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
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    collecting = gc.isenabled()
    try:
        script_globals = runpy.run_path(script, run_name="__main__")
        gc.disable()
        gc.unfreeze()  # the tools walk every object again: gc.get_referrers() skips frozen ones
        result.update(status="ok", message="")
    except SystemExit as exc:
        gc.disable()
        gc.unfreeze()  # the tools walk every object again: gc.get_referrers() skips frozen ones
        kept = script_namespace(exc, script)
        code = exc.code
        if code in (None, 0):
            result.update(status="ok", message="")
        else:
            result.update(status="exit", message=f"the script called sys.exit({code!r})")
    except BaseException as exc:  # the learner's error, whatever it is, becomes data
        gc.disable()
        gc.unfreeze()  # the tools walk every object again: gc.get_referrers() skips frozen ones
        kept = script_namespace(exc, script)
        result.update(
            status="oom" if is_oom(exc) else "error",
            error_type=type(exc).__name__,
            message=str(exc).strip(),
            **failed_at(exc, script),
        )
        result["traceback"] = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-4000:]
        if probe is not None:  # here, while the failed frames and their locals are still alive
            result["wall_s"] = time.perf_counter() - start
            finish_probe(probe, spec["tool"], exc, None, result)
            probe_finished = True
    if cuda:
        torch.cuda.synchronize()
    result.setdefault("wall_s", time.perf_counter() - start)
    if probe is not None and not probe_finished:
        finish_probe(probe, spec["tool"], None, script_globals, result)

    if stats is not None:
        result["stats"] = read_figures(stats())
    del kept
    if collecting:
        gc.enable()
    result["tamper"] = sorted(set(tamper))
    result["alloc_conf_changed"] = [k for k in ALLOC_CONF_VARS if os.environ.get(k) != conf_before[k]]
    result["workload"] = observer.summary()


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
        from oomlab.tools import probe_class

        probe = probe_class(tool_spec["name"])(torch, Path(tool_spec["out_dir"]), tool_spec.get("options", {}))
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


def setup_budget(torch, budget: int | None, result: dict) -> bool:
    """Cap the caching allocator at the budget (none for a script run without one); refuse GPUs that cannot hold it."""
    device = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(device)
    result["gpu"] = props.name
    result["gpu_total_bytes"] = props.total_memory
    free, _ = torch.cuda.mem_get_info(device)
    result["gpu_free_bytes"] = free
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

    Returns the original statistics function, kept out of the learner's reach
    (patching ``torch.cuda.memory_stats`` later changes nothing we read).
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


class WorkloadObserver:
    """What the script actually did, read through global hooks it cannot bypass by accident.

    A forward call counts when it is the outermost call of a module with
    parameters (the model, not its layers). It is a training forward when the
    module is in training mode with autograd on, else an inference forward
    (evaluation, feature extraction, serving).

    Results are judged by what the optimizer saw: the loss of an optimizer step
    is the sum of the scalar losses whose ``backward()`` ran since the previous
    step, so a batch split into micro-batches (each loss divided by their
    number) has the loss of the whole batch, however many times backward ran.

    ``stats`` (a serving run): after every inference forward, the allocator's
    reserved and non-releasable bytes and the output's sum (float64) are kept,
    so that memory over uptime and the results of a worker with no optimizer
    can be judged.
    """

    def __init__(self, torch, stats=None):
        self.torch = torch
        self.stats = stats
        self.depth = 0
        self.pending = 0
        self.samples_per_step: list[int] = []
        self.forward = {"train": [0, 0, 0], "inference": [0, 0, 0]}  # calls, samples, elements
        self.devices: set[str] = set()
        self.step_loss = 0.0  # the losses backpropagated since the last optimizer step
        self.step_backwards = 0
        self.losses: list[float] = []  # one per optimizer step
        self.backward_per_step: list[int] = []
        self.backward_calls = 0
        self.optimizers: list = []
        self.inference_now = False
        self.counted: tuple[bool, int, int] | None = None  # the outermost forward now running, as tallied
        self.serving: dict[str, list] = {"reserved": [], "inactive_split": [], "output_sums": []}

    def install(self) -> None:
        torch = self.torch
        from torch.optim.optimizer import register_optimizer_step_post_hook

        torch.nn.modules.module.register_module_forward_pre_hook(self._pre)
        try:  # called when a forward raises too (an OOM inside the model), so the nesting depth stays right
            torch.nn.modules.module.register_module_forward_hook(self._post, always_call=True)
        except TypeError:  # a torch without always_call: a forward that raises leaves the depth off
            torch.nn.modules.module.register_module_forward_hook(self._post)
        register_optimizer_step_post_hook(self._step)
        original = torch.autograd.backward

        grad = torch.autograd.grad

        def backward(tensors, *args, **kwargs):
            self.backpropagated(tensors)
            return original(tensors, *args, **kwargs)

        def gradients(outputs, *args, **kwargs):  # torch.autograd.grad: gradients computed, then given to the optimizer
            self.backpropagated(outputs)
            return grad(outputs, *args, **kwargs)

        torch.autograd.backward = backward
        torch.autograd.grad = gradients

    def backpropagated(self, tensors) -> None:
        """Count a backward pass and add its loss: a scalar, or the scalars of a list (``backward([a, b])``).

        A backward that another backward starts (reentrant checkpointing recomputing a block) is part of it.
        """
        if self.in_backward():
            return
        self.backward_calls += 1
        self.step_backwards += 1
        many = tensors if isinstance(tensors, (list, tuple)) else [tensors]
        for t in many:
            if isinstance(t, self.torch.Tensor) and t.numel() == 1:
                self.step_loss += float(t.detach())

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
        tally = self.forward["train" if training else "inference"]
        tally[0] += sign
        tally[1] += sign * samples
        tally[2] += sign * elements
        if training:
            self.pending += sign * samples

    def _post(self, module, args, output):
        self.depth -= 1
        if self.depth == 0 and self.counted is not None and output is None and sys.exc_info()[1] is not None:
            # The model's forward raised (torch calls always_call hooks with no output, while the error
            # propagates): the batch it was given was not trained on or answered, so it does not count.
            self._tally(*self.counted, -1)
            self.counted, self.inference_now = None, False
            return
        if self.depth == 0:
            self.counted = None
        if self.depth == 0 and self.inference_now and self.stats is not None:
            self.inference_now = False
            tensor = output if isinstance(output, self.torch.Tensor) else None
            if isinstance(output, (tuple, list)):
                tensor = next((o for o in output if isinstance(o, self.torch.Tensor)), None)
            if tensor is not None and tensor.is_floating_point():
                with self.torch.no_grad():
                    self.serving["output_sums"].append(float(tensor.detach().sum(dtype=self.torch.float64)))
            figures = read_figures(self.stats())
            self.serving["reserved"].append(figures["reserved_final"])
            self.serving["inactive_split"].append(figures["inactive_split_final"])

    def _step(self, optimizer, args, kwargs):
        self.samples_per_step.append(self.pending)
        self.losses.append(self.step_loss)
        self.backward_per_step.append(self.step_backwards)
        self.pending, self.step_loss, self.step_backwards = 0, 0.0, 0
        if all(o is not optimizer for o in self.optimizers):
            self.optimizers.append(optimizer)

    def summary(self) -> dict:
        params, seen = [], set()
        for opt in self.optimizers:
            for group in opt.param_groups:
                for p in group["params"]:
                    if id(p) not in seen:
                        seen.add(id(p))
                        params.append(p)
        # Summed on the host in float64: no GPU allocation, no rounding from the order of sums.
        host = [p.detach().cpu().double() for p in params]
        summary = {
            "optimizer_steps": len(self.samples_per_step),
            "samples_per_step": self.samples_per_step,
            "train_forwards": self.forward["train"][0],
            "train_samples": self.forward["train"][1],
            "train_elements": self.forward["train"][2],
            "inference_forwards": self.forward["inference"][0],
            "inference_samples": self.forward["inference"][1],
            "inference_elements": self.forward["inference"][2],
            "devices": sorted(self.devices),
            "backward_calls": self.backward_calls,
            "backward_per_step": self.backward_per_step,
            "losses": self.losses,
            "param_count": sum(p.numel() for p in params),
            "weights_sum": float(sum(t.sum() for t in host)) if host else None,
            "weights_norm": float(sum((t * t).sum() for t in host)) ** 0.5 if host else None,
        }
        if self.stats is not None:
            summary["serving"] = self.serving
        return summary


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
