"""The course as a path: a page per module, and the overview of all of them on the landing page.

Both come from the course's list of modules (``exercises/modules.toml``, which gives
each exercise its module) and the exercises' manifests, as ``oomlab list`` does, so a
module gained or an exercise moved shows up here at the next build. A module page says what a learner will be able to do, lists its
exercises in order (their titles, which do not name the bug) and the interview
questions they end with; the answers stay folded on the exercise pages.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

from oomlab.course.manifest import Exercise
from oomlab.course.modules import READ_FIRST, SIZE_FIRST, Module, met_before_its_step
from oomlab.site.markdown import cell, link_from
from oomlab.steps import step

__all__ = ["module_page", "module_uri", "modules_overview", "step_tag", "taught"]


def module_uri(module: Module) -> str:
    return f"modules/{module.name}.md"


def page_uri(ex: Exercise) -> str:
    return f"exercises/{ex.id}.md"


def step_tag(page_src_uri: str, ex: Exercise) -> str:
    """The workflow step an exercise drills, linked to its section; "Read the error first, then" it where it comes before its step."""
    if not ex.step:  # an estimate exercise: no step of the workflow finds what it sizes
        return SIZE_FIRST
    linked = f"[{step(ex.step).heading}]({link_from(page_src_uri, f'workflow.md#{ex.step}')})"
    if met_before_its_step(ex.module, ex.step):
        return f"[{READ_FIRST}]({link_from(page_src_uri, 'workflow.md#read-the-error-first')}), then {linked}"
    return linked


def exercise_table(page_src_uri: str, numbered: list[tuple[int, Exercise]]) -> str:
    """Exercises with their numbers in the course, as a table: title, workflow step and budget (the titles name no bug)."""
    lines = ["| # | Exercise | Workflow step | Budget |", "|---:|---|---|---:|"]
    for n, ex in numbered:
        lines.append(
            f"| {n} | [{cell(ex.title)}]({link_from(page_src_uri, page_uri(ex))}) "
            f"| {step_tag(page_src_uri, ex)} | {'none' if ex.is_estimate else f'{ex.budget_mib:,.0f} MiB'} |"
        )
    return "\n".join(lines)


def taught(exercises: list[Exercise]) -> list[tuple[Module, list[tuple[int, Exercise]]]]:
    """Each module that has exercises, in teaching order, with its exercises and their numbers in the course.

    ``exercises`` are the course's, in its order (:attr:`oomlab.course.Course.exercises`): each carries its module.
    """
    numbered = list(enumerate(exercises, 1))
    modules = dict.fromkeys(ex.module for ex in exercises if ex.module is not None)
    return [(m, [(n, ex) for n, ex in numbered if ex.module == m]) for m in modules]


def module_page(module: Module, exercises: list[Exercise], docs_dir: Path) -> str:
    """The page of ``module``: its goal, the sections of the site it builds on, its exercises, the interview questions
    they end with."""
    path = taught(exercises)
    index = next(i for i, (m, _) in enumerate(path) if m == module)
    chosen = path[index][1]
    uri = module_uri(module)
    md = [
        f"# {module.title}",
        "",
        f"Module {index + 1} of {len(path)}. When you have done it, you can: {module.goal[0].lower()}{module.goal[1:]}",
        "",
        *reading_section(module, uri, docs_dir),
        "## The exercises",
        "",
        "In this order; `oomlab` on its own shows which one you are on.",
        "",
        exercise_table(uri, chosen),
        "",
        "## The interview questions",
        "",
        "Each exercise ends with one; try answering it before you open the model answer on the exercise's page.",
        "",
    ]
    for n, ex in chosen:
        md.append(f"- Exercise {n}: {ex.interview.question} ([answer]({link_from(uri, page_uri(ex) + '#in-an-interview')}))")
    neighbours = []
    if index > 0:
        before = path[index - 1][0]
        neighbours.append(f"Before it: [{before.title}]({link_from(uri, module_uri(before))}).")
    if index + 1 < len(path):
        after = path[index + 1][0]
        neighbours.append(f"Next: [{after.title}]({link_from(uri, module_uri(after))}).")
    md += ["", " ".join(neighbours), ""]
    return "\n".join(md)


def modules_overview(page_src_uri: str, exercises: list[Exercise], verify: dict | None = None) -> str:
    """The path through the course as a table: each module, what it teaches, its exercises, and what it asks of the machine.

    The course measures only the machine's part of a module's time: the lines of script a learner
    reads, and from ``verify.json`` how long one run of each seeded bug and one of its fix took in the
    truth check. How long the thinking takes is the learner's.
    """
    timed = {row["id"]: row for row in (verify or {}).get("exercises") or []}
    jobs = (verify or {}).get("jobs")
    lines = ["| Module | You will be able to | Exercises | To read, to wait |", "|---|---|---|---|"]
    for module, chosen in taught(exercises):
        numbers = ", ".join(f"[{n}]({link_from(page_src_uri, page_uri(ex))})" for n, ex in chosen)
        lines.append(
            f"| [{cell(module.title)}]({link_from(page_src_uri, module_uri(module))}) | {cell(module.goal)} | {numbers} "
            f"| {cell(_machine_part([ex for _, ex in chosen], timed, jobs))} |"
        )
    return "\n".join(lines)


def _machine_part(chosen: list[Exercise], timed: dict[str, dict], jobs: int | None) -> str:
    """A module's scripts in lines, and the GPU's time for one run of each exercise's bug and of its fix, where timed."""
    lines = sum(len(ex.learner_path.read_text(encoding="utf-8").splitlines()) for ex in chosen)
    waits = [_one_round(timed.get(ex.id) or {}) for ex in chosen]
    words = f"{lines:,} lines of script"
    if all(w is not None for w in waits):
        return words + (
            f"; {sum(waits):.0f} s of GPU runs for the bug and the fix of each exercise once (the truth check's times, "
            f"{jobs} runs sharing the GPU)"
        )
    return words + "; the GPU's time is still to be measured for some of them (`oomlab dev verify` on a GPU)"


def _one_round(row: dict) -> float | None:
    """Seconds of one run of the seeded bug and one of the reference fix, as the truth check timed them."""
    walls = [(row.get(kind) or {}).get("wall_s") for kind in ("buggy", "solution")]
    return sum(walls) if all(isinstance(w, (int, float)) for w in walls) else None


def reading_section(module: Module, uri: str, docs_dir: Path) -> list[str]:
    """The sections of the site that ``module`` builds on (its ``reading``), each linked by its heading."""
    if not module.reading:
        return []
    md = ["## Read first", ""]
    for target in module.reading:
        name, anchor = target.split("#")
        page, section = titles(docs_dir / name, anchor, module)
        md.append(f"- [{section}]({link_from(uri, target)}), in [{page}]({link_from(uri, name)})")
    return [*md, ""]


def titles(page: Path, anchor: str, module: Module) -> tuple[str, str]:
    """The title of ``page`` and its heading marked ``{#anchor}``: a link says what the page and section call themselves."""
    where = f"exercises/modules.toml: module {module.name!r} reads {page.name}#{anchor}"
    try:
        text = page.read_text(encoding="utf-8")
    except OSError:
        raise PluginError(f"{where}, but there is no page {page.name} in the site's pages.") from None
    title = re.search(r"^# (.+?)[ \t]*$", text, flags=re.M)
    section = re.search(rf"^#+ (.+?) \{{#{re.escape(anchor)}\}}[ \t]*$", text, flags=re.M)
    if title is None or section is None:
        raise PluginError(f"{where}, but {page.name} has no title, or no heading marked {{#{anchor}}}.")
    return title.group(1), section.group(1)
