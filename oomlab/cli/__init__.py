"""``oomlab``: the command line.

- :mod:`~oomlab.cli.learner`: the learner's loop (overview, list, run, check, hint,
  watch, reset, solution, doctor, init);
- :mod:`~oomlab.cli.tools`: the workflow's tools on an exercise or any script
  (snapshot, hunt, profile, diagnose);
- :mod:`~oomlab.cli.dev`: maintainers' commands under ``oomlab dev`` (verify, figures);
- :mod:`~oomlab.cli.render`: how measurements and verdicts look in the terminal.

Exit codes: 0 done or passed, 1 the exercise does not pass yet (or the run
failed), 2 something to fix outside the exercise (a clear message says what),
3 a bug in oomlab itself (the traceback goes to .oomlab/last-error.txt).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import typer
from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from oomlab import __version__
from oomlab.errors import OomLabError

app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    help="OOM Lab: debug PyTorch GPU out-of-memory errors and allocator fragmentation, one graded exercise at a time.",
)
dev_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Maintainers' commands: check the course on a GPU and regenerate what the site shows.",
)
app.add_typer(dev_app, name="dev")
console = Console(highlight=False)

# The commands register themselves on `app` and `dev_app` when their modules load.
from oomlab.cli import dev, learner, tools  # noqa: E402

__all__ = ["__version__", "app", "console", "dev", "dev_app", "learner", "main", "tools"]


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error the user can act on becomes one message, never a traceback."""
    try:
        app(args=argv, prog_name="oomlab")
    except OomLabError as err:
        body = Text(err.what) + (Text("\n" + err.todo, style="bold") if err.todo else Text())
        console.print(Panel(body, border_style="red", title="oomlab", title_align="left"))
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("Interrupted.")
        sys.exit(130)
    except Exception as err:  # a bug in oomlab: keep the details, show one line
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
    except OSError:
        return ""
    return f" Details: {log}."
