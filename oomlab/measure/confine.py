"""What a graded run may read and write: the sandbox policy the parent hands the measuring child.

Hidden from the measured script (:class:`oomlab.measure.sandbox.Policy`):

- the **course folder** it belongs to: the reference fixes (``solutions/``), the
  cached reference measurements and the kept originals (``.oomlab/``), git's
  history (``.git``, which holds every committed solution), the site and its
  measurements; for a class, the whole class folder (other students'
  submissions, the pinned course, the gradebook);
- the **package's own copy** of the course (``oomlab/_course`` in a wheel, the
  checkout itself in an editable install);
- the harness's **files for this run** (the spec, the result, the weights) and
  the warm servers' sockets;
- pip's cache, where a built wheel of the course would hold the solutions.

Readable again inside those (the deepest entry decides): the script's own
folder, the ``oomlab`` package's code (its ``_course`` stays hidden), and
Python's installation and site-packages, wherever they live. Writable: the
run's private working folder (the script's current folder, ``TMPDIR`` and the
caches point there), ``/dev`` and ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import site
import sys
from pathlib import Path

from oomlab.measure.sandbox import Policy

__all__ = ["grading_policy"]

_PACKAGE = Path(__file__).resolve().parents[1]


def _python_folders() -> list[Path]:
    folders = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    with contextlib.suppress(AttributeError):  # a virtualenv's old site.py has no getsitepackages
        folders.update(Path(p) for p in site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        folders.add(Path(site.getusersitepackages()))
    return sorted(folders)


def _pip_cache() -> Path:
    return Path(os.environ.get("PIP_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pip")


def grading_policy(script: Path, run_dir: Path, work_dir: Path, course_root: Path | None, hide=()) -> Policy:
    """The policy for measuring ``script`` for a grade: ``run_dir`` holds the harness's files, ``work_dir`` (inside it) is the script's own.

    ``hide`` adds folders (a class's folder, Jupyter's runtime folder with the kernels' keys).
    """
    from oomlab.course.shipped import shipped_root
    from oomlab.measure.warm import sockets_folder

    hidden = [run_dir, _PACKAGE / "_course", _pip_cache(), *map(Path, hide)]
    if course_root is not None:
        hidden.append(course_root)
    if (shipped := shipped_root()) is not None:
        hidden.append(shipped)
    hidden.append(sockets_folder())
    hidden = [p.resolve() for p in hidden]
    visible = [script.resolve().parent, _PACKAGE, *_python_folders()]
    for entry in sys.path:  # where else this Python imports from, unless it lies inside a hidden folder
        path = Path(entry or ".").resolve()
        if path.is_dir() and not any(path == h or h in path.parents for h in hidden):
            visible.append(path)
    return Policy(
        hidden=tuple(map(str, hidden)),
        visible=tuple(dict.fromkeys(map(str, visible))),
        # /proc too: the CUDA driver names its threads by writing /proc/self/task/TID/comm and will not start
        # without it (seen on an H200). Another process's entries there need ptrace, which Landlock refuses.
        writable=(str(work_dir.resolve()), "/dev", "/proc"),
    )
