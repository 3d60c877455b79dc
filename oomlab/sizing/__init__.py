"""Size a training step before running it: the model the course sizes, its configurations, and their measured bytes.

A sizing question ("does this config train on 80 GB?") is answered from a
configuration alone: the layers, the width, the sequence, the batch, the
vocabulary, the dtype policy, the optimizer and whether blocks are checkpointed.
This package holds the parts that every answer is checked against:

- :mod:`oomlab.sizing.config`: a configuration, validated, as a plain dict and back;
- :mod:`oomlab.sizing.model`: the decoder it describes and one training step of it,
  the same code on the GPU and on the CPU;
- :mod:`oomlab.sizing.measure`: one step's bytes read from the caching allocator on the
  GPU (the bytes requested, ``requested_bytes`` of ``torch.cuda.memory_stats``, at each phase and at its peak);
- :mod:`oomlab.sizing.tracker`: the same bytes counted on the CPU, where there is no
  allocator to ask, by following every tensor the step makes from its creation to its
  last reference (a cross-check: it sees no allocator rounding and no library workspace);
- :mod:`oomlab.sizing.score`: how close an estimate came, against stated tolerances;
- :mod:`oomlab.sizing.hidden`: the configs an estimator is graded on, drawn from its own source;
- :mod:`oomlab.sizing.sandboxed`: the estimator run where neither the GPU nor an answer can be reached;
- :mod:`oomlab.sizing.grade`: the estimator's answers for those configs against their runs on the GPU;
- :mod:`oomlab.sizing.decode_config` and :mod:`oomlab.sizing.decode`: the same for generation with a KV cache.

The parts of a step (``PARTS``), each in bytes:

- ``parameters``: the weights the optimizer steps and the model computes with;
- ``gradients``: what ``.grad`` holds after ``backward()``;
- ``optimizer_state``: what ``optimizer.step()`` keeps for the next step;
- ``activations``: what the forward pass leaves allocated for the backward pass (the
  saved tensors, the logits and the loss), with the parameters' gradients not yet made;
- ``peak``: the most allocated at once in a step after the first, when the optimizer
  state exists (the first step has none until its ``step()``).
"""

from __future__ import annotations

from pathlib import Path

PARTS = ("parameters", "gradients", "optimizer_state", "activations", "peak")
# The code an estimate's grade depends on besides the course: the configs drawn, the estimator's sandbox, the
# measuring and the scoring. A grade kept from before (a class's, oomlab.classroom.measured) is keyed by it.
SIZING_CODE = tuple(sorted(Path(__file__).resolve().parent.glob("*.py")))

__all__ = ["PARTS", "SIZING_CODE", "brief"]


def brief(cfg: dict) -> str:
    """A config (as a dict) on one line, its fields as ``name=value``: how messages and tables name one."""
    return ", ".join(f"{k}={v}" for k, v in cfg.items())
