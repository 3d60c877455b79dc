"""Each exercise as shipped (script and manifest), and ``reset``, which puts the script back without losing the learner's version.

The original of ``exercises/ID/FILE`` comes from, in order:

1. ``.oomlab/originals/ID/FILE``, written by ``oomlab init`` straight from the package,
   or, in a course's source (a checkout), at the first command run there (from
   git's committed file when there is one, so an edit made before that is not taken;
   without git the file as it is then, and a manifest once it loads);
2. the package's own copy, for a folder made by ``init`` whose ``.oomlab/`` was deleted.

The course inside the installed package is its own original. Never from git's HEAD at
the time of the reset: a learner who commits an edit would get the edit back.

The script's original is what ``reset`` restores; the manifest's
(:func:`original_manifest`) is what the learner's commands grade with, so that an
edited budget, tolerance, check or ``file`` in the learner's ``exercise.toml`` changes nothing.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from oomlab.course.manifest import MANIFEST, Exercise
from oomlab.course.shipped import is_bundled, is_source, shipped_root
from oomlab.course.state import CannotWrite, StateDir, read_error, shown, write_atomic
from oomlab.errors import OomLabError

__all__ = [
    "differs",
    "keep_manifest",
    "keep_originals",
    "manifest_note",
    "original_manifest",
    "pristine_source",
    "reset",
    "shipped_source",
]


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


def _found(root: Path, ex_id: str, file: str) -> Path | None:
    """Where the original of ``exercises/ex_id/file`` is already; None for a source that has not kept it yet."""
    working = root / "exercises" / ex_id / file
    if is_bundled(root):
        return working
    kept = StateDir(root).original(ex_id, file)
    if kept.is_file():
        return kept
    if is_source(root):
        return None
    shipped = shipped_root()
    if shipped is not None and (shipped / "exercises" / ex_id / file).is_file():
        return shipped / "exercises" / ex_id / file
    return working  # an exercise the package does not have: the learner's folder is all there is


def _committed(root: Path, rel: str) -> str | None:
    """The file ``rel`` (relative to ``root``) as git has it committed, in a source checkout; None elsewhere."""
    if not _in_a_repository(root):
        return None  # no git to ask: a learner's copy, a course unpacked from an archive
    try:
        return subprocess.run(["git", "show", f"HEAD:./{rel}"], cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def _in_a_repository(root: Path) -> bool:
    """Whether git could answer in ``root``: a ``.git`` in it or a folder above it, or a repository named by ``GIT_DIR``.

    Looked at before starting git, which otherwise runs (and fails) once per exercise each time a course is loaded.
    """
    if os.environ.get("GIT_DIR"):
        return True
    root = root.resolve()
    return any((folder / ".git").exists() for folder in (root, *root.parents))


def pristine_source(ex: Exercise) -> str:
    """The exercise as shipped, for ``reset`` and ``solution``."""
    kept = StateDir(ex.root).original(ex.id, ex.file)
    found = _found(ex.root, ex.id, ex.file)
    if found == kept:
        try:
            return kept.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise OomLabError(
                f"The kept original {shown(kept)} cannot be read: {getattr(err, 'strerror', None) or err}.",
                f"Delete it (oomlab keeps it again from {'git' if is_source(ex.root) else 'the package'}) "
                "or make it readable, then try again.",
            ) from None
    if found is not None:
        return shipped_source(ex)
    source = _committed(ex.root, ex.learner_path.relative_to(ex.root).as_posix())
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


def original_manifest(root: Path, ex_id: str) -> Path:
    """The manifest that grades exercise ``ex_id`` for a learner: the course's own, whatever ``exercises/ID/exercise.toml`` says.

    Found, or kept at first sight, as the module's docstring says. In a source without
    git the learner's copy, as it is at first sight, is the original: :func:`keep_manifest`
    keeps it once it loads, so that a manifest broken before then is not kept broken.
    """
    found = _found(root, ex_id, MANIFEST)
    if found is not None:
        return found
    mine = root / "exercises" / ex_id / MANIFEST
    committed = _committed(root, f"exercises/{ex_id}/{MANIFEST}")
    if committed is None:
        return mine
    kept = StateDir(root).original(ex_id, MANIFEST)
    try:
        write_atomic(kept, committed)  # first sight: from now on the course's own manifest is this copy
    except CannotWrite as err:
        if not differs(mine, committed):
            return mine  # nothing was edited: the learner's copy is the original
        raise OomLabError(
            f"exercises/{ex_id}/{MANIFEST} differs from the course's own, which cannot be kept to grade with. {err.what}",
            err.todo,
        ) from None
    return kept


def keep_manifest(root: Path, ex_id: str) -> None:
    """Keep the learner's manifest as the original, in a source without git that has kept none yet (see :func:`original_manifest`).

    Call it once the manifest has loaded; a read-only ``.oomlab/`` keeps nothing (the commands that must write say so).
    """
    if _found(root, ex_id, MANIFEST) is not None:
        return
    with contextlib.suppress(OSError, UnicodeDecodeError):  # CannotWrite is an OSError
        write_atomic(
            StateDir(root).original(ex_id, MANIFEST), (root / "exercises" / ex_id / MANIFEST).read_text(encoding="utf-8")
        )


def differs(mine: Path, original: Path | str) -> bool:
    """Whether the learner's ``mine`` differs from ``original`` (a file, or its text); a missing or unreadable one does.

    Both are read as text, so that a checkout's CRLF line endings are no edit.
    """
    try:
        text = original if isinstance(original, str) else original.read_text(encoding="utf-8")
        return mine.read_text(encoding="utf-8") != text
    except (OSError, UnicodeDecodeError):
        return True


def manifest_note(ex: Exercise) -> str:
    """One line for a learner whose ``exercise.toml`` differs from the manifest that was used; "" when it does not."""
    if not ex.manifest_edited:
        return ""
    used = ex.manifest_path.relative_to(ex.root).as_posix() if ex.manifest_path.is_relative_to(ex.root) else "the package's"
    what = (
        "the examples, tolerances and file come from the course, not from your copy (`oomlab run --config` counts a "
        "config of yours)"
        if ex.is_estimate
        else "the budget, checks, tolerances and file come from the course, not from your copy"
    )
    return (
        f"{ex.learner_manifest.relative_to(ex.root).as_posix()} differs from the course's own ({used}), which was used: {what}."
    )


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
