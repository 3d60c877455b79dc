"""A config's parts counted on the CPU, tensor by tensor (:mod:`oomlab.sizing.tracker`): what a learner without a GPU
compares an estimate with, and what stands in for the GPU where the course is checked without one.

The count runs the same code the GPU measures (:attr:`oomlab.sizing.grade.Sized.function`), so it sees every tensor
the step or the generation makes; it sees no allocator rounding (each GPU block is a multiple of 512 bytes) and no
library workspace (cuBLAS's, an attention kernel's scratch). It imports torch: keep it out of what runs without one.
"""

from __future__ import annotations

import gc
import importlib

__all__ = ["count_measured", "count_on_cpu"]


def count_on_cpu(kind, cfg) -> dict[str, int]:
    """The parts of ``cfg`` (a config of ``kind``, a :class:`oomlab.sizing.grade.Sized`) counted on the CPU, in bytes."""
    return count_measured(getattr(importlib.import_module(kind.module), kind.function), cfg)


def count_measured(measure, cfg) -> dict[str, int]:
    """``measure(cfg, device, meter)`` (a step's or a generation's parts) run on the CPU and counted tensor by tensor."""
    import torch

    from oomlab.sizing.tracker import LiveBytes

    # The measuring collects garbage before each reading; the objects already alive are none of its garbage, and
    # frozen they are not walked again at every reading (a tenth of a second each in a test session).
    gc.freeze()
    try:
        with LiveBytes() as live:
            return measure(cfg, torch.device("cpu"), live)
    finally:
        gc.unfreeze()
