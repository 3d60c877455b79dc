"""The course: a folder of exercises, each one folder with its script and ``exercise.toml``, in the order ``exercises/modules.toml`` gives.

- :mod:`~oomlab.course.modules` reads ``exercises/modules.toml``: the modules in teaching order, each with its exercises;
- :mod:`~oomlab.course.manifest` reads and validates one ``exercise.toml``;
- :mod:`~oomlab.course.shipped` finds the course shipped with the package, and ``init``;
- :mod:`~oomlab.course.originals` keeps each exercise as shipped, and ``reset``;
- :mod:`~oomlab.course.progress` records which exercises passed;
- :mod:`~oomlab.course.state` names every file oomlab writes under ``.oomlab/``.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from oomlab.course.manifest import MANIFEST, Exercise, load_exercise
from oomlab.course.modules import Module, load_list, modules_file
from oomlab.course.originals import differs, keep_manifest, original_manifest
from oomlab.course.shipped import is_source, shipped_root
from oomlab.course.state import StateDir, shown
from oomlab.errors import OomLabError

__all__ = ["Course", "find_root", "is_course"]

ROOT_VARIABLE = "OOMLAB_ROOT"


def _is_exercise_folder(path: Path) -> bool:
    """A folder under ``exercises/`` that is an exercise: any but a hidden one or one like ``__pycache__``."""
    return path.is_dir() and not path.name.startswith((".", "_"))


def is_course(folder: Path) -> bool:
    """A course folder holds ``exercises/`` with at least one ``exercise.toml``."""
    try:
        return (folder / "exercises").is_dir() and any((folder / "exercises").glob("*/exercise.toml"))
    except OSError:  # a folder we may not look into is no course of ours
        return False


CLASS_COPY = "oomlab-course"  # the course a class folder pins, beside its nbgrader_config.py (oomlab nbgrader build)


def find_root(start: Path | None = None) -> Path:
    """The course folder: ``$OOMLAB_ROOT``, else the nearest folder at or above ``start`` (the current one) that is a course."""
    if env := os.environ.get(ROOT_VARIABLE):
        root = Path(env).expanduser().resolve()
        if not is_course(root):
            raise OomLabError(
                f"{ROOT_VARIABLE}={env} is not an OOM Lab course folder (no exercises/*/exercise.toml).",
                "Point it at a course folder, or unset it. `oomlab init DIR` makes one.",
            )
        return root
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if is_course(folder):
            return folder
        if is_course(folder / CLASS_COPY):  # a class folder of `oomlab nbgrader build`: the course it pins
            return folder / CLASS_COPY
    raise OomLabError(
        f"No OOM Lab course folder at or above {here}.",
        "Run oomlab inside a course folder, or make one: oomlab init my-course",
    )


class Course:
    """The exercises of one course folder, in teaching order: as its ``exercises/modules.toml`` lists them.

    A folder made by ``oomlab init`` has no ``solutions/``: its exercises are
    graded against the reference fixes shipped in the package.

    The learner's manifest never grades. By default each exercise is loaded from the
    course's own ``exercise.toml`` (:func:`~oomlab.course.originals.original_manifest`:
    kept under ``.oomlab/originals/``, or the package's), so that a raised budget, a
    loosened tolerance, a deleted check or another ``file`` in the learner's copy changes
    nothing; :attr:`Exercise.manifest_edited` says that the learner's copy differs, for
    the report to name. ``working_tree=True`` reads ``exercises/ID/exercise.toml`` itself
    instead: for the maintainer's tools (``oomlab dev``, the truth check, the site,
    ``oomlab nbgrader build``, a class's pinned copy), for whom that file is the source of
    truth, edited on purpose and never kept anywhere else.

    The list (:mod:`~oomlab.course.modules`) names the modules in teaching order, each with its
    exercises: it gives each exercise its module and its number. Every valid exercise loads; each
    one that does not is kept in :attr:`broken` (id -> its error): a manifest that does not load,
    a name in the list with no folder, a folder the list does not name. ``strict`` (the default,
    for the graders, the site and ``oomlab dev``) raises the first such error; the learner's
    commands pass ``strict=False``, so that one broken exercise blocks only itself. A list that
    does not load is always the error: nothing could be numbered.
    """

    def __init__(self, root: Path | None = None, *, strict: bool = True, working_tree: bool = False):
        self.root = Path(root or find_root()).resolve()
        self.state = StateDir(self.root)
        self.working_tree = working_tree
        solutions = self.root / "solutions"
        if not solutions.is_dir() and (shipped := shipped_root()) is not None:
            solutions = shipped / "solutions"
        self.solutions = solutions
        # The list orders the course and says which module each exercise is in; without it nothing can be numbered.
        self.modules_file = modules_file(self.root)
        # Drafts (exercises not yet measured on a GPU) keep their folders in the maintainers' course but stay out of
        # it; a copy of the course (a class's, a learner's) leaves their folders behind, and the list goes along.
        self.modules: tuple[Module, ...]
        self.drafts: tuple[str, ...]
        self.modules, self.drafts = load_list(self.modules_file)
        module_of = {ex_id: m for m in self.modules for ex_id in m.exercises}
        try:
            folders = {f.name: f for f in sorted((self.root / "exercises").iterdir()) if _is_exercise_folder(f)}
        except OSError as err:
            raise OomLabError(
                f"Cannot list {shown(self.root / 'exercises')}: {err.strerror or err}.", "Make the folder readable."
            ) from None
        self.broken: dict[str, OomLabError] = {}
        loaded: dict[str, Exercise] = {}
        for ex_id, module in module_of.items():
            try:
                if ex_id not in folders:
                    raise self._no_folder(ex_id, module)
                loaded[ex_id] = self._load(folders[ex_id], solutions, module)
            except OomLabError as err:
                self.broken[ex_id] = err
        unlisted = [name for name in folders if name not in module_of and name not in self.drafts]
        for name in unlisted:
            self.broken[name] = self._not_listed(folders[name])
        if strict and self.broken:
            raise next(iter(self.broken.values()))
        self.exercises: list[Exercise] = [loaded[ex_id] for ex_id in module_of if ex_id in loaded]
        # Every exercise's number in `oomlab list` is its place in the list, a broken one's too: a learner's broken
        # manifest renumbers nothing (`oomlab hint 6` opens the same exercise). A folder the list does not name
        # comes after the rest, so that it renumbers nothing either.
        self.ids_in_order: list[str] = [*module_of, *unlisted]

    def _no_folder(self, ex_id: str, module: Module) -> OomLabError:
        return OomLabError(
            f"{self.modules_file} names the exercise {ex_id!r} in module {module.name!r}, "
            f"but there is no folder {shown(self.root / 'exercises' / ex_id)}.",
            f"Add the folder exercises/{ex_id}/ with its script and {MANIFEST}, or take {ex_id!r} out of {self.modules_file}.",
        )

    def _not_listed(self, folder: Path) -> OomLabError:
        return OomLabError(
            f"{shown(folder)} is an exercise folder that {self.modules_file} does not name.",
            f'Add "{folder.name}" to the exercises of its module in {self.modules_file}, at its place in the teaching '
            "order (or move the folder out of exercises/).",
        )

    @property
    def scripts(self) -> list[Exercise]:
        """The exercises that run a script on the GPU under a budget (all but the estimate exercises): what the
        maintainers' GPU commands measure, draw and size, in course order."""
        return [ex for ex in self.exercises if not ex.is_estimate]

    def number(self, ex_id: str) -> int:
        """The exercise's number in ``oomlab list``, the same whether or not another manifest is broken."""
        return self.ids_in_order.index(ex_id) + 1

    def _load(self, folder: Path, solutions: Path, module: Module) -> Exercise:
        """The exercise in ``folder``, from the manifest this course reads (see the class's docstring)."""
        if self.working_tree:
            return load_exercise(folder / MANIFEST, self.root, solutions, module)
        used = original_manifest(self.root, folder.name)
        try:
            ex = load_exercise(used, self.root, solutions, module)
        except OomLabError as err:
            if used != self.state.original(folder.name, MANIFEST):
                raise
            raise OomLabError(  # the kept copy itself is damaged: say how to get it back
                err.what,
                f"{err.todo} It is the course's own copy that oomlab keeps: delete it, and oomlab keeps it again "
                f"from {'git, or from your copy where there is none' if is_source(self.root) else 'the package'}.",
            ) from None
        keep_manifest(self.root, folder.name)  # a source without git sees it first, and it loads: the original
        return dataclasses.replace(ex, manifest_edited=used != ex.learner_manifest and differs(ex.learner_manifest, used))

    def problem(self, ex_id: str) -> str:
        """What is wrong with the broken exercise ``ex_id``, in one line, paths relative to the course."""
        return self.broken[ex_id].what.replace(f"{self.root}{os.sep}", "").splitlines()[0]

    def draft(self, ex_id: str) -> Exercise:
        """A draft (``drafts`` in the list) loaded as an exercise of no module, for the maintainers' GPU commands."""
        if ex_id not in self.drafts:
            raise OomLabError(
                f"{shown(ex_id)!r} is not a draft of {self.modules_file}.", f"Its drafts: {', '.join(self.drafts) or 'none'}."
            )
        if not (self.root / "exercises" / ex_id).is_dir():
            raise OomLabError(f"The draft {ex_id!r} has no folder here.", "Drafts are measured in the course's own repository.")
        return load_exercise(self.root / "exercises" / ex_id / MANIFEST, self.root, self.solutions)

    def get(self, key: str) -> Exercise:
        """An exercise by id, or by its number in ``oomlab list`` (:meth:`number`).

        A broken exercise raises its manifest's error.
        """
        by_id = {e.id: e for e in self.exercises}
        number = int(key) if key.isascii() and key.isdigit() and len(key) < 10 else 0
        if 1 <= number <= len(self.ids_in_order):
            key = self.ids_in_order[number - 1]
        if key in by_id:
            return by_id[key]
        if key in self.broken:
            raise self.broken[key]
        if key in self.drafts:
            raise OomLabError(
                f"{shown(key)!r} is a draft, not yet part of the course: no GPU has measured its bug and its fixes.",
                f"`oomlab list` shows the exercises you can do: {', '.join(by_id)}.",
            )
        known = [*by_id, *self.broken]
        close = difflib.get_close_matches(key, known, n=1)
        suggestion = f"Did you mean {close[0]!r}? " if close else ""
        raise OomLabError(
            f"There is no exercise {shown(key)!r}.",
            f"{suggestion}`oomlab list` shows them all: {', '.join(known)}.",
        )
