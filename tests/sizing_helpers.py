"""What the sizing tests share: a reference estimator loaded from its file, and a config's parts counted on the CPU."""

from __future__ import annotations

import gc
import importlib.util
from pathlib import Path

import pytest


def load(path: Path, name: str):
    """The module in ``path``, loaded under ``name`` (a solution's script is no package's module)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def count_on_cpu(measure, cfg) -> dict[str, int]:
    """``measure(cfg, device, meter)`` (a step's or a generation's parts) run on the CPU and counted tensor by tensor."""
    torch = pytest.importorskip("torch")
    from oomlab.sizing.tracker import LiveBytes

    # The measuring collects garbage before each reading; the objects of the test session are none of its garbage,
    # and frozen they are not walked again at every reading (a tenth of a second each).
    gc.freeze()
    try:
        with LiveBytes() as live:
            return measure(cfg, torch.device("cpu"), live)
    finally:
        gc.unfreeze()
