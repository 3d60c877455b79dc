"""An exercise's measured runs as the site shows them, on its own page and on the measurements page.

Each row of ``verify.json`` holds the runs of one exercise: the buggy script, the reference
fix, the accepted alternatives, the wrong fixes and the generic cheats. Both pages list them
with :func:`runs` and set them out with :func:`run_row` under :data:`RUN_HEADER`, and both
warn with :func:`staleness` and :func:`expectation_notes`: one list, one table and one set of
warnings, so that the two pages (and the chart over an exercise's table) never disagree about
what was measured.
"""

from __future__ import annotations

from oomlab.course.manifest import Exercise
from oomlab.figure_names import COMPARED, heading
from oomlab.site.markdown import cell
from oomlab.units import MIB, in_mib

__all__ = ["FIGURES", "RUN_HEADER", "budget", "expectation_notes", "run_row", "runs", "staleness", "upper_first"]

FIGURES = COMPARED[:3]  # the byte figures of a run's row, by verify.json key; retries get their own column


def upper_first(text: str) -> str:
    """A note that starts a warning of its own: the notes are written to follow words in a sentence."""
    return text[:1].upper() + text[1:]


def budget(ex: Exercise) -> str:
    """The exercise's budget in MiB and in bytes: the bytes are what the allocator is capped at, exactly."""
    return (
        f"{ex.budget_bytes / MIB:,.0f} MiB ({ex.budget_bytes:,} bytes)"
        if ex.budget_bytes % MIB == 0
        else f"{ex.budget_mib:,.2f} MiB ({ex.budget_bytes:,} bytes)"
    )


def run_row(label: str, run: dict) -> str:
    """One run as a row under :data:`RUN_HEADER`: its verdict, whether it ran out of memory, its peaks in MiB."""
    failed = run.get("failed_checks") or []
    oom = run.get("oom")
    cells = [
        label,
        str(run.get("verdict") or "n/a"),
        "n/a" if oom is None else ("yes" if oom else "no"),
        *(in_mib(run.get(key)) for key in FIGURES),
        "n/a" if run.get("retries") is None else str(run["retries"]),
        ", ".join(failed) or "none",
    ]
    return "| " + " | ".join(cell(c) for c in cells) + " |"


RUN_HEADER = (
    "| Run | Verdict | OOM | " + " | ".join(heading(key) for key in FIGURES) + f" | {heading('retries')} | Failed checks |\n"
    "|---|---|---|" + "---:|" * len(FIGURES) + "---:|---|"
)


def runs(row: dict, cheats: bool = False) -> list[tuple[str, dict]]:
    """The report row's runs with their labels: the bug, the fix, the accepted alternatives, the wrong fixes (and the generic cheats).

    The exercise page's chart and its table, and the measurements page, all list these: one list, so
    that a picture never shows a run its table lacks.
    """
    out = []
    if row.get("buggy"):
        out.append(("buggy script", row["buggy"]))
    if row.get("solution"):
        out.append(("reference solution", row["solution"]))
    for alt in row.get("alternatives") or []:
        out.append((f"accepted fix: {alt.get('name', '?')}", alt))
    for fix in row.get("wrong_fixes") or []:
        out.append((f"wrong fix: {fix.get('name', '?')}", fix))
    for cheat in (row.get("cheats") or []) if cheats else []:
        out.append((f"cheat: {cheat.get('name', '?')}", cheat))
    return out


def staleness(ex: Exercise, row: dict) -> list[str]:
    """Ways the exercise has changed since the measurement (the same digest the project's tests compare)."""
    from oomlab.grading.truth import stale

    why = stale(row, ex)
    if why is None:
        return []
    if not ex.is_estimate and row.get("budget_bytes") != ex.budget_bytes:
        return [f"the budget was {in_mib(row.get('budget_bytes'))} MiB then and is {in_mib(ex.budget_bytes)} MiB now"]
    return [f"{why} it was measured"]


def expectation_notes(row: dict) -> list[str]:
    """Each run that did not do what the course expects of it, and a reference fix whose figures did not repeat."""
    notes = []
    for label, run in runs(row, cheats=True):
        if run.get("as_expected") is False:
            want = " or ".join(f"`{name}`" for name in run.get("expected_failure") or [])
            notes.append(
                f"{label} did not behave as the course expects"
                + (f" (it should fail {want})." if want else " (it should pass every check).")
            )
    if row.get("repeatable") is False:
        notes.append("the reference solution's allocator figures differed between its two runs.")
    return notes
