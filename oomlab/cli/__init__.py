"""``oomlab``: the command line.

- :mod:`~oomlab.cli.learner`: the learner's loop (overview, list, run, check, hint,
  watch, reset, solution, doctor, init);
- :mod:`~oomlab.cli.tools`: the workflow's tools on an exercise or any script
  (snapshot, hunt, profile, diagnose);
- :mod:`~oomlab.cli.dev`: maintainers' commands under ``oomlab dev`` (verify, figures, facts);
- :mod:`~oomlab.cli.nbgrader`: instructors' commands under ``oomlab nbgrader`` (build, autograde).

Exit codes: 0 done or passed, 1 the exercise does not pass yet (or the run
failed), 2 something to fix outside the exercise (a clear message says what),
3 a bug in oomlab itself (the traceback goes to .oomlab/last-error.txt).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import sys
import traceback
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text
from typer.core import TyperGroup

from oomlab import __version__
from oomlab.errors import OomLabError


def plain_help(param) -> None:
    """Show ``param`` in ``--help`` as ``TARGET...`` or ``--out FOLDER``, and a flag with no placeholder.

    Typer prints a type placeholder beside parameters (``--help <bool>`` and
    ``target... <list[str]>`` in 0.29, ``<str>`` and ``{target}`` in 0.27); the metavar set
    here, or none for a flag, replaces it. Each typer reads it through its own methods,
    so each is set: the ones a version lacks are never called.
    """
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        param.display_type_rich = lambda ctx=None: None
        return
    if getattr(param, "param_type_name", "") == "argument":
        name = (param.metavar or param.name or "").rstrip(".").upper()
        many = "..." if param.nargs != 1 else ""
        in_usage = name + many if param.required else f"[{name}]{many}"
        param.metavar = name + many
        param.display_type_rich = lambda ctx=None: None  # typer 0.29
        param._usage_display_name = lambda: in_usage
        param._rich_display_name = lambda: name + many
        param.make_metavar = lambda ctx=None, usage=False: in_usage if usage else name + many  # typer 0.27, click
        with contextlib.suppress(AttributeError, TypeError):  # typer 0.27 prints the type's metavar beside it
            quiet = copy.copy(param.type)
            quiet.get_metavar = lambda *args, **kwargs: ""
            param.type = quiet
        return
    if param.metavar is None:
        param.metavar = (param.name or "value").upper()


class PlainHelpGroup(TyperGroup):
    """The command groups (``oomlab``, ``oomlab dev``): every parameter shown plainly in ``--help``."""

    def get_params(self, ctx):
        params = super().get_params(ctx)
        for param in params:
            plain_help(param)
        return params

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            for param in command.get_params(ctx):
                plain_help(param)
        return command


app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    help="OOM Lab: debug PyTorch GPU out-of-memory errors and allocator fragmentation, one graded exercise at a time.",
)
dev_app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Maintainers' commands: check the course on a GPU and regenerate what the site shows.",
)
nbgrader_app = typer.Typer(
    cls=PlainHelpGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Instructors' commands: the course as nbgrader assignments, autograded on a GPU, a whole class at once.",
)
app.add_typer(dev_app, name="dev")
app.add_typer(nbgrader_app, name="nbgrader")
console = Console(highlight=False)

# The commands register themselves on `app` and `dev_app` when their modules load.
from oomlab.cli import dev, learner, nbgrader, tools  # noqa: E402

__all__ = ["__version__", "app", "console", "dev", "dev_app", "learner", "main", "nbgrader", "nbgrader_app", "tools"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error the user can act on becomes one message, never a traceback."""
    try:
        app(args=argv, prog_name="oomlab")
    except OomLabError as err:
        report(err)
        sys.exit(2)
    except OSError as err:  # the machine, not oomlab: no permission, a full disk, a name too long
        if err.errno not in USER_FIXABLE:
            internal_error(err)
        from oomlab.course.state import write_error

        report(write_error(err.filename or "a file", err, "use"))
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("Interrupted.")
        sys.exit(130)
    except Exception as err:  # a bug in oomlab: keep the details, show one line
        internal_error(err)


# Errors of the machine that the user can set right; any other OSError is a bug in oomlab.
USER_FIXABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.ENAMETOOLONG, getattr(errno, "EDQUOT", errno.ENOSPC)}


def report(err: OomLabError) -> None:
    """One message: what happened, and what to do."""
    body = Text(err.what) + (Text("\n" + err.todo, style="bold") if err.todo else Text())
    console.print(Panel(body, border_style="red", title="oomlab", title_align="left"))


def internal_error(err: BaseException) -> None:
    """A bug in oomlab: keep the traceback, show one line, exit 3."""
    console.print(
        Text(f"oomlab hit an internal error: {type(err).__name__}: {err}.{keep_traceback()} Please report it.", style="red")
    )
    sys.exit(3)


def keep_traceback() -> str:
    """Write the current traceback to the course's (or this folder's) .oomlab/last-error.txt; say where."""
    from oomlab.course import find_root
    from oomlab.course.state import StateDir, write_atomic

    try:
        root = find_root()
    except Exception:  # no course folder here: keep it beside the user
        root = Path.cwd()
    log = StateDir(root).last_error
    try:
        write_atomic(log, traceback.format_exc())
    except OSError:  # CannotWrite too: nowhere to keep it
        return ""
    return f" Details: {log}."
