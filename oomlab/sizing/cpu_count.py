"""A config's parts counted on the CPU, tensor by tensor (:mod:`oomlab.sizing.tracker`): what a learner without a GPU
compares an estimate with, and what stands in for the GPU where the course is checked without one.

The count runs the same code the GPU measures (:attr:`oomlab.sizing.grade.Sized.function`), so it sees every tensor
the step or the generation makes; like the grade, it counts the bytes tensors request, not the allocator's blocks.
It sees no library workspace (cuBLAS's, an attention kernel's scratch). It imports torch: keep it out of what runs without one.
"""

from __future__ import annotations

import gc
import importlib

from oomlab.errors import OomLabError
from oomlab.units import in_gib

__all__ = ["CPU_MOST_BYTES", "count_measured", "count_on_cpu", "own_config"]

# The largest config a learner may have counted (a far-above bound, :mod:`oomlab.sizing.hidden`'s rough bytes): the
# count runs the step for real on the CPU, tensors of their true size, and a larger one takes minutes and gigabytes.
CPU_MOST_BYTES = 1 << 30


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


def own_config(kind, base: dict, text: str) -> dict:
    """A learner's config for ``oomlab run --config``: ``base`` (the first example) with the fields ``text`` names
    (``name=value``, comma-separated) set, each value of its field's type, checked as a graded config is, and small
    enough to count on the CPU; an :class:`OomLabError` says what is wrong."""
    cfg = dict(base)
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = (x.strip() for x in pair.partition("="))
        if not sep or name not in base:
            raise OomLabError(
                f"--config {text!r}: {pair!r} is not name=value with a field of the config.",
                f'Name fields of the examples: {", ".join(base)}; e.g. --config "layers=8,batch=2".',
            )
        kind_of = type(base[name])
        if kind_of is bool:
            if value.lower() not in ("true", "false"):
                raise OomLabError(f"--config {text!r}: {name} is true or false, not {value!r}.")
            cfg[name] = value.lower() == "true"
        elif kind_of is int:
            try:
                cfg[name] = int(value)
            except ValueError:
                raise OomLabError(f"--config {text!r}: {name} is a whole number, not {value!r}.") from None
        else:
            cfg[name] = value
    rough = kind.rough(kind.parse(cfg))  # every field in range, as a graded config's
    if rough > CPU_MOST_BYTES:
        raise OomLabError(
            f"--config {text!r} is too large to count on the CPU (it could take up to {in_gib(rough)}, "
            f"over {in_gib(CPU_MOST_BYTES)}): the count runs it for real, tensors of their true size.",
            "Scale it down (fewer layers, a smaller width, batch or sequence): the rules you find hold at every size.",
        )
    return cfg
