"""Each exercise as shipped, and ``reset``, which puts it back without ever losing the learner's version.

The original comes from, in order:

1. ``.oomlab/originals/``, written by ``oomlab init`` straight from the package,
   or, in a course's source (a checkout), at the first command run there (from
   git's committed file when there is one, so an edit made before that is not taken);
2. the package's own copy, for a folder made by ``init`` whose ``.oomlab/`` was deleted.

Never from git's HEAD at the time of the reset: a learner who commits an
edit would get the edit back.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from oomlab.course.manifest import Exercise
from oomlab.course.shipped import is_source, shipped_root
from oomlab.course.state import CannotWrite, StateDir, read_error, shown, write_atomic
from oomlab.errors import OomLabError

__all__ = ["keep_originals", "pristine_source", "reset", "shipped_source"]


def shipped_source(ex: Exercise) -> str:
    """The exercise's script as the course ships it: what the truth check measures as the seeded bug.

    In a course's source that is the file itself; in a learner's copy, the package's
    copy (or the file, for an exercise the package does not have).
    """
    path = ex.learner_path
    shipped = shipped_root()
    if not is_source(ex.root) and shipped is not None and (shipped / "exercises" / ex.id / ex.file).is_file():
        path = shipped / "exercises" / ex.id / ex.file
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise OomLabError(f"Cannot read the exercise {path}: {err.strerror or err}.", "Reinstall oomlab.") from None


def _committed(ex: Exercise) -> str | None:
    """The exercise as git has it committed, in a source checkout; None elsewhere."""
    rel = ex.learner_path.relative_to(ex.root).as_posix()
    try:
        return subprocess.run(["git", "show", f"HEAD:./{rel}"], cwd=ex.root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def pristine_source(ex: Exercise) -> str:
    """The exercise as shipped, for ``reset`` and ``solution``."""
    kept = StateDir(ex.root).original(ex.id, ex.file)
    if kept.is_file():
        try:
            return kept.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OomLabError(
                f"The kept original {shown(kept)} cannot be read: {getattr(err, 'strerror', None) or err}.",
                f"Delete it (oomlab keeps it again from {'git' if is_source(ex.root) else 'the package'}) "
                "or make it readable, then try again.",
            ) from None
    if not is_source(ex.root):
        return shipped_source(ex)
    source = _committed(ex)
    if source is None:
        if not ex.learner_path.is_file():
            raise OomLabError(
                f"{ex.learner_path} is missing and no original copy was kept.", "Restore it from the course repository."
            )
        try:
            source = ex.learner_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OomLabError(
                f"No original of {ex.id} was kept, and {shown(ex.learner_path)} cannot be read as one: "
                f"{getattr(err, 'strerror', None) or err}.",
                "Restore it from the course repository.",
            ) from None
    with contextlib.suppress(CannotWrite):  # a read-only .oomlab/: the commands that must write say so
        write_atomic(kept, source)  # first sight: from now on the original is this copy
    return source


def keep_originals(exercises) -> None:
    """Keep each exercise's original at first sight, before the learner can edit it."""
    for ex in exercises:
        with contextlib.suppress(OSError, OomLabError):  # read-only, or the file is gone: reset will say so
            pristine_source(ex)


def reset(ex: Exercise) -> Path | None:
    """Put the original back; return where the learner's version was kept, if there was one to keep.

    The learner's version is kept before anything is overwritten: when it cannot be read or
    kept, or the original cannot be written, nothing changes and the error says so.
    """
    source = pristine_source(ex)
    path = ex.learner_path
    name = path.relative_to(ex.root).as_posix()
    try:
        current = path.read_bytes() if path.exists() else None
    except OSError as err:
        cannot = read_error(path, err, "your version", name)
        raise OomLabError(f"{cannot.what} It has to be kept before the reset.", f"Nothing was changed. {cannot.todo}") from None
    if current is not None and not os.access(path, os.W_OK):
        raise OomLabError(
            f"{name} is read-only, so the reset leaves it alone.",
            f"Nothing was changed. Make it writable (chmod u+w {name}), then reset again.",
        )
    backup = None
    if current is not None:
        if current == source.encode("utf-8"):
            return None
        folder = StateDir(ex.root).backups(ex.id)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        backup = folder / f"{stamp}-{ex.file}"
        n = 1
        while backup.exists():  # two resets within a second keep both versions
            n += 1
            backup = folder / f"{stamp}-{n}-{ex.file}"
        try:
            write_atomic(backup, current)
        except CannotWrite as err:
            raise OomLabError(
                f"Your version could not be kept before the reset. {err.what}",
                f"Nothing was changed: {name} is as you left it. {err.todo}",
            ) from None
    try:
        write_atomic(path, source)
    except CannotWrite as err:
        kept = f" (a copy is also kept at {backup.relative_to(ex.root).as_posix()})" if backup else ""
        raise OomLabError(
            f"The original could not be put back. {err.what}", f"{name} is as you left it{kept}. {err.todo}"
        ) from None
    return backup
