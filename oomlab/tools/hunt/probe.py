"""The hunt inside the measured process: watch the optimizer steps, then walk what the script left.

:meth:`Probe.on_start` registers a global optimizer step hook. After every
``optimizer.step()`` it records ``memory_allocated()`` and the number autograd
will give its next node (so that the graph of the step in progress can be told
from older ones, see :mod:`~oomlab.tools.hunt.inflight`), and after step
``baseline_step`` it also walks the script's live frames and globals and keeps
what each root held then (the baseline), so that :func:`~oomlab.tools.hunt.analysis.summarize`
can tell a list that grows every step from one that was always this big.

:meth:`Probe.analyse` runs when the script is over, inside the ``except`` block
if it raised, so the failed frames and their locals are still alive: it walks
them (see :func:`~oomlab.tools.hunt.roots.roots_from`), searches back from what
the walk did not reach (:mod:`~oomlab.tools.hunt.backsearch`; the baseline does
too, so that growth compares like with like) and turns the holders into the
verdict. What the hunt costs the run is bounded: the walk by depth and node
count, the back search by levels, objects and seconds (each a constant of its
module), twice (the baseline and the end).

Options (all optional): ``script`` (the learner's file; default ``sys.argv[0]``),
``device`` (``"cuda"``, or ``"cpu"`` without a GPU), ``min_bytes`` (smallest
growth or holder worth naming, default 1 MiB), ``baseline_step`` (default 1).
"""

from __future__ import annotations

import sys
from pathlib import Path

from oomlab.tools import base
from oomlab.tools.hunt.analysis import TOOL, own_bytes, stable_name, summarize
from oomlab.tools.hunt.holders import find_holders
from oomlab.tools.hunt.inflight import next_sequence_nr
from oomlab.tools.hunt.roots import roots_from, roots_from_stack
from oomlab.tools.hunt.state import model_state_ids
from oomlab.units import MIB

__all__ = ["MAX_STEPS", "Probe", "saved_hooks_visible"]

MAX_STEPS = 100_000  # allocated-bytes samples kept, one int per optimizer step


def saved_hooks_visible(torch) -> bool:
    """Whether this torch tells a value packed by ``saved_tensors_hooks`` apart (``SavedTensor.unpack_hook``)."""
    saved_tensor = getattr(getattr(torch._C, "_autograd", None), "SavedTensor", None)
    return saved_tensor is None or hasattr(saved_tensor, "unpack_hook")


class Probe(base.Probe):
    """Allocated memory after each optimizer step, a baseline walk after one, and the final walk."""

    tool = TOOL

    def __init__(self, torch, out_dir: Path, options: dict | None = None):
        super().__init__(torch, out_dir, options)
        self.steps: list[int] = []  # memory_allocated() after each optimizer step
        self.step_count = 0
        self.step_sequence: int | None = None  # autograd's next node number after the last optimizer step
        self.baseline: dict | None = None  # root name without its line -> non-state bytes after the baseline step
        self.state_baseline: dict | None = None  # the same names -> model/optimizer state bytes then
        self.baseline_unexplained = 0  # bytes the baseline's back search met and could not name
        self.errors: list[str] = []  # what went wrong in the step hook, which must not stop the training loop
        self.handle = None  # the optimizer step hook's, to remove it
        self.saved_hooks_entered = False
        self.restore = None  # (saved_tensors_hooks, its own __enter__) while the probe watches it

    # -- options
    @property
    def device_type(self) -> str:
        return self.options.get("device") or ("cuda" if self.torch.cuda.is_available() else "cpu")

    @property
    def learner_script(self) -> str:
        """The ``script`` option, else what the measuring child runs (``sys.argv[0]`` once the script started)."""
        return self.script or sys.argv[0]

    @property
    def baseline_step(self) -> int:
        return int(self.options.get("baseline_step", 1))

    @property
    def saved_hooks_hidden(self) -> bool:
        """The script used saved-tensor hooks, and this torch cannot say which saved values they packed."""
        return self.saved_hooks_entered and not saved_hooks_visible(self.torch)

    # -- the life cycle
    def on_start(self) -> None:
        if not saved_hooks_visible(self.torch):
            self._watch_saved_hooks()
        try:
            # Recent torch.optim deletes its ``optimizer`` attribute: the submodule is reached by import only.
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self.handle = register_optimizer_step_post_hook(self._after_step)
        except Exception as err:  # noqa: BLE001 - torch without global optimizer hooks: the final walk still works
            self.errors.append(f"no optimizer step hook: {type(err).__name__}: {err}")

    def analyse(self, exc: BaseException | None, script_globals: dict | None) -> dict:
        """Walk the script's failing frames (or its globals) and summarize what holds the device memory."""
        roots = roots_from(exc, script_globals, self.learner_script)
        walk: dict = {}
        holders = find_holders(
            roots,
            torch=self.torch,
            device_type=self.device_type,
            exclude=model_state_ids(list(roots.values()), self.torch),
            skip=self._own_ids(exc),
            saved_hooks_hidden=self.saved_hooks_hidden,
            since_sequence=self.step_sequence,
            report=walk,
        )
        in_flight = set(roots.in_flight)
        roots.clear()  # the learner's objects: hold them no longer than the walk needed them
        allocated, reserved = self._allocated()
        result = summarize(
            holders,
            allocated=allocated,
            reserved=reserved,
            steps=self.steps,
            baseline=self.baseline,
            baseline_step=self.baseline_step,
            baseline_named_all=not self.baseline_unexplained,
            state_baseline=self.state_baseline,
            in_flight=in_flight,
            unexplained=walk.pop("unexplained", []),
            min_bytes=int(self.options.get("min_bytes", MIB)),
        )
        result.update(
            device_type=self.device_type,
            optimizer_steps=self.step_count,
            walk=walk,
            baseline_unexplained_bytes=self.baseline_unexplained if self.baseline is not None else None,
        )
        if self.errors:
            result["errors"] = list(self.errors)
        return result

    def close(self) -> None:
        if self.restore is not None:
            hooks, original = self.restore
            hooks.__enter__ = original
            self.restore = None
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.remove()

    # -- while the script runs
    def _watch_saved_hooks(self) -> None:
        """Note when the script enters ``saved_tensors_hooks`` (checkpointing, offloading).

        Only on torch that cannot tell hook-packed values apart: then, once the
        script has used such hooks, the walk reads no saved value at all.
        """
        hooks = getattr(getattr(self.torch.autograd, "graph", None), "saved_tensors_hooks", None)
        if hooks is None:
            return
        original = hooks.__enter__
        probe = self

        def entered(context):
            probe.saved_hooks_entered = True
            return original(context)

        hooks.__enter__ = entered
        self.restore = (hooks, original)

    def _after_step(self, optimizer, args, kwargs) -> None:
        """The optimizer step hook: record allocated memory, and take the baseline after its step."""
        try:
            self.step_count += 1
            self.step_sequence = next_sequence_nr(self.torch)
            allocated, _ = self._allocated()
            if allocated is not None and len(self.steps) < MAX_STEPS:
                self.steps.append(allocated)
            if self.step_count == self.baseline_step:
                self.baseline, self.state_baseline = self._baseline()
        except Exception as err:  # noqa: BLE001 - never break the learner's training loop
            self.errors.append(f"step hook: {type(err).__name__}: {err}")

    def _baseline(self) -> tuple[dict, dict]:
        """Non-state bytes, and state bytes, per root (by name without line) held right now, from the live stack.

        The back search runs too, so that a name only it finds (an ``lru_cache``'s
        entries) is measured the same way at both moments. Mid-run it may see
        less: the measuring child freezes what existed before the script
        (``gc.freeze()``), and ``gc.get_referrers`` does not return frozen
        objects, such as a standard-library class's registry. What it met and
        could not name is kept, so that the verdict knows whether a name
        missing here really held nothing.
        """
        roots = roots_from_stack(sys._getframe(1), self.learner_script)
        report: dict = {}
        try:
            holders = find_holders(
                roots,
                torch=self.torch,
                device_type=self.device_type,
                exclude=model_state_ids(list(roots.values()), self.torch),
                skip=self._own_ids(),
                cycles=False,
                saved_hooks_hidden=self.saved_hooks_hidden,
                report=report,
            )
            self.baseline_unexplained = sum(row["bytes"] for row in report.get("unexplained", ()))
            baseline = {stable_name(name): 0 for name in roots}
            baseline.update({stable_name(h["name"]): own_bytes(h) for h in holders})
            state = {stable_name(name): 0 for name in roots}
            state.update({stable_name(h["name"]): h["state_bytes"] for h in holders})
            return baseline, state
        finally:
            roots.clear()

    # -- helpers
    def _allocated(self) -> tuple[int | None, int | None]:
        """``memory_allocated()`` and ``memory_reserved()`` on a GPU; nothing to read on the CPU."""
        if self.device_type == "cuda" and self.torch.cuda.is_available():
            return int(self.torch.cuda.memory_allocated()), int(self.torch.cuda.memory_reserved())
        return None, None

    def _own_ids(self, exc: BaseException | None = None) -> set[int]:
        """``id()`` of the probe, its state and the exception it was handed: the walk must not credit them."""
        return {id(self), id(vars(self)), *map(id, vars(self).values()), id(exc)}
