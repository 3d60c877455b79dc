"""The course: a folder of exercises, each one folder with its script and ``exercise.toml``.

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
import re
from pathlib import Path

from oomlab.course.manifest import MANIFEST, Exercise, load_exercise
from oomlab.course.modules import MODULES
from oomlab.course.originals import differs, keep_manifest, original_manifest
from oomlab.course.shipped import is_source, shipped_root
from oomlab.course.state import StateDir, shown
from oomlab.errors import OomLabError

__all__ = ["Course", "find_root", "is_course"]

ROOT_VARIABLE = "OOMLAB_ROOT"


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
    """The exercises of one course folder, in teaching order: module by module, then by ``order``.

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

    Every valid exercise loads; each folder whose manifest does not is kept in
    :attr:`broken` (folder name -> its manifest's error). ``strict`` (the default, for
    the graders, the site and ``oomlab dev``) raises the first such error; the learner's
    commands pass ``strict=False``, so that one broken manifest blocks only its own exercise.
    """

    def __init__(self, root: Path | None = None, *, strict: bool = True, working_tree: bool = False):
        self.root = Path(root or find_root()).resolve()
        self.state = StateDir(self.root)
        self.working_tree = working_tree
        solutions = self.root / "solutions"
        if not solutions.is_dir() and (shipped := shipped_root()) is not None:
            solutions = shipped / "solutions"
        exercises = []
        self.broken: dict[str, OomLabError] = {}
        try:
            folders = sorted((self.root / "exercises").iterdir())
        except OSError as err:
            raise OomLabError(
                f"Cannot list {shown(self.root / 'exercises')}: {err.strerror or err}.", "Make the folder readable."
            ) from None
        for folder in folders:
            if folder.is_dir() and not folder.name.startswith((".", "_")):
                try:
                    exercises.append(self._load(folder, solutions))
                except OomLabError as err:
                    self.broken[folder.name] = err
        if strict and self.broken:
            raise next(iter(self.broken.values()))
        rank = {m.name: i for i, m in enumerate(MODULES)}
        self.exercises: list[Exercise] = sorted(exercises, key=lambda e: (rank[e.module], e.order, e.id))
        # Every exercise's number in `oomlab list`, a broken one's too, at the place its manifest gives it: a
        # learner's broken manifest must not renumber the others (`oomlab hint 6` would open another exercise).
        places = [((rank[e.module], e.order, e.id), e.id) for e in self.exercises]
        places += [(self._place_of_broken(name, rank), name) for name in self.broken]
        self.ids_in_order: list[str] = [ex_id for _, ex_id in sorted(places)]

    def _place_of_broken(self, name: str, rank: dict[str, int]) -> tuple[int, int, str]:
        """Where a manifest that does not load belongs: its ``module`` and ``order`` lines, or the shipped copy's."""
        shipped = shipped_root()
        for path in (self.root / "exercises" / name / MANIFEST, *([shipped / "exercises" / name / MANIFEST] if shipped else [])):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            module = re.search(r'^\s*module\s*=\s*"([^"]+)"\s*$', text, re.M)
            order = re.search(r"^\s*order\s*=\s*(\d+)\s*$", text, re.M)
            if module and order and module[1] in rank:
                return (rank[module[1]], int(order[1]), name)
        return (len(rank), 0, name)  # nothing says where: after the rest

    def number(self, ex_id: str) -> int:
        """The exercise's number in ``oomlab list``, the same whether or not another manifest is broken."""
        return self.ids_in_order.index(ex_id) + 1

    def _load(self, folder: Path, solutions: Path) -> Exercise:
        """The exercise in ``folder``, from the manifest this course reads (see the class's docstring)."""
        if self.working_tree:
            return load_exercise(folder / MANIFEST, self.root, solutions)
        used = original_manifest(self.root, folder.name)
        try:
            ex = load_exercise(used, self.root, solutions)
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
        known = [*by_id, *self.broken]
        close = difflib.get_close_matches(key, known, n=1)
        suggestion = f"Did you mean {close[0]!r}? " if close else ""
        raise OomLabError(
            f"There is no exercise {shown(key)!r}.",
            f"{suggestion}`oomlab list` shows them all: {', '.join(known)}.",
        )
