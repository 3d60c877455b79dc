"""Whose code a stack frame is: the learner's script, the learner's other files, or a library.

Every tool names "the line in your script" for what it finds, so the test for
which frames are the learner's lives here, once. Standard library only: the
probes use it inside the measured process.
"""

from __future__ import annotations

import os
import traceback

_PACKAGE = os.path.dirname(os.path.abspath(__file__))  # oomlab itself: the harness and the probes
_LIBRARY_PARTS = ("site-packages", "dist-packages")

__all__ = ["failed_at", "is_library", "is_learner", "is_script", "portable"]


def is_script(filename: str | None, script: str | None) -> bool:
    """``filename`` is the script. A relative name (as profilers and snapshots from elsewhere give) matches by base name."""
    if not filename or not script:
        return False
    if os.path.isabs(filename):
        return os.path.normpath(filename) == os.path.normpath(os.path.abspath(script))
    return os.path.basename(filename) == os.path.basename(script)


def is_library(filename: str | None) -> bool:
    """Python's own files, installed packages, torch, frozen modules, C++ frames, and oomlab itself."""
    if not filename:
        return True
    path = filename.replace("\\", "/")
    if path.startswith("<") or not path.endswith(".py"):  # <frozen runpy>, <string>, C++ frames
        return True
    if path.startswith(("torch/", "oomlab/")):  # profilers shorten names relative to sys.path; shared files too
        return True
    parts = path.split("/")
    if any(p in parts for p in _LIBRARY_PARTS) or "/lib/python3" in path or "/torch/" in path:
        return True
    return os.path.isabs(filename) and os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def is_learner(filename: str | None, script: str | None) -> bool:
    """The script itself, or a file of the learner's beside it (a helper module); never a library or oomlab."""
    if is_script(filename, script):
        return True
    if not filename or is_library(filename) or not script or not os.path.isabs(filename):
        return False
    return os.path.abspath(filename).startswith(os.path.dirname(os.path.abspath(script)) + os.sep)


def failed_at(exc: BaseException, script: str) -> dict:
    """Where the exception last passed through the script: ``{"line_no", "line"}``, or ``{}``."""
    if isinstance(exc, SyntaxError) and is_script(exc.filename, script) and os.path.isabs(exc.filename or ""):
        return {"line_no": exc.lineno, "line": (exc.text or "").rstrip()}
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == os.path.abspath(script)]
    if not frames:
        return {}
    return {"line_no": frames[-1].lineno, "line": (frames[-1].line or "").strip()}


def portable(filename: str | None, root: str | None, labels: dict[str, str] | None = None) -> str | None:
    """A frame's file name with nothing of this machine in it, for files that are committed or shared.

    ``labels`` maps an absolute path to the name to show (a variant of an
    exercise run from ``.oomlab/variants/`` shows as ``exercises/ID/train.py``);
    a file under ``root`` becomes relative to it; an installed package's file
    keeps its path from ``site-packages`` on (``site-packages/torch/nn/modules/linear.py``,
    still recognisably a library's);
    oomlab's own files become ``oomlab/...``; anything else keeps its base name.
    Names that are not paths (``<frozen runpy>``, C++ frames) are kept as they are.
    """
    if not filename or not os.path.isabs(filename):
        return filename
    path = os.path.normpath(filename)
    if labels and path in labels:
        return labels[path]
    if root and path.startswith(os.path.normpath(os.path.abspath(root)) + os.sep):
        return os.path.relpath(path, root).replace(os.sep, "/")
    parts = path.split(os.sep)
    for marker in _LIBRARY_PARTS:
        if marker in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(marker) :])
    if path.startswith(_PACKAGE + os.sep):
        return "oomlab/" + os.path.relpath(path, _PACKAGE).replace(os.sep, "/")
    return os.path.basename(path)
