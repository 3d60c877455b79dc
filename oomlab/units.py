"""Byte units, and the one way the course writes a byte count for people."""

from __future__ import annotations

MIB = 1 << 20
GIB = 1 << 30


def mib(n: float | None) -> str:
    """``1,234.5 MiB``; ``n/a`` when there is no figure."""
    return "n/a" if n is None else f"{n / MIB:,.1f} MiB"
