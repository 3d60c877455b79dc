"""Plain ``nbgrader autograde`` refuses to start where nothing can be measured, so no zero enters a gradebook.

Without a GPU every measuring cell fails, and nbgrader would record 0 points for every
student as if they had been graded. The course's nbgrader settings (``oomlab_config.py``,
written by ``oomlab nbgrader build``) call :func:`refuse_autograde_without_a_gpu` when nbgrader
starts: before it opens the gradebook, ``nbgrader autograde`` stops with a message for the
instructor. ``oomlab nbgrader autograde`` checks the machine itself first (it measures the
reference fixes before anything else) and tells its own nbgrader runs so through
:data:`CHECKED`, so that each of them need not import torch again.
"""

from __future__ import annotations

import os

from oomlab.measure.machine import has_nvidia_driver

CHECKED = "OOMLAB_GPU_CHECKED"


def cannot_measure() -> str:
    """Why this machine cannot measure a run, or "" when it can."""
    if not has_nvidia_driver():
        return "this machine has no NVIDIA driver"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed in nbgrader's Python"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return ""


def refuse_autograde_without_a_gpu(argv: list[str]) -> None:
    """Stop ``nbgrader autograde`` (``argv`` as nbgrader got it) with the instructor's message where nothing can be measured."""
    if argv[1:2] != ["autograde"] or os.environ.get(CHECKED) == "1":
        return
    if why := cannot_measure():
        raise SystemExit(
            f"oomlab: nbgrader autograde stopped before grading anyone: {why}, so every measuring cell would fail and "
            "score 0. Nothing was graded and the gradebook is as it was. Grade the class on a machine with an NVIDIA "
            "GPU that fits the course's budgets (`oomlab doctor` there says whether it does)."
        )
