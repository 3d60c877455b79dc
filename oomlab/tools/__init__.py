"""The workflow's tools: each works on any training script, and on any exercise.

One package per tool (``snapshot``, ``hunt``, ``profile``), each with a probe,
an analysis and a presentation (see :mod:`oomlab.tools.base`); the steps they
belong to are registered in :mod:`oomlab.steps`. :mod:`oomlab.tools.run` runs a
tool on a target and reads its result.

Standard library only at import: the measuring child loads probes through here.
"""

from __future__ import annotations

import importlib

from oomlab.steps import step

__all__ = ["analysis", "presenter", "probe_class"]


def _module(name: str, part: str):
    step(name)  # KeyError for a tool that is not registered
    return importlib.import_module(f"oomlab.tools.{name}.{part}")


def probe_class(name: str):
    """The :class:`oomlab.tools.base.Probe` subclass of tool ``name``."""
    return _module(name, "probe").Probe


def analysis(name: str):
    """Tool ``name``'s pure analysis module."""
    return _module(name, "analysis")


def presenter(name: str):
    """Tool ``name``'s presentation module: ``render(result)`` and ``draw(result, out_dir)``."""
    return _module(name, "present")
