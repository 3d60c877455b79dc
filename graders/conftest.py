"""pytest options for the graders: whose files to grade, and skipping GPU tests without a GPU."""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--solutions",
        action="store_true",
        help="grade the reference solutions instead of your files, and check that every seeded bug and wrong fix fails",
    )


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
