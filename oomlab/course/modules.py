"""The course's six modules, in teaching order: what each one teaches and which step of the workflow it drills.

An exercise names its module in ``exercise.toml`` (``module = "hunt"``);
``oomlab list``, the site and the nbgrader course group exercises by it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODULES", "READ_FIRST", "Module", "met_before_its_step", "module_named", "step_label"]

# The workflow's first box, before any step: what the first module teaches. An exercise met before the
# module that teaches its step is tagged with it first, so that the workflow is learned in its own order.
READ_FIRST = "Read the error first"


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


def met_before_its_step(module: str, step_name: str) -> bool:
    """Whether an exercise of ``module`` comes before the module that teaches its step (a module named after the step).

    Module 1's exercises are fixed with a later step's tool, but what they drill is reading the
    numbers: the pages and ``oomlab list`` tag them "Read the error first, then" that step.
    """
    order = [m.name for m in MODULES]
    return module in order and step_name in order and order.index(module) < order.index(step_name)


def step_label(module: str, step_name: str) -> str:
    """The step an exercise drills as plain words, for the terminal and the notebooks: "3 profile peaks"."""
    from oomlab.steps import step

    label = step(step_name).label
    return f"{READ_FIRST.lower()}, then {label}" if met_before_its_step(module, step_name) else label
