"""An estimate in the terminal: each config's parts, the estimate beside the measurement (or the CPU's count).

:func:`scores_table` is a grade (``oomlab check`` on an estimate exercise): every part of every hidden config, the
measured bytes, the error and the tolerance, and whether it is within. :func:`examples_table` is ``oomlab run``'s:
the learner's answers for the exercise's public examples beside the same configs counted on the CPU, which is no
grade (no library workspace) and says so. :func:`part_line` and :func:`off_lines` say one part
of a grade in words, as the nbgrader course's cells and class report give it a part at a time.
"""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text

from oomlab.sizing import brief
from oomlab.sizing.score import PartScore
from oomlab.units import in_mib

__all__ = ["examples_table", "off_lines", "part_line", "scores_table"]


def _error(s: PartScore) -> str:
    return "no bytes measured" if math.isinf(s.error) else f"{s.error:+.1%}"


def _mark(s: PartScore) -> Text:
    return Text("✓", style="green") if s.within else Text("✗", style="bold red")


def scores_table(report) -> Group:
    """A :class:`oomlab.sizing.grade.SizingReport` as a table, one section per config, one row per part, with the
    configs listed above it (a narrow terminal cuts none of them)."""
    title = f"{report.within} of {report.total} parts within tolerance"
    if report.gpu:
        title += f", measured on {report.gpu}, torch {report.torch}"
    table = Table(header_style="bold", title=title, title_justify="left")
    for col in ("config", "part", "estimate MiB", "measured MiB", "error", "tolerance", ""):
        table.add_column(col, justify="right" if "MiB" in col or col in ("error", "tolerance") else "left")
    for i, row in enumerate(report.scores, 1):
        for j, s in enumerate(row):
            table.add_row(
                f"{i}." if j == 0 else "",
                s.part,
                in_mib(s.estimated),
                in_mib(s.measured),
                _error(s),
                f"±{s.tolerance:.0%}",
                _mark(s),
                end_section=j == len(row) - 1,
            )
    return _configs_above(f"The {len(report.configs)} hidden configs:", [c.as_dict() for c in report.configs], table)


def _configs_above(heading: str, configs: list[dict], table: Table) -> Group:
    return Group(Text(heading, style="bold"), *(Text(f"{i}. {brief(cfg)}") for i, cfg in enumerate(configs, 1)), table)


def examples_table(
    examples: list[dict], estimates: list[dict], counts: list[dict], kind, heading: str = "The examples:"
) -> Group:
    """The learner's estimates for the public examples beside the CPU's count of each part (``kind``: a
    :class:`oomlab.sizing.grade.Sized`), each within its part's tolerance of the count or not. The configs are listed
    above the table, so that a narrow terminal cuts none of them."""
    table = Table(
        header_style="bold",
        title=f"Your estimate beside the CPU's count of the same {kind.what}: every tensor it makes, followed on the "
        "CPU (no library workspace; the grade is the GPU's measurement)",
        title_justify="left",
    )
    for col in ("example", "part", "your estimate MiB", "CPU count MiB", "off by", "tolerance", ""):
        table.add_column(col, justify="right" if "MiB" in col or col in ("off by", "tolerance") else "left")
    for i, (estimate, counted) in enumerate(zip(estimates, counts, strict=True), 1):
        for j, part in enumerate(kind.parts):
            s = PartScore(part, estimate[part], counted[part], kind.tolerance[part])
            table.add_row(
                f"{i}." if j == 0 else "",
                part,
                in_mib(estimate[part]),
                in_mib(counted[part]),
                _error(s),
                f"±{s.tolerance:.0%}",
                _mark(s),
                end_section=j == len(kind.parts) - 1,
            )
    return _configs_above(heading, examples, table)


def _part(report, part: str) -> list[tuple[object, PartScore]]:
    """Each config of ``report`` with its score for ``part``."""
    return [(cfg, s) for cfg, row in zip(report.configs, report.scores, strict=True) for s in row if s.part == part]


def part_line(report, part: str) -> str:
    """One part of a grade on one line: on how many hidden configs it is within its tolerance, and its worst error."""
    scores = [s for _, s in _part(report, part)]
    worst = max(scores, key=lambda s: abs(s.error))
    within = sum(s.within for s in scores)
    return f"{part}: within ±{worst.tolerance:.0%} on {within} of {len(scores)} hidden configs (largest error {_error(worst)})"


def off_lines(report, part: str) -> list[str]:
    """Each hidden config on which ``part`` is outside its tolerance: the config, the estimate and the measurement."""
    return [
        f"config {i} ({brief(cfg.as_dict())}): estimated {in_mib(s.estimated)} MiB, measured {in_mib(s.measured)} MiB, "
        f"{_error(s)}"
        for i, (cfg, s) in enumerate(_part(report, part), 1)
        if not s.within
    ]
