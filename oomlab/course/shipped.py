"""The course as it ships with the package, and ``oomlab init``, which makes a folder to work in.

In a wheel the course (exercises, solutions, graders) sits inside the package,
under ``oomlab/_course/``; in a source checkout it is the checkout itself. A
learner's course folder made by :func:`init_course` holds a copy of the
exercises and the graders; the reference fixes stay in the package, out of
sight until an exercise passes (``oomlab solution``).

A folder with its own ``solutions/`` is a course's source (this repository, or
a fork of it): its exercise files are the seeded bugs as shipped.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from oomlab.course.manifest import MANIFEST
from oomlab.course.state import CannotWrite, StateDir, make_folder, remove_empty_folders, shown, write_atomic
from oomlab.errors import OomLabError

__all__ = ["COPIED", "init_course", "is_bundled", "is_source", "shipped_root"]

PACKAGE = Path(__file__).resolve().parents[1]
COPIED = ("exercises", "graders")  # what a learner's folder gets; solutions stay in the package
SNAPSHOTS = "snapshots"  # in a wheel: two snapshots taken on a GPU (setup.py), copied too, for a machine without one
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")


def shipped_root() -> Path | None:
    """The folder holding the shipped ``exercises/`` and ``solutions/``, or None if this install has none."""
    bundled = PACKAGE / "_course"
    if (bundled / "exercises").is_dir():
        return bundled
    source = PACKAGE.parent
    if (source / "exercises").is_dir() and (source / "solutions").is_dir() and (source / "pyproject.toml").is_file():
        return source
    return None


def is_bundled(root: Path) -> bool:
    """Whether ``root`` is the course inside the installed package (a wheel's ``oomlab/_course/``).

    It is the original that every learner's copy is made from, and nobody works in it:
    its files are the shipped ones by definition, and an upgrade replaces them.
    """
    return Path(root).resolve() == (PACKAGE / "_course").resolve()


def is_source(root: Path) -> bool:
    """Whether ``root`` is a course's source (it carries ``solutions/``), not a learner's copy made by ``init``."""
    return (Path(root) / "solutions").is_dir()


def init_course(dest: Path) -> list[Path]:
    """Write a fresh course folder at ``dest``: exercises, graders, and the originals (script and manifest).

    ``reset`` restores the script from its original; the learner's commands grade with
    the original manifest, whatever the learner's copy says.

    Refuses a folder that already holds files (nothing of the learner's is ever
    overwritten); returns the top-level paths written.
    """
    from oomlab.course import Course  # the shipped course's exercises, validated

    shipped = shipped_root()
    if shipped is None:
        raise OomLabError("This installation of oomlab carries no course.", "Reinstall it: pip install oomlab")
    dest = Path(dest).expanduser()
    try:
        if dest.exists() and not dest.is_dir():
            raise OomLabError(f"{shown(dest)} exists and is not a folder.", "Name a new folder: oomlab init my-course")
        if dest.is_dir() and any(dest.iterdir()):
            what = "is an OOM Lab course already" if (dest / "exercises").is_dir() else "is not empty"
            raise OomLabError(f"{shown(dest)} {what}; nothing was changed.", "Name a new or empty folder: oomlab init my-course")
    except OSError as err:  # a name too long, a parent we may not look into
        raise OomLabError(f"Cannot use {shown(dest)}: {err.strerror or err}.", "Name a new folder you can write to.") from None
    course = Course(shipped, working_tree=True)  # the files copied below are the originals
    made = make_folder(dest)
    try:
        drafts = {shipped / "exercises" / ex_id for ex_id in course.drafts}  # not the learner's: no GPU measured them

        def ignored(where: str, names: list[str]) -> set[str]:
            return set(IGNORED(where, names)) | {n for n in names if Path(where, n) in drafts}

        for folder in COPIED:
            shutil.copytree(shipped / folder, dest / folder, ignore=ignored)
        if (shipped / SNAPSHOTS).is_dir():  # a wheel's snapshots from a real GPU, to read where there is none
            shutil.copytree(shipped / SNAPSHOTS, dest / SNAPSHOTS, ignore=IGNORED)
        state = StateDir(dest)
        for ex in course.exercises:  # the script's original for `reset`, and the manifest that grades
            write_atomic(state.original(ex.id, ex.file), ex.learner_path.read_text(encoding="utf-8"))
            write_atomic(state.original(ex.id, MANIFEST), ex.manifest_path.read_text(encoding="utf-8"))
        write_atomic(dest / ".gitignore", f"{state.path.name}/\n__pycache__/\n")
    except CannotWrite:
        raise
    except OSError as err:
        raise OomLabError(
            f"Could not write the course into {shown(dest)}: {err.strerror or err}.",
            "Choose a folder you can write to.",
        ) from None
    finally:
        remove_empty_folders(made)
    return [dest / folder for folder in COPIED]
