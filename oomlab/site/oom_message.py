"""A recorded out-of-memory message, as a learner running alone meets it, and taken apart clause by clause.

PyTorch builds the message in ``malloc`` of ``c10/cuda/CUDACachingAllocator.cpp``
from the figures it had when the request failed. Each clause is one of them:

- *Tried to allocate*: the size the allocator asked for, rounded to a segment on a cache miss;
- *GPU N has a total capacity of T of which F is free*: the driver's ``cudaMemGetInfo``,
  for the whole device, every process included;
- *Process P has U memory in use* (other processes) and *Including non-PyTorch memory,
  this process has U memory in use* (this one): the driver's per-process figures (NVML),
  which count the CUDA context and every library's memory, not only the allocator's;
- *C allowed*: the cap, when ``set_per_process_memory_fraction`` set one;
- *Of the allocated memory A is allocated by PyTorch, and R is reserved by PyTorch but
  unallocated*: live blocks, and the cache: A + R is what the allocator reserved;
- the advice to try ``expandable_segments``, and the link to the documentation.

:func:`clauses` finds them in a message; :func:`annotated` writes the Markdown that
explains each, with the arithmetic the figures allow (all rounded by the allocator
to two decimals, so the sums are "about").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from oomlab.oom import _SIZE  # the size as the allocator writes it; oom.py is part of what verify.json fingerprints
from oomlab.units import format_bytes, quantity

__all__ = ["Clause", "annotated", "clauses", "learner_view"]

_OTHER_PROCESS = re.compile(r"\bProcess \d+ has [\d.]+ [KMGT]?i?B memory in use\.")


def learner_view(message: str) -> tuple[str, int]:
    """The message as a learner running alone meets it, and how many other processes' lines were left out.

    The driver's part of the message lists every process holding memory on the GPU: others as *Process N has ...*,
    the failing one as *Including non-PyTorch memory, this process has ...*; verify runs many exercises at once.
    """
    shown, others = _OTHER_PROCESS.subn("", message)
    return " ".join(shown.split()), others


@dataclass(frozen=True)
class Clause:
    kind: str
    text: str
    sizes: tuple[int, ...]  # the clause's figures, in bytes, in the order it states them
    said: tuple[str, ...]  # the same figures as the message words them: "1.31 GiB"


# (kind, pattern): in the order the allocator writes them. A size is "12.00 MiB" or "1024 bytes".
_CLAUSES = [
    ("request", rf"Tried to allocate {_SIZE}\."),
    ("device", rf"GPU \d+ has a total capacity of {_SIZE} of which {_SIZE} is free\."),
    ("process", rf"Including non-PyTorch memory, this process has {_SIZE} memory in use\."),
    ("allowed", rf"{_SIZE} allowed;"),
    ("split", rf"Of the allocated memory {_SIZE} is allocated by PyTorch, and {_SIZE} is reserved by PyTorch but unallocated\."),
    ("advice", r"If reserved but unallocated memory is large try setting \S+ to avoid fragmentation\."),
]


def clauses(message: str) -> list[Clause]:
    """The clauses of the message that :data:`_CLAUSES` knows, in the message's order."""
    found = []
    for kind, pattern in _CLAUSES:
        match = re.search(pattern, message)
        if match:
            groups = match.groups()
            pairs = [(groups[i], groups[i + 1]) for i in range(0, len(groups), 2)]
            sizes = tuple(quantity(number, unit) for number, unit in pairs)
            said = tuple(f"{number} {unit}" for number, unit in pairs)
            found.append((match.start(), Clause(kind, match.group(0), sizes, said)))
    return [clause for _, clause in sorted(found, key=lambda pair: pair[0])]


def _about(n: int) -> str:
    return "about " + format_bytes(n)


def annotated(message: str, links: dict[str, str]) -> list[str]:
    """Markdown lines: each clause of the message quoted, with what it means and what its figures add up to.

    ``links`` maps ``"sizes"``, ``"fraction"`` and ``"expandable"`` to the pages (relative links) that explain them.
    """
    found = {c.kind: c for c in clauses(message)}
    lines: list[str] = []

    def say(kind: str, meaning: str) -> None:
        if kind in found:
            lines.extend([f"`{found[kind].text}`", f":   {meaning}", ""])

    request = found["request"].sizes[0] if "request" in found else None
    reserved = sum(found["split"].sizes) if "split" in found else None
    say(
        "request",
        "the size the allocator asked for when no cached block could serve the request: on a cache miss that is "
        f"a whole segment, rounded up from the tensor's size ([how sizes are rounded]({links['sizes']})).",
    )
    say(
        "device",
        "the driver's figures for the whole GPU, every process included. Free memory on the device is not what "
        "this process may use: the cap below is.",
    )
    if "process" in found:
        outside = (
            f" Less what the allocator reserved (below), {_about(found['process'].sizes[0] - reserved)} "
            "of it is outside the allocator: the CUDA context and the libraries' own memory, which no PyTorch "
            "statistic counts."
            if reserved is not None
            else ""
        )
        say("process", "the driver's count (NVML) for this process." + outside)
    if "allowed" in found:
        allowed = found["allowed"].sizes[0]
        room = ""
        if reserved is not None and request is not None:
            held = " + ".join(found["split"].said)
            room = (
                f" The allocator had reserved {held} of it: the cap left no room for a new segment of {found['request'].said[0]}."
                if allowed - reserved < request
                else f" The allocator had reserved {held}, which leaves room under the cap: the device itself "
                "had no memory left to give."
            )
        say("allowed", f"the cap that `set_per_process_memory_fraction` set ([the memory fraction]({links['fraction']})).{room}")
    if "split" in found:
        allocated, cached = found["split"].said
        verdict = (
            f" The cache holds more than the request ({cached} against {found['request'].said[0]}), yet none of its "
            "free blocks was large enough: the free memory is in pieces. That is fragmentation, and step 1, the "
            "snapshot, shows where the pieces are."
            if request is not None and found["split"].sizes[1] >= request
            else " The cache is smaller than the request: live tensors fill the reserved memory, and the question "
            "is what keeps them (step 2) or how high one step goes (step 3)."
        )
        say(
            "split",
            f"memory in live blocks ({allocated}), and memory the allocator holds in free blocks ({cached}). Before "
            "raising, the allocator returned every cached segment that no live block used and tried again, so what "
            "is still cached lies in segments that live blocks pin." + verdict,
        )
    say(
        "advice",
        f"printed with every OOM, whatever the cause. It helps only when the cache is in pieces ([the settings]({links['expandable']})).",
    )
    return lines
