"""What the sizing tests share: a reference estimator loaded from its file, and a config's parts counted on the CPU."""

from __future__ import annotations

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
    """``measure(cfg, device, meter)`` counted on the CPU (:func:`oomlab.sizing.cpu_count.count_measured`); skipped without torch."""
    pytest.importorskip("torch")
    from oomlab.sizing.cpu_count import count_measured

    return count_measured(measure, cfg)
