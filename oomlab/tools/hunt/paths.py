"""How the hunt writes where a tensor is held: one notation for the walk and the back search.

A path is the chain of references from a name to a tensor, written the way a
person would reach it in Python where that is possible
(``log.handlers[0].buffer[3].args[2]``, ``model.2._forward_hooks[7].__closure__['kept']``)
and said in words where it is not: an autograd hop (`` -> AddmmBackward0``), a
frame kept by a traceback (`` -> step() frame (train.py:12)``), a local of a
frame (`` local 'batch'``), an entry of a cache that Python keeps in C
(`` (functools.lru_cache)[2048]``). Frames are named by function, file and line.

Standard library only: the probe uses it inside the measured process.
"""

from __future__ import annotations

import re
import sys

__all__ = ["frame_locals", "func_name", "join_path", "key_label", "place", "reads_locals", "root_expr", "short_file"]

CO_OPTIMIZED = 0x0001  # inspect.CO_OPTIMIZED, without importing inspect into the learner's process


def root_expr(name: str) -> str:
    """The Python name inside a root's label: ``"f() local 'x' (a.py:3)"`` -> ``x``."""
    match = re.search(r"'([^']+)'", name)
    return match.group(1) if match else name


def key_label(key) -> str:
    """A dict key as an index: ``['loss']``, ``[3]``; a key of another type by its type, ``[<Tensor>]``."""
    if isinstance(key, (str, int, float, bool, type(None))):
        text = repr(key)
        return f"[{text[:40] + '…' if len(text) > 41 else text}]"
    return f"[<{type(key).__name__}>]"


def place(code, line) -> str:
    """``train.py:12``: a code object's file (shortened) and a line."""
    return f"{short_file(code.co_filename)}:{line}"


def short_file(filename: str) -> str:
    """An installed package's file from its package on (``torch/nn/modules/linear.py``); any other by its base name."""
    parts = filename.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    return parts[-1]


def func_name(code) -> str:
    """A code object's qualified name where Python has one (``Trainer.fit``)."""
    return getattr(code, "co_qualname", code.co_name)


def reads_locals(frame) -> bool:
    """A function's frame (``CO_OPTIMIZED``): its ``f_locals`` is a view of its variables.

    A module's frame has its globals there, and a class body or ``exec`` frame
    a real namespace that must never be touched.
    """
    return bool(frame.f_code.co_flags & CO_OPTIMIZED)


def frame_locals(frame) -> list:
    """``(name, value)`` of a frame's local variables, leaving nothing behind in the frame.

    Before Python 3.13, reading ``f_locals`` of a function's frame stores a
    dict snapshot in the frame, which would keep today's values alive after the
    function rebinds them (a suspended generator, a loop still running): the
    probe would change the memory it measures. So the snapshot is emptied
    again; the function's real variables are not in it.
    """
    namespace = frame.f_locals
    items = list(namespace.items())
    if sys.version_info < (3, 13) and reads_locals(frame) and isinstance(namespace, dict):
        namespace.clear()
    return items


def join_path(labels: list[str], keep_hops: int = 2) -> str:
    """Join edge labels into one path, shortening long runs of autograd node hops."""
    hops = [i for i, label in enumerate(labels) if re.fullmatch(r" -> \w*Backward\w*", label)]
    if len(hops) > 2 * keep_hops + 1:
        elided = hops[keep_hops:-keep_hops]
        labels = labels[: elided[0]] + [f" -> … {len(elided)} nodes …"] + labels[elided[-1] + 1 :]
    return "".join(labels).strip()
