"""Count a step's bytes on the CPU, where no caching allocator keeps figures: every tensor followed from birth to death.

:class:`LiveBytes` is a ``TorchDispatchMode``: every operator's result passes
through it, and it notes each new storage (views of one storage are one) with
its size, and a weak reference whose callback takes the size off again when the
storage is freed (torch keeps one Python object per live storage, so the
callback fires when the memory goes, not when a wrapper does). What it reads
is what the caching allocator's ``requested_bytes`` would read for the same
tensors (the grade's measure), less what libraries allocate around the operators (cuBLAS's workspace, a fused kernel's
scratch): a cross-check of an estimate's arithmetic, not a measurement of a GPU.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveBytes"]


class LiveBytes(TorchDispatchMode):
    """Inside ``with LiveBytes() as live``: ``live.allocated()``, ``live.peak()``, ``live.reset_peak()``, in bytes."""

    def __init__(self):
        super().__init__()
        self._refs: dict[int, weakref.ref] = {}
        self._now = 0
        self._peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.adopt(t)
        return out

    def adopt(self, tensor: torch.Tensor) -> None:
        """Count ``tensor``'s storage from now until it is freed (once, however many tensors view it)."""
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._refs or storage.nbytes() == 0:
            return
        size = storage.nbytes()

        def freed(_ref, key=key, size=size):
            self._refs.pop(key, None)
            self._now -= size

        self._refs[key] = weakref.ref(storage, freed)
        self._now += size
        self._peak = max(self._peak, self._now)

    def allocated(self) -> int:
        return self._now

    def peak(self) -> int:
        return self._peak

    def reset_peak(self) -> None:
        self._peak = self._now
