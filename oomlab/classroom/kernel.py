"""The grading kernel: nbgrader's ``Execute``, with a kernel that can import nothing from the submission's folder.

nbgrader runs each notebook in its submission's folder (``autograded/STUDENT/ASSIGNMENT/``),
and a kernel started there has that folder on ``sys.path`` twice: ``python -m
ipykernel_launcher`` puts the folder it starts in first, and IPython adds ``''`` (the
folder it is in at each import) before ``site-packages``. A module there would then be
imported instead of the installed one: ``traitlets`` or ``zmq`` while the kernel
starts, ``oomlab`` when a locked cell asks for the grading helpers, ``rich`` when they
print.

:mod:`oomlab.classroom.handin` empties the folder before the kernel starts. This is
the second line, for what that cannot see: a file that appears in the folder while the
notebook is graded (the measured script runs there, in plain ``nbgrader autograde``),
a configuration that leaves our preprocessor out, a later nbgrader that copies more.
:class:`GradingKernel` starts the kernel in an empty folder of its own, so whatever the
interpreter and IPython put on ``sys.path`` for the folder they start in names that
empty folder; its first line, before any cell, takes those entries off ``sys.path`` and
moves into the notebook's folder, where the cells read and write their files. Nothing
depends on the Python version (``PYTHONSAFEPATH`` would need 3.11) or on the kernel's
command line, and the environment is nbgrader's own, so the runs the cells measure see
the same one as ``oomlab check``.

``oomlab nbgrader build`` puts it in ``Autograde.autograde_preprocessors`` in place of
nbgrader's ``Execute``; every ``Execute`` setting (timeouts, the shutdown) still applies.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager

from nbgrader.preprocessors import Execute

__all__ = ["GradingKernel", "enter_line"]

EXEC_LINES = "--IPKernelApp.exec_lines="
FIRST = "import os as _os, sys as _sys; "


def enter_line(start: str, notebook: str) -> str:
    """The kernel's first line: no folder it started in on ``sys.path`` (``''`` and ``'.'`` mean the current one), then into the notebook's."""
    return (
        f"{FIRST}_sys.path[:] = [_p for _p in _sys.path if _p not in ('', '.', {start!r})]; "
        f"_os.chdir({notebook!r}); del _os, _sys"
    )


class GradingKernel(Execute):
    """nbgrader's ``Execute``, with the kernel started as the module's docstring says."""

    @contextmanager
    def setup_kernel(self, **kwargs):
        notebook = os.path.abspath(kwargs.pop("cwd", None) or self.resources.get("metadata", {}).get("path") or os.curdir)
        with tempfile.TemporaryDirectory(prefix="oomlab-kernel-start-") as start:
            start = os.path.realpath(start)  # as the interpreter names it on sys.path
            line = EXEC_LINES + enter_line(start, notebook)
            # an instructor's own exec_lines run too, before ours; one of ours from an earlier start goes
            self.extra_arguments = [a for a in self.extra_arguments if not a.startswith(EXEC_LINES + FIRST)] + [line]
            with super().setup_kernel(cwd=start, **kwargs):
                yield
