"""Everything oomlab writes into a course folder, under ``.oomlab/``: each place named once.

The learner's own files (``exercises/``) are never written here except by
``oomlab reset``, which keeps a backup first. What lives under ``.oomlab/``:

==========================  ====================================================
``state.json``              progress: which exercises passed, hints shown
``originals/ID/FILE``       each exercise as shipped: its script for ``reset``, its manifest to grade with
``backups/ID/``             the learner's versions that ``reset`` replaced
``reference/``              the reference fix's measurement, per GPU and torch
``variants/ID/NAME/FILE``   scripts the truth check measures (bug, wrong fixes, cheats)
``runs/LABEL-TOOL/``        what ``snapshot``, ``hunt``, ``profile`` wrote
``figures/ID/VARIANT/``     the runs behind the site's pictures
``last-error.txt``          the traceback of an internal error, to report
==========================  ====================================================

Every write goes through :func:`write_atomic` or :func:`make_folder`: a folder
that cannot be written, a full disk or a path too long becomes one
:class:`CannotWrite` that names the path and the fix, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from oomlab.errors import OomLabError

__all__ = [
    "NAME",
    "CannotWrite",
    "StateDir",
    "make_folder",
    "read_error",
    "remove_empty_folders",
    "require_readable",
    "shown",
    "write_atomic",
    "write_error",
]

NAME = ".oomlab"


def relpath(path: str | Path, root: Path) -> str:
    """``path`` relative to ``root`` where it lies inside it, as given where it does not."""
    try:
        return str(Path(path).resolve().relative_to(root))
    except ValueError:
        return str(path)


def shown(path: str | Path, limit: int = 120) -> str:
    """A path (or any argument) as a message shows it: whole up to ``limit`` characters, else its two ends."""
    text = str(path)
    if len(text) <= limit:
        return text
    return f"{text[: limit // 2]}…{text[-(limit // 2 - 1) :]} ({len(text):,} characters)"


class CannotWrite(OomLabError, OSError):
    """A write the user can make possible: what could not be written, and how to allow it.

    Also an OSError, so that code written to catch a failed write still does.
    """

    def __init__(self, what: str, todo: str = "", code: int | None = None):
        OomLabError.__init__(self, what, todo)
        self.errno = code


def _nearest_existing(path: Path) -> Path:
    for folder in (path, *path.parents):
        try:
            if folder.exists():
                return folder
        except OSError:
            continue
    return path


def _todo(path: Path, err: OSError) -> str:
    code = err.errno
    if code == errno.EROFS:  # no permission bit helps on a filesystem mounted read-only
        return "The filesystem there is read-only: work in a folder on a writable disk (oomlab init makes one), then try again."
    if code in (errno.EACCES, errno.EPERM):
        where = _nearest_existing(path.parent)
        return f"Make sure you may write in {shown(where)} (for example: chmod u+w {shown(where)}), then try again."
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return "The disk is full: free some space, then try again."
    if code == errno.ENAMETOOLONG:
        return "The path is too long: use a shorter one."
    if code in (errno.ENOTDIR, errno.EEXIST):
        return "A file stands where a folder is needed: move it away, or name another folder."
    if code == errno.EISDIR:
        return "A folder stands where a file is needed: move it away, then try again."
    if code == errno.ENOENT:
        return "A folder on the way does not exist and cannot be made there: name a folder you can write to."
    return "Check that you may write there, then try again."


def write_error(path: str | Path, err: OSError, doing: str = "write") -> CannotWrite:
    """The clear error for a failed write of ``path``."""
    return CannotWrite(f"Cannot {doing} {shown(path)}: {err.strerror or err}.", _todo(Path(path), err), err.errno)


def read_error(path: str | Path, err: OSError, what: str = "", name: str | None = None) -> OomLabError:
    """The clear error for a failed read of ``path`` (``what`` says what the file is; ``name`` how to show it)."""
    name = shown(name or path)
    todo = "Check that the file is there and that you may read it"
    if err.errno in (errno.EACCES, errno.EPERM):
        todo = f"Make it readable (chmod u+r {name})"
    elif err.errno == errno.ENAMETOOLONG:
        todo = "The path is too long: use a shorter one"
    elif err.errno == errno.EISDIR:
        todo = "It is a folder: name the file inside it"
    return OomLabError(f"Cannot read {what + ' ' if what else ''}{name}: {err.strerror or err}.", todo + ".")


def require_readable(path: Path, what: str = "", name: str | None = None) -> None:
    """Raise the clear error when ``path`` exists but cannot be read; a missing file is left to the caller."""
    try:
        with open(path, "rb") as f:
            f.read(1)
    except FileNotFoundError:
        return
    except OSError as err:
        raise read_error(path, err, what, name) from None


def read_json_object(path: Path) -> dict | None:
    """The JSON object in the file at ``path``, or None where there is none: missing, unreadable, not JSON, or JSON
    that is not an object (a report another process was writing, or never wrote)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write so that a reader sees the old file or the new one, never half of one.

    Raises :class:`CannotWrite` (naming the path and the fix) when it cannot; the old file is then untouched.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, err) from None


def make_folder(path: Path) -> list[Path]:
    """Make ``path`` and the folders above it that are missing; return those it made, deepest first.

    Raises :class:`CannotWrite` when it cannot; a folder that is there already is fine.
    """
    path = Path(path)
    made = []
    for folder in (path, *path.parents):
        try:
            if folder.exists():
                break
        except OSError:
            break  # mkdir below says what is wrong
        made.append(folder)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        remove_empty_folders(made)
        raise write_error(path, err, "make the folder") from None
    return made


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each of ``folders`` (deepest first) that is empty; stop at the first that is not."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            return


@dataclass(frozen=True)
class StateDir:
    """The ``.oomlab/`` folder of the course at ``root``."""

    root: Path

    @property
    def path(self) -> Path:
        return self.root / NAME

    @property
    def progress_file(self) -> Path:
        return self.path / "state.json"

    @property
    def last_error(self) -> Path:
        return self.path / "last-error.txt"

    @property
    def references(self) -> Path:
        return self.path / "reference"

    def original(self, ex_id: str, file: str) -> Path:
        return self.path / "originals" / ex_id / file

    def backups(self, ex_id: str) -> Path:
        return self.path / "backups" / ex_id

    def variant(self, ex_id: str, name: str, file: str) -> Path:
        return self.path / "variants" / ex_id / name / file

    def run(self, label: str) -> Path:
        return self.path / "runs" / label

    def figure_run(self, ex_id: str, variant: str) -> Path:
        return self.path / "figures" / ex_id / variant
