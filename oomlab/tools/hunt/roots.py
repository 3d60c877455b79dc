"""Where the walk starts: the named roots, and how each is named.

A root is a name a person wrote and can look up: a local of one of the
script's frames (``"evaluate() local 'losses' (train.py:40)"``, with the line
the frame was at), a global of the script or of a helper module beside it
(``"global 'cache' (helpers.py)"``), torch's global module hooks, the exception
that was being handled when the script failed. The walk
(:mod:`~oomlab.tools.hunt.walk`) credits every storage it finds to one of
them, so the names here are the names the hunt's verdict blames.

Two moments give roots. :func:`roots_from` reads them from the traceback of
the exception that ended the script (or from its globals when it finished):
the frames from the script's first one down to where it raised, and below
them the library frames of the call in progress, which are set apart as "in
flight" (the walk walks them last, and the graph they hold is the step's own,
see :mod:`~oomlab.tools.hunt.inflight`). :func:`roots_from_stack` reads them
from a live stack mid-run, for the baseline taken after an optimizer step.

Which frames are the learner's is :mod:`oomlab.frames`'s to say; how a name is
written is :mod:`~oomlab.tools.hunt.paths`'s. Standard library only: the probe
builds the roots inside the measured process.
"""

from __future__ import annotations

import os
import sys
import types

from oomlab.frames import is_learner, is_script
from oomlab.tools.hunt.paths import frame_locals, func_name, place, reads_locals, short_file

__all__ = ["CONTEXT_ROOT", "Roots", "roots_from", "roots_from_stack"]

# The one root's name that the verdict reads: an exception kept as the context of another (an OOM-retry loop).
CONTEXT_ROOT = "exception 'exc.__context__' being handled when the script failed"


class Roots(dict):
    """``{name: object}`` starting points, plus which names are frames of the call that was running.

    ``in_flight`` names the locals of library frames below the script's own
    frames when it failed (``Linear.forward() local 'input'``): the operation in
    progress, not something kept from earlier.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.in_flight: set[str] = set()


def _global_roots(namespace: dict, suffix: str = "") -> dict:
    """A module namespace's names as roots, ``"global 'x'"`` (``suffix`` names the module where it is not the script).

    Python's own dunder names, modules and classes from elsewhere are left out:
    they are library code, and only the script's own classes can hold its state.
    """
    roots = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") and name.endswith("__"):
            continue
        if isinstance(value, types.ModuleType) or (isinstance(value, type) and value.__module__ != "__main__"):
            continue
        roots[f"global {name!r}{suffix}"] = value
    return roots


def _frame_roots(frames: list, script_path, *, library: bool = True) -> tuple[dict, dict, dict]:
    """Locals of learner frames (innermost first), their globals, and the in-flight library frames' locals.

    ``frames`` is outermost first, as ``(frame, line)``. Everything below the
    first learner frame is the call in progress: library frames there are
    "in flight" (read only with ``library=True``).
    """
    script = os.fspath(script_path)
    first = next((i for i, (f, _) in enumerate(frames) if is_learner(f.f_code.co_filename, script)), None)
    if first is None:
        return {}, {}, {}
    locals_, globals_, in_flight, in_flight_names = {}, {}, {}, set()
    main_globals = None
    for frame, line in reversed(frames[first:]):
        code = frame.f_code
        learner = is_learner(code.co_filename, script)
        if learner and is_script(code.co_filename, script):
            main_globals = frame.f_globals
        if not reads_locals(frame) or not (learner or library):
            continue
        where = place(code, line)
        for name, value in frame_locals(frame):
            root = f"{func_name(code)}() local {name!r} ({where})"
            if learner:
                locals_[root] = value
            else:
                in_flight[root] = value
                in_flight_names.add(root)
    if main_globals is not None:
        globals_.update(_global_roots(main_globals))
    for frame, _ in frames[first:]:  # helper modules next to the script
        if is_learner(frame.f_code.co_filename, script) and frame.f_globals is not main_globals:
            for name, value in _global_roots(frame.f_globals, f" ({short_file(frame.f_code.co_filename)})").items():
                globals_.setdefault(name, value)
    return locals_, globals_, {"library": in_flight, "in_flight": in_flight_names}


def _hook_roots() -> dict:
    """``torch.nn.modules.module``'s global hook dicts: hooks registered for every module."""
    module = sys.modules.get("torch.nn.modules.module")
    roots = {}
    for name, value in sorted(vars(module).items()) if module else ():
        if name.startswith("_global_") and name.endswith("hooks") and isinstance(value, dict) and value:
            roots[f"torch.nn global hooks {name!r}"] = value
    return roots


def _assemble(locals_, globals_, extra, script_globals=None, exc=None) -> Roots:
    """The roots in the order that settles ties: the walk credits a storage two roots reach as soon to the earlier.

    So the frames' locals come first (the nearest name a person wrote), then
    the script's globals, the in-flight library frames (walked last anyway),
    torch's global hooks, and the exceptions kept beside the one that ended the run.
    """
    roots = Roots(locals_)
    if script_globals is not None:
        roots.update({k: v for k, v in _global_roots(script_globals).items() if k not in roots})
    for name, value in globals_.items():
        roots.setdefault(name, value)
    for name, value in extra.get("library", {}).items():
        roots.setdefault(name, value)
    roots.in_flight = set(extra.get("in_flight", ()))
    roots.update(_hook_roots())
    # An exception raised while handling another (an OOM-retry loop) keeps the first one as its
    # context, and the first one's traceback keeps the frames of the failed attempt, batch and all.
    context = exc.__context__ if exc is not None else None
    if context is not None:
        roots[CONTEXT_ROOT] = context
    last = getattr(sys, "last_value", None)
    if last is not None and last is not exc:
        roots["sys.last_value"] = last
    return roots


def roots_from(exc: BaseException | None, script_globals: dict | None, script_path) -> Roots:
    """Named starting points for the walk when the script stopped.

    From ``exc``'s traceback: the locals of every frame from the script's first
    frame down to where it raised, named ``"evaluate() local 'losses'
    (train.py:40)"`` with the line each frame was at (library frames below the
    script are listed in ``.in_flight``); the script's globals, named ``"global
    'x'"`` (from ``script_globals`` if given, else from the frames); torch's
    global module hooks; the exception that was being handled when ``exc`` was
    raised (``exc.__context__``: an OOM-retry loop's first failure, whose
    traceback keeps the failed attempt's frames); and ``sys.last_value`` when
    it is another exception.
    """
    frames = []
    tb = exc.__traceback__ if exc is not None else None
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    locals_, globals_, extra = _frame_roots(frames, script_path) if frames else ({}, {}, {})
    return _assemble(locals_, globals_, extra or {}, script_globals, exc)


def roots_from_stack(frame, script_path) -> Roots:
    """Named starting points from a live stack (``sys._getframe()``), for a baseline taken mid-run.

    Only the script's frames and globals: the library frames on the stack then
    are the optimizer's own step.
    """
    frames = []
    while frame is not None:
        frames.append((frame, frame.f_lineno))
        frame = frame.f_back
    frames.reverse()
    locals_, globals_, _ = _frame_roots(frames, script_path, library=False)
    return _assemble(locals_, globals_, {})
