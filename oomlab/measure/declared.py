"""The allocator settings a script sets for itself, read from its source without running it.

A training script chooses its allocator settings the only way that works: it
sets ``PYTORCH_CUDA_ALLOC_CONF`` before CUDA starts, at the top of the file::

    import os
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

The measuring child has set up CUDA (and so the allocator) before the script's
first line runs, so the harness reads that line here and starts the run with
it, as ``python train.py`` would. Only a literal assignment (or ``setdefault``)
at module level counts, after nothing but imports and assignments that call
nothing (``device = "cuda"``): after a call, CUDA may have started already.
Standard library only.
"""

from __future__ import annotations

import ast

from oomlab.measure.stats import ALLOC_CONF_VARS

__all__ = ["declared_alloc_conf"]


def declared_alloc_conf(source: str) -> str | None:
    """The allocator setting ``source`` sets before CUDA could start, or None where it sets none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found = None
    for i, node in enumerate(tree.body):
        if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        value = _setting(node)
        if value is not None:
            found = value
        elif any(isinstance(n, ast.Call) for n in ast.walk(node)):
            break  # a call may start CUDA: a later setting comes too late
        # else a plain assignment (device = "cuda"): it starts nothing, and a later setting still counts
    return found


def _setting(node: ast.stmt) -> str | None:
    """The value of ``os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "..."`` or ``os.environ.setdefault(...)``."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Subscript) and _is_environ(target.value):
            key = target.slice
            if _literal(key) in ALLOC_CONF_VARS and _literal(node.value) is not None:
                return _literal(node.value)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        call = node.value
        func = call.func
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "setdefault"
            and _is_environ(func.value)
            and len(call.args) == 2
            and _literal(call.args[0]) in ALLOC_CONF_VARS
        ):
            return _literal(call.args[1])
    return None


def _is_environ(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    )


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
