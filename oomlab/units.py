"""Byte sizes: the one way the course writes them for people, and the one way it reads them.

The course speaks MiB throughout (the allocator's segments are 2 and 20 MiB, and
budgets are a few GiB), so :func:`format_bytes` stays in MiB from 1 MiB up
instead of switching to GiB: two figures side by side always compare at a glance.
"""

from __future__ import annotations

import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

# Binary multiples, as torch and nvidia-smi mean them; a trailing "B" or "iB" changes nothing.
UNIT_BYTES = {
    "": 1,
    "b": 1,
    "bytes": 1,
    "k": KIB,
    "kb": KIB,
    "kib": KIB,
    "m": MIB,
    "mb": MIB,
    "mib": MIB,
    "g": GIB,
    "gb": GIB,
    "gib": GIB,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}

__all__ = ["GIB", "KIB", "MIB", "format_bytes", "in_mib", "parse_size", "quantity"]


def format_bytes(n: float | None) -> str:
    """``1,234.5 MiB``, ``16.0 KiB`` below a MiB, ``512 B`` below a KiB; ``n/a`` when there is no figure."""
    if n is None:
        return "n/a"
    if abs(n) >= MIB:
        return f"{n / MIB:,.1f} MiB"
    if abs(n) >= KIB:
        return f"{n / KIB:,.1f} KiB"
    return f"{n:,.0f} B"


def in_gib(n: float) -> str:
    """``5.62 GiB``: a budget or a free-memory need on its own, where nothing stands beside it to compare."""
    return f"{n / GIB:.2f} GiB"


def in_mib(n: float | None, digits: int = 1) -> str:
    """The number alone, for a table whose heading says MiB: ``1,234.5``; ``n/a`` when there is none."""
    return "n/a" if n is None else f"{n / MIB:,.{digits}f}"


def quantity(number: str, unit: str) -> int:
    """``("1.50", "GiB")`` as bytes, rounded to the nearest byte. Raises KeyError for an unknown unit."""
    return int(round(float(number) * UNIT_BYTES[unit.lower()]))


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"1.5g"``, ``"800MiB"`` or a number of bytes, as bytes.

    Raises ValueError, with the reason, for anything else: no number, an
    unknown unit, or a size that is not a positive whole number of bytes.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", text or "")
    if not match:
        raise ValueError(f"{text!r} is not a memory size")
    number, unit = match.groups()
    if unit.lower() not in UNIT_BYTES:
        raise ValueError(f"{text!r} has an unknown unit {unit!r}")
    if UNIT_BYTES[unit.lower()] == 1 and "." in number:
        raise ValueError(f"{text!r} is not a whole number of bytes (a unit such as GiB is missing?)")
    if len(number) > 30:
        raise ValueError(f"{text!r} is far larger than any GPU")
    size = quantity(number, unit)
    if size < 1:
        raise ValueError(f"{text!r} is less than one byte")
    return size
