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
    """One cheat: how to make it, and which checks must catch it.

    ``runs_the_bug`` says whether the seeded bug still runs inside the cheat
    (pasted below a line that hides its effect, or wrapped and run from beside
    it). Such a cheat fails as the bug does, so the exercise's symptom catches it
    too; a cheat built on the reference fix can only be caught by ``caught_by``.
    The truth check reads the field instead of building every cheat to find out,
    and a test holds it to what ``make`` does.
    """

    name: str
    make: Callable[[str, str], str]  # (buggy source, solution source) -> the cheat's source
    caught_by: frozenset[str]  # at least one of these checks must fail
    runs_the_bug: bool  # the seeded bug runs inside the cheat: its symptom catches it as well
    wraps_the_bug: bool = False  # the cheat runs the buggy script, kept beside it as WRAPPED


CHEATS: tuple[Cheat, ...] = (
    Cheat(
        "lift-the-budget",
        lambda bug, sol: "import torch\ntorch.cuda.set_per_process_memory_fraction(1.0)\n" + bug,
        frozenset({"no_oom", "untampered"}),
        runs_the_bug=True,
    ),
    Cheat(
        "reset-peak-stats",
        lambda bug, sol: sol + "\ntorch.cuda.reset_peak_memory_stats()\n",
        frozenset({"untampered"}),
        runs_the_bug=False,
    ),
    Cheat(
        "patch-memory-stats",
        lambda bug, sol: "import torch\ntorch.cuda.memory_stats = lambda *a, **k: {}\n" + bug,
        frozenset({"no_oom"}),
        runs_the_bug=True,
    ),
    Cheat(
        "allocator-settings-at-runtime",
        lambda bug, sol: "import torch\ntorch.cuda.memory._set_allocator_settings('expandable_segments:True')\n" + bug,
        frozenset({"no_oom", "untampered"}),
        runs_the_bug=True,
    ),
    Cheat(
        "catch-the-oom",
        lambda bug, sol: (
            "import os, runpy, torch\ntry:\n"
            f"    runpy.run_path(os.path.join(os.path.dirname(__file__), '{WRAPPED}.py'), run_name='__main__')\n"
            "except torch.cuda.OutOfMemoryError:\n    pass\n"
        ),
        frozenset({"no_oom", "same_workload"}),
        runs_the_bug=True,
        wraps_the_bug=True,
    ),
    Cheat("exit-early", lambda bug, sol: "import sys\nsys.exit(0)\n" + sol, frozenset({"same_workload"}), runs_the_bug=False),
    Cheat(
        "other-seed",
        lambda bug, sol: sol.replace("torch.manual_seed(0)", "torch.manual_seed(1)"),
        frozenset({"same_results"}),
        runs_the_bug=False,
    ),
)
