"""What a submission hands in beside its notebooks, and why none of it stays where the notebooks are graded.

nbgrader's autograde copies every file of ``submitted/STUDENT/ASSIGNMENT/`` into
``autograded/STUDENT/ASSIGNMENT/`` and runs each notebook's kernel there. None of
those files is graded: each exercise cell writes the script that is measured. But a
file there can be *imported*. A folder ``oomlab/classroom/cells.py`` beside the
notebooks would stand in for the grading helpers that the locked cells import (and
pass every check), and a ``traitlets/`` or ``zmq/`` folder for what the kernel imports
as it starts: Python and IPython both put the working folder on ``sys.path``.

:func:`clear` therefore empties the graded copy of everything that is neither the
assignment's (its notebooks, nbgrader's own :data:`NBGRADERS`) nor the instructor's (a
file of ``source/ASSIGNMENT/``, which nbgrader has just copied over as released).
The student's own copy under ``submitted/`` is never touched, so nothing is lost.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from oomlab.errors import OomLabError

__all__ = ["NBGRADERS", "clear"]

# What nbgrader's submit writes beside the notebooks, and release_feedback reads back from the graded copy:
# when it was submitted, and the secret that names the feedback.
NBGRADERS = frozenset({"timestamp.txt", "submission_secret.txt"})


def clear(folder: Path, keep: set[str]) -> list[str]:
    """Remove from ``folder`` every file and folder but the files ``keep`` names (paths relative to it, with ``/``).

    Returns what was removed, in order, a folder as ``NAME/``. A folder is entered only
    where it holds a file to keep; a link is removed as itself, never followed.
    """
    removed: list[str] = []
    _clear(Path(folder), "", keep, removed)
    return removed


def _clear(folder: Path, prefix: str, keep: set[str], removed: list[str]) -> None:
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        rel = prefix + entry.name
        try:
            if entry.is_dir() and not entry.is_symlink():
                if any(k.startswith(rel + "/") for k in keep):
                    _clear(entry, rel + "/", keep, removed)
                    continue
                shutil.rmtree(entry)
                removed.append(rel + "/")
            elif rel not in keep:
                entry.unlink()
                removed.append(rel)
        except OSError as err:  # left there, it could still be imported: grade nothing rather than risk it
            raise OomLabError(
                f"Could not remove {rel} from the graded copy {folder}: {err.strerror or err}.",
                "Make the autograded folder writable by the user who runs nbgrader, then autograde again.",
            ) from None
