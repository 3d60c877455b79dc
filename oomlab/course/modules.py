"""The course's six modules, in teaching order: what each one teaches and which step of the workflow it drills.

An exercise names its module in ``exercise.toml`` (``module = "hunt"``);
``oomlab list``, the site and the nbgrader course group exercises by it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODULES", "Module", "module_named"]


@dataclass(frozen=True)
class Module:
    name: str  # as manifests write it
    title: str
    goal: str  # what a learner can do after it, for the site and `oomlab list`


MODULES: tuple[Module, ...] = (
    Module(
        "read-the-numbers",
        "Read the numbers",
        "Tell allocated from reserved from what the driver shows, read an OOM message and memory_summary(), "
        "and account for every byte of a training step: weights, gradients, optimizer state, activations, temporaries.",
    ),
    Module(
        "snapshot",
        "Step 1: snapshot the allocator",
        "Find memory the allocator holds but cannot use: segments pinned by long-lived blocks, shapes that never "
        "repeat, and the cases where an allocator setting is the right fix.",
    ),
    Module(
        "hunt",
        "Step 2: hunt dangling references",
        "Find what keeps tensors alive: autograd graphs, hooks, exception tracebacks, reference cycles, retained graphs.",
    ),
    Module(
        "profile",
        "Step 3: profile the peak",
        "Find the moment and the line where a step peaks, and make the peak smaller without changing the maths.",
    ),
    Module(
        "production",
        "Production",
        "Keep a long-lived worker's memory flat over uptime, and watch it with metrics and a restart policy.",
    ),
    Module(
        "capstone",
        "Capstone",
        "Debug a realistic program whose OOM traceback points at the wrong line: all three steps, hyperparameters last.",
    ),
)

_BY_NAME = {m.name: m for m in MODULES}


def module_named(name: str) -> Module | None:
    return _BY_NAME.get(name)
