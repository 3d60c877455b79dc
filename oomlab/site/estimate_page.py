"""The page of an estimate exercise (``kind = "estimate"``), generated from its manifest and its estimator.

Its own page, not a script exercise's with parts left out: nothing runs under a budget, so there is no budget,
allocator setting, OOM or peak figure to show. In the order a learner needs it: the task, what is graded and
within what tolerance, the shipped estimator (whose docstring states the config's fields), the code it sizes
(the model and how each part is measured), the public example configs, the hints, the classic mistakes (each an edit of the estimator, with the part it gets wrong and, once
``oomlab dev verify`` measured it, whether it did), the alternatives, and the interview question.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError

from oomlab.course.manifest import Exercise
from oomlab.grading.estimates import parts_of
from oomlab.site.markdown import FRONT_MATTER, cell
from oomlab.site.reports import Reports
from oomlab.sizing.grade import SIZED
from oomlab.sizing.hidden import COUNT

__all__ = ["estimate_page"]


def estimate_page(ex: Exercise, number: int, total: int, reports: Reports) -> str:
    """The whole page of estimate exercise ``number`` of ``total``, as Markdown."""
    from oomlab.site.exercise_page import (
        alternatives_section,
        check_time_row,
        fence,
        fix_section,
        hints_section,
        interview_section,
        page_head,
    )

    script = ex.learner_path
    if not script.is_file():
        raise PluginError(f"{ex.manifest_path}: its estimator {script} does not exist.")
    rel_script = script.relative_to(ex.root).as_posix()
    kind = SIZED[ex.sizes]
    md = [
        *page_head(ex, number, total),
        f"| You write | `estimate(config)`: the bytes of each part of one {kind.what} |",
        f"| Graded on | {COUNT} hidden configs, each measured on the GPU: the same ones for the same estimator, new ones "
        "whenever its text changes |",
        "| Memory budget | none: nothing of yours runs on the GPU |",
        f"| The file you edit | `{rel_script}` |",
        *check_time_row(ex, reports, why=long_check(kind)),
        "",
        "## Run it",
        "",
        fence(
            f"oomlab run {ex.id}     # your estimate for the examples below, beside the CPU's count of each\n"
            f'oomlab run {ex.id} --config "layers=8,batch=1"   # and a config of yours: the first example, changed\n'
            f"oomlab check {ex.id}   # grade it: every part of every hidden config within its tolerance\n"
            f"oomlab hint {ex.id}    # the next hint",
            "bash",
        ),
        "",
        "## What the grader checks",
        "",
        "Your `estimate()` answers for every hidden config first, in a sandbox with no GPU and no answer in reach; "
        "then each config runs on the GPU, read from the caching allocator (the bytes the tensors request, before it rounds "
        "them up to its blocks). It passes when every part of every "
        "config is within its tolerance of the measured bytes.",
        "",
        "| Part | Tolerance |",
        "|---|---|",
        *(f"| `{part}` | ±{kind.tolerance[part]:.0%} |" for part in parts_of(ex)),
        "",
        f"## The estimator: `{rel_script}`",
        "",
        "As shipped: it counts parameters at four bytes each and little else. Its docstring says what each field "
        "of the config means.",
        "",
        fence(script.read_text(encoding="utf-8"), f'python linenums="1" title="{rel_script}"'),
        "",
        *what_you_size(ex),
        "## Example configs",
        "",
        f"Public, unlike the graded ones: `oomlab run {ex.id}` shows your estimate for each beside the same "
        "configs counted on the CPU, tensor by tensor (no library workspace).",
        "",
        "| # | " + " | ".join(ex.examples[0]) + " |",
        "|---|" + "---|" * len(ex.examples[0]),
        *(f"| {i} | " + " | ".join(cell(str(v)) for v in cfg.values()) + " |" for i, cfg in enumerate(ex.examples, 1)),
        "",
        *hints_section(ex),
        *fix_section(ex, reports),
    ]
    md += mistakes_section(ex, reports)
    md += alternatives_section(ex, reports)
    md += interview_section(ex)
    return FRONT_MATTER + "\n".join(md) + "\n"


def long_check(kind) -> str:
    """Why an estimate's check takes longer than a script's: what each check measures, and why none of it is kept."""
    return (
        f"every check measures its {COUNT} hidden configs on the GPU, a whole {kind.what} each, in a process that "
        "first imports torch and runs a small copy of each config unmeasured (so that what a library keeps from its "
        "first call belongs to no config); the configs change whenever the estimator does, so no measurement carries "
        "over from one check to the next."
    )


def module_source(name: str, function: str = "") -> str:
    """The source of module ``name`` (found without importing it), or of its top-level ``function`` alone."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise PluginError(f"the module {name} that an estimate exercise shows is not installed.")
    text = Path(spec.origin).read_text(encoding="utf-8")
    if not function:
        return text
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return ast.get_source_segment(text, node)
    raise PluginError(f"{spec.origin} defines no function {function}.")


def what_you_size(ex: Exercise) -> list[str]:
    """The model the estimate answers to and how the grader reads each part: the code that runs on the GPU, shown
    whole, so that the page is the exercise's specification (the learner's folder holds no copy of it)."""
    from oomlab.site.exercise_page import fence

    kind = SIZED[ex.sizes]
    model_file = kind.model.replace(".", "/") + ".py"
    md = [
        "## What you size",
        "",
        f"The code the grader runs on the GPU for each config, read as your specification. Wherever oomlab is "
        f"installed, `python -m inspect {kind.model}` prints it.",
        "",
        fence(module_source(kind.model), f'python linenums="1" title="{model_file}"'),
        "",
    ]
    if kind.module != kind.model:
        md += [
            f"Each part as the grader reads it from the caching allocator (`{kind.function}` of `{kind.module}`):",
            "",
            fence(module_source(kind.module, kind.function), "python"),
            "",
        ]
    return md


def mistakes_section(ex: Exercise, reports: Reports) -> list[str]:
    """The classic mistakes, each an edit of the shipped estimator, with the part it gets wrong."""
    from oomlab.site.exercise_page import tempting_edits

    return tempting_edits(
        ex,
        reports,
        "Classic mistakes",
        "Each is an edit of the shipped estimator that the course grades, and the part it gets wrong.",
        lambda fix: f"gets `{fix.expect}` wrong",
        lambda fix, run: f"{'gets' if fix.expect in (run.get('failed_parts') or []) else 'does NOT get'} `{fix.expect}` wrong",
    )
