"""Cheats any exercise could be tried with, and the checks that must catch them.

Each is made from the seeded bug and the reference fix (their sources), as a
learner in a hurry might write it. The truth check measures every one on every
exercise: a cheat that passes is a hole in the grader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CHEATS", "Cheat"]

# A cheat that wraps the buggy script runs it from a file of this name beside itself.
WRAPPED = "wrapped"


@dataclass(frozen=True)
class Cheat:
    name: str
    make: Callable[[str, str], str]  # (buggy source, solution source) -> the cheat's source
    caught_by: frozenset[str]  # at least one of these checks must fail
    wraps_the_bug: bool = False  # the cheat runs the buggy script, kept beside it as WRAPPED


CHEATS: tuple[Cheat, ...] = (
    Cheat(
        "lift-the-budget",
        lambda bug, sol: "import torch\ntorch.cuda.set_per_process_memory_fraction(1.0)\n" + bug,
        frozenset({"no_oom", "untampered"}),
    ),
    Cheat("reset-peak-stats", lambda bug, sol: sol + "\ntorch.cuda.reset_peak_memory_stats()\n", frozenset({"untampered"})),
    Cheat(
        "patch-memory-stats",
        lambda bug, sol: "import torch\ntorch.cuda.memory_stats = lambda *a, **k: {}\n" + bug,
        frozenset({"no_oom"}),
    ),
    Cheat(
        "allocator-settings-at-runtime",
        lambda bug, sol: "import torch\ntorch.cuda.memory._set_allocator_settings('expandable_segments:True')\n" + bug,
        frozenset({"no_oom", "untampered"}),
    ),
    Cheat(
        "catch-the-oom",
        lambda bug, sol: (
            "import os, runpy, torch\ntry:\n"
            f"    runpy.run_path(os.path.join(os.path.dirname(__file__), '{WRAPPED}.py'), run_name='__main__')\n"
            "except torch.cuda.OutOfMemoryError:\n    pass\n"
        ),
        frozenset({"no_oom", "same_workload"}),
        wraps_the_bug=True,
    ),
    Cheat("exit-early", lambda bug, sol: "import sys\nsys.exit(0)\n" + sol, frozenset({"same_workload"})),
    Cheat(
        "other-seed",
        lambda bug, sol: sol.replace("torch.manual_seed(0)", "torch.manual_seed(1)"),
        frozenset({"same_results"}),
    ),
)
