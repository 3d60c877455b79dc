"""What an out-of-memory error says, read in one place.

The caching allocator raises ``torch.cuda.OutOfMemoryError`` (a ``RuntimeError``
before torch 1.13) with a message such as::

    CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of
    139.81 GiB of which 137.9 GiB is free. Of the allocated memory 1.02 GiB is
    allocated by PyTorch, and 96.00 MiB is reserved by PyTorch but unallocated. ...
    1.12 GiB allowed; ...

"Tried to allocate" is what the allocator asked the driver for: on a cache miss
that is the whole segment (20 MiB for a request under 10 MiB), not the tensor.
"N allowed" appears when ``set_per_process_memory_fraction`` capped the process.
Both figures are rounded to two decimals by the allocator's formatting.

Standard library only: the probes import this inside the measured process.
"""

from __future__ import annotations

import re

from oomlab.units import quantity

_SIZE = r"([\d.]+) ?(bytes|B|KiB|MiB|GiB|TiB)"

__all__ = ["first_line", "is_oom", "parse_message"]


def is_oom(exc: BaseException | None) -> bool:
    """Whether ``exc`` is the allocator running out of memory (any torch version, any device)."""
    if exc is None:
        return False
    if type(exc).__name__ == "OutOfMemoryError":
        return True
    return "out of memory" in str(exc).lower()


def parse_message(message: str) -> dict:
    """``{"request": bytes or None, "allowed": bytes or None}`` out of an OOM message."""

    def grab(regex: str) -> int | None:
        match = re.search(regex, message or "")
        return quantity(match.group(1), match.group(2)) if match else None

    return {"request": grab(r"Tried to allocate " + _SIZE), "allowed": grab(_SIZE + r" allowed")}


def first_line(message: str, limit: int | None = 300) -> str:
    """The message's first line, cut at ``limit`` characters (None: whole): what a one-line report shows."""
    return ((message or "").splitlines() or [""])[0][:limit]
