"""Model and optimizer state: the tensors that are the work itself, never a culprit.

A model's parameters and buffers, their gradients and an optimizer's moments
are supposed to stay on the device from one step to the next: that is what
training is. The hunt must count them (they are part of what fills the
device) without ever blaming them. So before the walk starts,
:func:`model_state_ids` collects their ids from the roots, and the walk
(:mod:`~oomlab.tools.hunt.walk`) counts the storage of each as state, and that
of any other ``nn.Parameter`` and of a parameter's gradient too: in a
holder's ``state_bytes``, not as bytes of its own. A holder that holds nothing
else carries the label :data:`STATE`, which the verdict
(:mod:`~oomlab.tools.hunt.analysis`) and the table
(:mod:`~oomlab.tools.hunt.present`) read.

This is more than "everything an optimizer holds": an optimizer can outlive
the modules it was made for, and its parameters that no module holds are set
apart as *orphans* (see :func:`model_state_ids`), which the walk counts as the
leak they are.

Standard library only at import, like the walk: torch is handed in.
"""

from __future__ import annotations

import collections
import sys

from oomlab.tools.hunt.walk import LEAVES

__all__ = ["STATE", "model_state_ids"]

# The label of a holder that holds only model/optimizer state; the verdict and the table read it.
STATE = "model/optimizer state"


class _IdSet(set):
    """A set of ``id()`` values that also keeps the objects alive, so no id can be reused by another object.

    The walk tests membership by ``id()`` long after the set was made; were a
    tensor freed in between, another object could take its id and pass for state.
    """

    def __init__(self):
        super().__init__()
        self.keep: list = []

    def add_object(self, obj) -> None:
        if id(obj) not in self:
            self.add(id(obj))
            self.keep.append(obj)


def model_state_ids(objs, torch=None) -> set:
    """``id()`` of parameters, their gradients, buffers and optimizer state among ``objs``.

    Modules and ``torch.optim.Optimizer`` instances are found in ``objs``, in
    containers and in object attributes a few levels down. The returned set
    keeps the tensors alive, so the ids stay theirs while it lives. ``torch``
    is as for :func:`~oomlab.tools.hunt.holders.find_holders`.

    An optimizer can outlive the modules it was made for: a head replaced by a
    new one, with the new head's parameters added as another param group,
    leaves the old head's parameters and their moments in the optimizer,
    trained by nothing. So where modules were found, an ``nn.Parameter`` of an
    optimizer that none of them holds is not model state: its id goes into the
    set's ``orphans`` (kept alive too), and neither it nor its optimizer state
    goes into the set. A tensor that is not an ``nn.Parameter`` (``opt =
    SGD([w])`` on a bare tensor) has no module to belong to, so it is state.
    """
    ids = _IdSet()
    ids.orphans = _IdSet()
    torch = torch or sys.modules.get("torch")
    if torch is None:
        return ids
    seen: set[int] = set()
    stack = [(obj, 0) for obj in objs]
    module_params: set[int] = set()
    optimizers = []

    def add_param(p):
        ids.add_object(p)
        if getattr(p, "grad", None) is not None:
            ids.add_object(p.grad)

    # Models and optimizers sit near a name (a global, an attribute of a trainer): a few levels suffice.
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or isinstance(obj, LEAVES):
            continue
        seen.add(id(obj))
        try:
            if isinstance(obj, torch.nn.Module):
                for p in obj.parameters():
                    module_params.add(id(p))
                    add_param(p)
                for b in obj.buffers():
                    ids.add_object(b)
                continue
            if isinstance(obj, torch.optim.Optimizer):
                optimizers.append(obj)
                continue
            if depth >= 4 or isinstance(obj, torch.Tensor):
                continue
            if isinstance(obj, dict):
                stack.extend((v, depth + 1) for v in list(dict.values(obj)))
            elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
                stack.extend((v, depth + 1) for v in list(obj))
            else:
                namespace = object.__getattribute__(obj, "__dict__")
                if isinstance(namespace, dict):
                    stack.extend((v, depth + 1) for v in list(dict.values(namespace)))
        except Exception:
            continue
    # Optimizers last: which of their parameters are orphans depends on every module found.
    for optimizer in optimizers:
        try:
            _optimizer_state(optimizer, torch, ids, add_param, module_params)
        except Exception:
            continue
    return ids


def _optimizer_state(optimizer, torch, ids: _IdSet, add_param, module_params: set[int]) -> None:
    """Add ``optimizer``'s parameters and their state to ``ids``, its orphaned parameters to ``ids.orphans``."""

    def orphaned(p) -> bool:
        return bool(module_params) and isinstance(p, torch.nn.Parameter) and id(p) not in module_params

    for group in optimizer.param_groups:
        for p in group["params"]:
            if orphaned(p):
                ids.orphans.add_object(p)
            else:
                add_param(p)
    for p, state in list(optimizer.state.items()):
        if orphaned(p):
            continue
        pending = list(state.values()) if isinstance(state, dict) else [state]
        while pending:
            value = pending.pop()
            if isinstance(value, torch.Tensor):
                ids.add_object(value)
            elif isinstance(value, (list, tuple)):
                pending.extend(value)
            elif isinstance(value, dict):
                pending.extend(value.values())
