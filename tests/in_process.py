"""``oomlab ARGS`` run through the command line's entry point in the test's own process, where a test needs what it
monkeypatched to reach the command (a faked measurement, a faked GPU): the entry point turns an error the user can act
on into one message and exit 2, as for a user. See :mod:`tests.forked_commands` for commands in processes of their own."""

from __future__ import annotations

import re

BOXES = re.compile(r"[│╭╮╰╯─━┃┏┓┗┛┡┩╇┳┻╋┣┫┯┷┼]+")


def oomlab(capsys, *args: str) -> tuple[int, str]:
    """The exit code, and stdout and stderr together with rich's boxes and line wrapping flattened into single spaces."""
    from oomlab.cli import main

    try:
        main(list(args))
        rc = 0
    except SystemExit as done:
        rc = done.code or 0
    captured = capsys.readouterr()
    out = " ".join(BOXES.sub(" ", captured.out + captured.err).split())
    assert "Traceback" not in out and "internal error" not in out, out
    return rc, out
