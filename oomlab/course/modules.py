"""A course's modules, in teaching order, each with its exercises: read from the course's ``exercises/modules.toml``.

That list is the one place that says which module an exercise is in and where it comes in
the course: an exercise's number in ``oomlab list`` is its place in it, so a manifest that
does not load renumbers nothing, and inserting an exercise moves only those after it. Each
course folder carries its own (the repository, a copy of it, the course inside an installed
package, a learner's folder made by ``oomlab init``): it sits in ``exercises/``, which every
copy of a course takes along. ``oomlab list``, the site and the nbgrader course group the
exercises by it; :class:`oomlab.course.Course` checks that it names every exercise folder
and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from oomlab.course.toml_file import read_toml
from oomlab.errors import OomLabError

__all__ = [
    "MODULE_LIST",
    "READ_FIRST",
    "SIZE_FIRST",
    "Module",
    "load_list",
    "met_before_its_step",
    "modules_file",
    "step_label",
]

MODULE_LIST = "modules.toml"  # in the course's exercises/, beside the exercise folders
NAME = re.compile(r"[a-z0-9][a-z0-9-]*")  # a module's name or an exercise's id: a file and folder name everywhere
READING = re.compile(r"[a-z0-9][a-z0-9-]*\.md#[a-z0-9][a-z0-9-]*")  # a section of a page of course/: PAGE.md#ANCHOR

# The workflow's first box, before any step: what the first module teaches. An exercise met before the
# module that teaches its step is tagged with it first, so that the workflow is learned in its own order.
READ_FIRST = "Read the error first"
# What an estimate exercise drills in place of a step: nothing runs, so it comes before the workflow's first box.
SIZE_FIRST = "Size it before it runs"


@dataclass(frozen=True)
class Module:
    name: str  # its page (modules/NAME.md) and its nbgrader assignment
    title: str
    goal: str  # what a learner can do after it, for the site and `oomlab list`
    exercises: tuple[str, ...]  # their ids, in teaching order
    later: tuple[str, ...] = ()  # the names of the modules after it in its course
    reading: tuple[str, ...] = ()  # the site's sections it builds on, each PAGE.md#ANCHOR: its page says "read first"


def modules_file(root: Path) -> Path:
    """The list that orders the course in ``root``: its own ``exercises/modules.toml``.

    A learner's folder that has none (made by an older oomlab, which kept the order in each
    manifest) is ordered by the installed package's list, as its manifests come from the package.
    """
    own = Path(root) / "exercises" / MODULE_LIST
    if own.exists():
        return own
    from oomlab.course.shipped import is_source, shipped_root

    shipped = shipped_root()
    if not is_source(root) and shipped is not None and (shipped / "exercises" / MODULE_LIST).is_file():
        return shipped / "exercises" / MODULE_LIST
    return own


def load_list(path: Path) -> tuple[tuple[Module, ...], tuple[str, ...]]:
    """The modules that ``path`` (a course's ``exercises/modules.toml``) lists, and its drafts (:func:`_drafts`), read
    from one parse of the file; every problem is one clear OomLabError."""
    data = read_toml(
        path,
        "Every course lists its modules there, each with its exercises in teaching order: "
        "copy the one oomlab ships (exercises/modules.toml) and name your exercises in it.",
    )

    tables = data.get("modules")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise OomLabError(
            f"{path} lists no modules.",
            'Write one [[modules]] table per module, in teaching order: name, title, goal and exercises = ["ID", ...].',
        )
    read = [_module(table, f"{path}: module {i}", path) for i, table in enumerate(tables, 1)]
    names = [m.name for m in read]
    ids = [ex_id for m in read for ex_id in m.exercises]
    for what, seen in (("module", names), ("exercise", ids)):
        if twice := sorted({x for x in seen if seen.count(x) > 1}):
            raise OomLabError(
                f"{path} names the {what} {twice[0]!r} more than once.", f"Name each {what} once, at its place in the course."
            )
    modules = tuple(replace(m, later=tuple(names[i + 1 :])) for i, m in enumerate(read))
    return modules, _drafts(data.get("drafts", []), modules, path)


def _drafts(drafts, modules: tuple[Module, ...], path: Path) -> tuple[str, ...]:
    """The exercises the list names as ``drafts``: written and checked on the CPU, not yet measured on a GPU.

    A draft has its folder beside the others but is not in the course: no number, no page, no
    notebook, no grade, until a maintainer moves it into a module and measures it on a GPU
    (``make promote EXERCISES=ID``). Its manifest is checked as every exercise's is.
    """
    if not isinstance(drafts, list) or not all(isinstance(d, str) and NAME.fullmatch(d) for d in drafts):
        raise OomLabError(
            f"{path}: 'drafts' should be a list of exercise ids, found {drafts!r}.",
            f'Write the exercises not yet measured on a GPU as drafts = ["ID", ...] in {path}, or leave it out.',
        )
    in_modules = {ex_id: m.name for m in modules for ex_id in m.exercises}
    for ex_id in drafts:
        if ex_id in in_modules:
            raise OomLabError(
                f"{path} names {ex_id!r} both as a draft and in module {in_modules[ex_id]!r}.",
                "An exercise is a draft until it is measured, then it moves into its module: name it in one place.",
            )
    return tuple(drafts)


def _module(table: dict, where: str, path: Path) -> Module:
    def text(key: str) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value.strip():
            raise OomLabError(f"{where}: {key!r} should be a non-empty string, found {value!r}.", f"Fix it in {path}.")
        return " ".join(value.split())  # one paragraph, wrapped by whoever shows it

    name = text("name")
    where = f"{path}: module {name!r}"
    exercises = table.get("exercises")
    if not isinstance(exercises, list) or not all(isinstance(e, str) for e in exercises):
        raise OomLabError(
            f"{where}: 'exercises' should be a list of exercise ids, found {exercises!r}.",
            f'Write its exercises in teaching order in {path}: exercises = ["ID", ...].',
        )
    for key, value in (("name", name), *(("exercise", e) for e in exercises)):
        if not NAME.fullmatch(value):
            raise OomLabError(
                f"{where}: the {key} {value!r} is not a plain name.",
                "Use lowercase letters, digits and hyphens: it names a folder and a page.",
            )
    reading = table.get("reading", [])
    if not isinstance(reading, list) or not all(isinstance(r, str) and READING.fullmatch(r) for r in reading):
        raise OomLabError(
            f"{where}: 'reading' should be a list of site sections, each PAGE.md#ANCHOR, found {reading!r}.",
            f'Name the sections of course/ it builds on in {path}: reading = ["training-step.md#bytes-per-parameter"], '
            "or leave it out.",
        )
    return Module(name, text("title"), text("goal"), tuple(exercises), reading=tuple(reading))


def met_before_its_step(module: Module | None, step_name: str) -> bool:
    """Whether an exercise of ``module`` comes before the module that teaches its step (a module named after the step).

    Module 1's exercises are fixed with a later step's tool, but what they drill is reading the
    numbers: the pages and ``oomlab list`` tag them "Read the error first, then" that step.
    """
    return module is not None and step_name in module.later


def step_label(module: Module | None, step_name: str) -> str:
    """The step an exercise drills as plain words, for the terminal and the notebooks: "3 profile peaks" (for an
    estimate exercise, which has none, :data:`SIZE_FIRST`)."""
    from oomlab.steps import step

    if not step_name:  # an estimate exercise: sized from its config, before anything runs
        return SIZE_FIRST.lower()
    label = step(step_name).label
    return f"{READ_FIRST.lower()}, then {label}" if met_before_its_step(module, step_name) else label
