"""The figures README.md states, written from the manifests and ``facts.json`` rather than typed.

A README is read where no site is built (GitHub, a wheel's metadata), so its figures
cannot be fact markers rendered at build time. Each figure sits instead between two
HTML comments that GitHub does not show: ``oomlab dev readme`` rewrites what is
between them, and ``tests/test_readme.py`` fails when the committed README is not
what it would write, so a manifest's new budget cannot leave the README behind.
"""

from __future__ import annotations

import re
from pathlib import Path

from oomlab.course import Course, reports
from oomlab.measure.machine import CONTEXT_BYTES
from oomlab.site import facts as site_facts
from oomlab.units import format_bytes, in_gib

README = Path("README.md")
COMMAND = "oomlab dev readme"
BLOCK = re.compile(r"(<!-- written by `oomlab dev readme`: (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(\n<!-- end (?P=name) -->)", re.S)


def gpu_needs(course: Course, facts: dict | None) -> str:
    """What a learner's GPU must have free: the first exercise's and the largest budget, plus a process's own share."""
    first = course.scripts[0]  # an estimate exercise measures nothing of the learner's: it needs no budget free
    largest = max(course.scripts, key=lambda ex: ex.budget_bytes)
    context = ((facts or {}).get("facts", {}).get("cuda_context") or {}).get("non_pytorch_bytes")
    measured = (
        f" (its CUDA context and kernels: {format_bytes(context)} measured on an {facts.get('gpu')} by `{site_facts.COMMAND}`)"
        if context
        else ""
    )
    return (
        f"Measuring needs an NVIDIA GPU with an exercise's budget free plus {in_gib(CONTEXT_BYTES)} for what the "
        f"process holds outside the allocator{measured}: {in_gib(first.budget_bytes + CONTEXT_BYTES)} for the first "
        f"exercise ({first.id}, budget {in_gib(first.budget_bytes)}), {in_gib(largest.budget_bytes + CONTEXT_BYTES)} "
        f"for the largest ({largest.id}, budget {in_gib(largest.budget_bytes)}). `oomlab list` shows every budget, and "
        "`oomlab doctor` says which fit this machine."
    )


WRITERS = {"gpu-needs": gpu_needs}


def render(text: str, course: Course, facts: dict | None) -> str:
    """``text`` with every written block rewritten; a block of a name nobody writes is an error."""

    def write(match: re.Match) -> str:
        name = match["name"]
        if name not in WRITERS:
            raise KeyError(f"README.md has a block {name!r} that {COMMAND} does not write ({', '.join(WRITERS)} are)")
        return match[1] + WRITERS[name](course, facts) + match[4]

    return BLOCK.sub(write, text)


def regenerate(course: Course) -> tuple[Path, bool]:
    """Rewrite the course's README.md; whether it changed."""
    path = course.root / README
    before = path.read_text(encoding="utf-8")
    after = render(before, course, site_facts.load(course.root / reports.FACTS))
    if after != before:
        path.write_text(after, encoding="utf-8")
    return path, after != before
