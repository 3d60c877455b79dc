"""pytest hooks for the graders and the project's tests: whose files to grade, and GPU tests without a GPU.

``graders/conftest.py`` and ``tests/conftest.py`` import these hooks; a test
marked ``gpu`` is skipped, with the reason, where torch sees no CUDA device.
"""

from __future__ import annotations

import pytest

__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "pytest_configure"]


def pytest_addoption(parser):
    parser.addoption(
        "--solutions",
        action="store_true",
        help="check the course itself: every reference fix passes, every seeded bug, wrong fix and cheat fails",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where none is present")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: none is visible here (run on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
