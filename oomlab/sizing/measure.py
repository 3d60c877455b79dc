"""One training step of a config, taken apart into its parts' bytes (``oomlab.sizing.PARTS``).

:func:`step_bytes` builds the model, runs two steps and reads a meter between the
phases; the meter is the caching allocator on the GPU (:class:`CudaMeter`, the
truth an estimate is graded against) or :class:`~oomlab.sizing.tracker.LiveBytes`
on the CPU. Every reading follows a ``gc.collect()``: what a reference cycle holds
is not counted as held.

- ``parameters``: allocated after the model is built, over what was allocated before;
- ``gradients`` (first step): allocated after ``backward()``, the loss dropped, over before the forward pass;
- ``optimizer_state`` (first step): what ``step()`` left allocated;
- ``activations`` (second step): allocated when the forward pass has returned the loss, over before it;
- ``peak`` (second step): the most allocated during the step, over what was allocated before the model was built
  (the model, its optimizer state and the batch are in it; a library's workspace made before is not).
"""

from __future__ import annotations

import gc
from dataclasses import replace

import torch

from oomlab.sizing import model as decoder
from oomlab.sizing.config import TrainConfig

__all__ = ["CudaMeter", "rehearsal", "serve", "step_bytes"]


class CudaMeter:
    """The caching allocator's count of the bytes its callers requested, for the current device: what the tensors
    take, before the allocator rounds a request up to its block (memory_allocated counts the block, and a large
    block is not split where the rest of its segment would be 1 MiB or less, so it counts that rest too: megabytes a
    step that no arithmetic on the config predicts)."""

    def allocated(self) -> int:
        return torch.cuda.memory_stats()["requested_bytes.all.current"]

    def peak(self) -> int:
        return torch.cuda.memory_stats()["requested_bytes.all.peak"]

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()


def rehearsal(cfg: TrainConfig) -> TrainConfig:
    """A one-block, few-token copy of ``cfg`` that takes the same code paths (precision, checkpointing, optimizer,
    the width of each matrix product), run once unmeasured before any config is measured: what a library allocates
    at its first use on a path and keeps (cuBLAS's workspace of each thread's handle, the main thread's and autograd's;
    cuBLASLt's, at the first matrix product with a bias) is then allocated before the first measured step, as it is
    before any step of a long run, and belongs to no config."""
    return replace(cfg, layers=1, sequence=16, batch=1, vocabulary=256)


def step_bytes(cfg: TrainConfig, device: torch.device, meter) -> dict[str, int]:
    """The config's parts, in bytes, read from ``meter`` (``allocated()``, ``peak()``, ``reset_peak()``)."""

    def allocated() -> int:
        gc.collect()
        return meter.allocated()

    torch.manual_seed(0)
    base = allocated()
    model, optimizer = decoder.build(cfg, device)
    parameters = allocated() - base
    tokens, targets = decoder.batch(cfg, device)

    before = allocated()
    loss = decoder.forward(cfg, model, tokens, targets)
    loss.backward()
    del loss
    gradients = allocated() - before
    optimizer.step()
    optimizer_state = allocated() - before - gradients
    optimizer.zero_grad(set_to_none=True)

    meter.reset_peak()
    before = allocated()
    loss = decoder.forward(cfg, model, tokens, targets)
    activations = allocated() - before
    loss.backward()
    del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    peak = meter.peak() - base
    return {
        "parameters": parameters,
        "gradients": gradients,
        "optimizer_state": optimizer_state,
        "activations": activations,
        "peak": peak,
    }


def serve(parse, measure_one, rehearse) -> int:
    """Measure configs for the grader: JSON dicts on stdin, each turned into a config by ``parse`` and measured on the
    GPU by ``measure_one(cfg, device, meter)``; ``{"gpu", "torch", "measured": [...]}`` on stdout (JSON). Each distinct
    ``rehearse(cfg)`` (a small config on the same code paths) is run once first, unmeasured.

    Run in a process of its own, on code of the course's: no learner's code runs here.
    """
    import json
    import sys

    configs = [parse(c) for c in json.loads(sys.stdin.read())]
    if not torch.cuda.is_available():
        json.dump({"error": "no CUDA device is visible to torch"}, sys.stdout)
        return 0
    device = torch.device("cuda")
    torch.cuda.init()  # the allocator's statistics are an empty dict until CUDA has started

    def reply(measured: list[dict]) -> int:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "measured": measured}, sys.stdout)
        return 0

    try:
        for small in dict.fromkeys(rehearse(cfg) for cfg in configs):
            measure_one(small, device, CudaMeter())
    except torch.cuda.OutOfMemoryError as err:  # a GPU too full for even the small copies: every config says so
        return reply([{"error": f"out of memory in the rehearsal before it: {str(err).splitlines()[0]}"}] * len(configs))
    gc.collect()
    measured = []
    for cfg in configs:
        try:
            measured.append(measure_one(cfg, device, CudaMeter()))
        except torch.cuda.OutOfMemoryError as err:
            measured.append({"error": f"out of memory: {str(err).splitlines()[0]}"})
        gc.collect()
        torch.cuda.empty_cache()
    return reply(measured)


if __name__ == "__main__":  # python -m oomlab.sizing.measure: training steps
    from oomlab.sizing.config import config

    raise SystemExit(serve(config, step_bytes, rehearsal))
