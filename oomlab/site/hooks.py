"""MkDocs hooks: the course site's exercise and measurement pages, generated at build time.

``mkdocs.yml`` names this file under ``hooks:``. Nothing here is written to disk:

- one page per exercise, ``exercises/<id>.md``, from its ``exercise.toml`` (title,
  workflow step, summary, budget, checks, hints, wrong fixes) and its buggy script,
  read verbatim; the reference solution is never shown;
- ``measurements.md``, every figure rendered from ``course/measurements/verify.json``
  (written by ``oomlab dev verify`` on a GPU), so no number a run produced is typed by hand;
- ``modules/NAME.md``, a page per module (:mod:`oomlab.site.module_pages`);
- ``cli.md``, the command reference, from the CLI itself (:mod:`oomlab.site.cli_reference`);
- the ``Exercises`` section of the nav, module by module, in course order;
- in hand-written pages, ``<!-- oomlab:figure FILE alt -->`` becomes a picture that
  ``oomlab dev figures`` drew (or says it is not drawn yet),
  ``<!-- oomlab:diagram NAME -->`` a diagram drawn at build time (:data:`DIAGRAMS`: the
  workflow's, :mod:`oomlab.site.diagram`, and the segments', :mod:`oomlab.site.segments_diagram`), ``<!-- oomlab:modules -->`` the path through the modules,
  ``<!-- oomlab:exercises -->`` a table of the
  exercises and ``<!-- oomlab:exercises STEP -->`` a list of those teaching STEP;
- in any page, ``<!-- oomlab:fact probe.key -->`` becomes a figure that a probe script in
  ``course/probes/`` measured, from ``course/measurements/facts.json`` (written by
  ``oomlab dev facts`` on a GPU; see :mod:`oomlab.site.facts`), and the page ends with where
  its measured figures come from. An unknown fact fails the build; a fact not measured yet
  reads "not measured yet", with the command that measures it.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import sys
from datetime import datetime
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.oomlab")

_ROOT = Path(__file__).resolve().parents[2]
if str(_ROOT) not in sys.path:  # mkdocs loads this file by path, not as graders.site
    sys.path.insert(0, str(_ROOT))

from oomlab.course.manifest import STEP_NAMES, Exercise  # noqa: E402
from oomlab.errors import OomLabError  # noqa: E402
from oomlab.measure.stats import FIGURES as STAT_FIGURES  # noqa: E402
from oomlab.site import facts as site_facts  # noqa: E402
from oomlab.site import segments_diagram  # noqa: E402
from oomlab.site.charts import peaks_chart  # noqa: E402
from oomlab.site.cli_reference import cli_reference  # noqa: E402
from oomlab.site.compare_fold import compare_fold  # noqa: E402
from oomlab.site.diagram import workflow_svg  # noqa: E402
from oomlab.site.fact_charts import CHART_MARKER, CHARTS, chart  # noqa: E402
from oomlab.site.markdown import cell, escaped, indented, link_from, picture  # noqa: E402
from oomlab.site.module_pages import (  # noqa: E402
    exercise_table,
    module_page,
    module_uri,
    modules_overview,
    page_uri,
    step_tag,
    taught,
)
from oomlab.site.oom_message import annotated, learner_view  # noqa: E402
from oomlab.site.tool_costs import big_snapshot_section, oom_hook_section  # noqa: E402
from oomlab.site.witness_section import witness_section  # noqa: E402
from oomlab.steps import step  # noqa: E402
from oomlab.units import MIB, UNIT_BYTES, format_bytes, in_mib  # noqa: E402

VERIFY_JSON = "measurements/verify.json"  # relative to docs_dir
FIGURES_JSON = "figures/figures.json"  # relative to docs_dir; written by `oomlab dev figures`
FACTS_JSON = "measurements/facts.json"  # relative to docs_dir; written by `oomlab dev facts`
SPEED_JSON = "measurements/speed.json"  # relative to docs_dir; written by `oomlab dev bench`
EQUIVALENCE_JSON = "measurements/equivalence.json"  # relative to docs_dir; written by `oomlab dev equivalence`
PROBES = "probes"  # relative to docs_dir: the probe scripts behind facts.json
PYTORCH_SOURCE = "https://github.com/pytorch/pytorch/blob/main/"
MARKER = re.compile(r"<!--\s*oomlab:exercises(?:\s+(\w+))?\s*-->")
MODULES_MARKER = "<!-- oomlab:modules -->"  # the path through the course, module by module
DIAGRAM_MARKER = re.compile(r"<!--\s*oomlab:diagram\s+([\w-]+)\s*-->")  # a picture drawn from the code below
DIAGRAMS = {"workflow": workflow_svg, **segments_diagram.DIAGRAMS}
CLI_PAGE = "cli.md"  # the command reference, generated from the CLI itself
# <!-- oomlab:figure FILE alt text --> in a hand-written page: a picture `oomlab dev figures` drew, once it has
FIGURE_MARKER = re.compile(r"<!--\s*oomlab:figure\s+(?P<file>[\w.-]+)\s+(?P<alt>.*?)\s*-->", re.S)


FIGURES = (  # (verify.json key, column heading)
    ("peak_allocated", "Peak allocated"),
    ("peak_reserved", "Peak reserved"),
    ("inactive_split_peak", "Non-releasable"),
)
# Wide tables need the room: the generated pages go without the right-hand table of contents.
FRONT_MATTER = "---\nhide:\n  - toc\n---\n\n"

# Per build: the exercises in course order and the parsed verify.json.
# The facts: facts.json (None before `oomlab dev facts` ran), the probes by name, and the derived figures.
_state: dict = {
    "exercises": [],
    "report": None,
    "report_problem": "",
    "figures": {},
    "facts": None,
    "probes": {},
    "derived": {},
    "speed": None,  # speed.json, None before `oomlab dev bench` ran
    "equivalence": None,  # equivalence.json, None before `oomlab dev equivalence` ran
}


# --------------------------------------------------------------------------- formatting

_CODE_LIKE = re.compile(
    r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\((?:[^()]|\([^()]*\))*\)"  # calls: f(x), a.b(c=[1, 2])
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # dotted names: torch.empty
    r"|[A-Za-z]\w*_\w+"  # snake_case names: self_cuda_memory_usage
)
_NOT_CODE = {"e.g", "i.e"}


def upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def prose(text: str) -> str:
    """Plain manifest text as Markdown: code-like words as inline code, the rest escaped.

    Text that already uses backticks is taken to be Markdown and left alone.
    """
    text = " ".join(text.split())
    if "`" in text:
        return text
    out, last = [], 0
    for m in _CODE_LIKE.finditer(text):
        if m.group(0).lower() in _NOT_CODE:
            continue
        out.append(escaped(text[last : m.start()]))
        out.append(f"`{m.group(0)}`")
        last = m.end()
    out.append(escaped(text[last:]))
    return "".join(out)


def budget(ex: Exercise) -> str:
    return (
        f"{ex.budget_bytes / MIB:,.0f} MiB ({ex.budget_bytes:,} bytes)"
        if ex.budget_bytes % MIB == 0
        else f"{ex.budget_mib:,.2f} MiB ({ex.budget_bytes:,} bytes)"
    )


def fence(code: str, info: str) -> str:
    """A fenced block that the code itself cannot close."""
    longest = max((len(m) for m in re.findall(r"`{3,}", code)), default=2)
    ticks = "`" * (longest + 1)
    return f"{ticks} {info}\n{code.rstrip()}\n{ticks}"


def edit_diff(edit) -> str:
    """A wrong fix's edit as the lines it removes and adds, with the unchanged ones as context."""
    old, new = edit.find.rstrip("\n").split("\n"), edit.replace.rstrip("\n").split("\n")
    lines = difflib.unified_diff(old, new, lineterm="", n=max(len(old), len(new)))
    return "\n".join(line for line in lines if not line.startswith(("---", "+++", "@@")))


# --------------------------------------------------------------------------- verify.json


def load_report(docs_dir: Path) -> tuple[dict | None, str]:
    path = docs_dir / VERIFY_JSON
    if not path.is_file():
        return None, f"There is no {path.name} yet: on a CUDA GPU, `make verify` (`oomlab dev verify`) writes it."
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise PluginError(f"course/{VERIFY_JSON} is not valid JSON: {err}") from None
    if not isinstance(report, dict) or not isinstance(report.get("exercises"), list):
        raise PluginError(f"course/{VERIFY_JSON} has no 'exercises' list; write it with `oomlab dev verify`.")
    return report, ""


def measured(ex_id: str) -> dict | None:
    report = _state["report"]
    if not report:
        return None
    return next((row for row in report["exercises"] if row.get("id") == ex_id), None)


def measured_on(report: dict) -> str:
    return f"{report.get('gpu') or 'unknown GPU'}, torch {report.get('torch') or '?'}"


def measured_date(report: dict) -> str:
    created = report.get("created") or ""
    try:
        return datetime.fromisoformat(created).strftime("%Y-%m-%d %H:%M %Z").strip()
    except ValueError:
        return created or "unknown date"


def run_row(label: str, run: dict) -> str:
    failed = run.get("failed_checks") or []
    oom = run.get("oom")
    cells = [
        label,
        str(run.get("verdict") or "n/a"),
        "n/a" if oom is None else ("yes" if oom else "no"),
        *(in_mib(run.get(key)) for key, _ in FIGURES),
        "n/a" if run.get("retries") is None else str(run["retries"]),
        ", ".join(failed) or "none",
    ]
    return "| " + " | ".join(cell(c) for c in cells) + " |"


RUN_HEADER = (
    "| Run | Verdict | OOM | " + " | ".join(h for _, h in FIGURES) + " | Retries | Failed checks |\n"
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
    from oomlab.grading.truth import source_digest

    if row.get("sources") == source_digest(ex):
        return []
    if row.get("budget_bytes") != ex.budget_bytes:
        return [f"the budget was {in_mib(row.get('budget_bytes'))} MiB then and is {in_mib(ex.budget_bytes)} MiB now"]
    return ["its manifest, script or reference fix changed since it was measured"]


def expectation_notes(row: dict) -> list[str]:
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


# --------------------------------------------------------------------------- facts.json


def fact(name: str) -> str:
    """One measured fact as a page shows it (for the generated pages; hand-written ones use the marker)."""
    try:
        value = site_facts.lookup(_state["facts"], name, _state["probes"])
    except site_facts.UnknownFact as err:
        raise PluginError(f"oomlab/site/hooks.py: {err}") from None
    return value if value is site_facts.NOT_MEASURED else site_facts.format_value(name, value)


def derived_facts(exercises: list[Exercise], report: dict | None) -> dict:
    """Figures that follow from the manifests and facts.json: ``course.*`` in a fact marker."""
    largest = max((ex.budget_bytes for ex in exercises), default=0)
    context = None
    if report is not None and isinstance(report["facts"].get("cuda_context"), dict):
        context = report["facts"]["cuda_context"].get("non_pytorch_bytes")
    return {
        "course": {
            "largest_budget_bytes": largest,
            # the largest budget plus what a capped process holds outside the allocator
            "need_bytes": site_facts.NOT_MEASURED if context is None else largest + context,
        }
    }


def facts_provenance(page_src_uri: str, shown: list[str]) -> list[str]:
    """The end of a page that quotes measured facts: where they come from, or that they are not measured yet."""
    probes = sorted({name.split(".", 1)[0] for name in shown if name.split(".", 1)[0] in _state["probes"]})
    if not probes:
        return []
    links = ", ".join(f"[`{p}.py`]({link_from(page_src_uri, f'{PROBES}/{p}.py')})" for p in probes)
    report = _state["facts"]
    md = ["", "## Where the measured figures come from", ""]
    if report is None:
        return md + [
            '!!! info "Not measured yet"',
            "",
            f"    The figures marked {site_facts.NOT_MEASURED} come from the probe scripts {links}. "
            f"`{site_facts.COMMAND}` runs each of them in a fresh process on a CUDA GPU and writes "
            "`course/measurements/facts.json`, which this page then quotes.",
            "",
        ]
    md += [
        f"The figures on this page that are not cited to PyTorch's source were measured by the probe scripts {links}: "
        f"`{site_facts.COMMAND}` ran each in a fresh process on {report.get('gpu') or 'an unknown GPU'}, torch "
        f"{report.get('torch') or '?'}, CUDA {report.get('cuda') or '?'}, {measured_date(report)}, and wrote "
        f"[`{FACTS_JSON}`]({link_from(page_src_uri, FACTS_JSON)}). They hold for that GPU and torch; "
        "run the probes on yours to compare.",
        "",
    ]
    stale = [p for p in site_facts.stale_probes(report, [_state["probes"][p] for p in probes]) if p in probes]
    if stale:
        md += [
            '!!! warning "Measured with an older version of a probe"',
            "",
            f"    {', '.join(f'`{p}`' for p in stale)} changed since facts.json was written: run `{site_facts.COMMAND}` again.",
            "",
        ]
    return md


def render_facts(markdown: str, page_src_uri: str, charted: list[str]) -> str:
    """The page's fact markers as figures, and where the figures and the charts (their probes' names) come from."""
    try:
        markdown, shown = site_facts.render(markdown, _state["facts"], _state["probes"], _state["derived"])
    except site_facts.UnknownFact as err:
        raise PluginError(f"{page_src_uri}: {err}") from None
    return markdown.rstrip("\n") + "\n" + "\n".join(facts_provenance(page_src_uri, [*shown, *charted])) + "\n"


def chart_section(page_src_uri: str, name: str, charted: list[str]) -> str:
    """A chart marker as its picture, or a line saying that its probe has not run yet."""
    if name not in CHARTS:
        raise PluginError(f"course/{page_src_uri}: no chart named {name!r}; charts: {', '.join(sorted(CHARTS))}.")
    charted.append(CHARTS[name][0])
    svg = chart(name, _state["facts"])
    return svg if svg is not None else f"*(Not drawn yet: `{site_facts.COMMAND}` runs `{CHARTS[name][0]}` on a GPU.)*"


# --------------------------------------------------------------------------- what a check's threshold is


def _as_measurement(stats: dict):
    from oomlab.measure.harness import Measurement

    return Measurement(script="", status="ok", stats=stats)


def _largest_passing(check, stat: str, base: int, params: dict) -> int:
    """The largest figure the grader's own check passes, against a reference of ``base``: its limit."""
    ref = _as_measurement({stat: base})
    passes = lambda v: check.evaluate(_as_measurement({stat: v}), ref, params).passed  # noqa: E731
    lo, hi = base, max(2 * base, base + 1)
    while passes(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def passes_when(name: str, params: dict, reference: dict | None, where: str) -> str:
    """What a check's thresholds mean, in words, computed by the grader's own code from the manifest's values."""
    from oomlab.grading.checks import CHECKS, RelativeBytes, Retries, SameResults

    check = CHECKS[name]
    if isinstance(check, RelativeBytes):
        # The relative and the absolute allowance, as the check computes them: on a huge and on a one-byte reference.
        huge = 1 << 40
        tolerance = _largest_passing(check, check.stat, huge, params) / huge - 1
        slack = _largest_passing(check, check.stat, 1, params) - 1
        text = f"at most the reference fix's `{check.stat}` plus {tolerance:.0%}"
        if slack > tolerance:
            text += f", or plus {format_bytes(slack)} where that is more"
        text += (
            f": the limit is max(reference × {1 + tolerance:g}, reference + {format_bytes(slack)})" if slack > tolerance else ""
        )
        base = (reference or {}).get(check.stat)
        if base is not None:
            limit = _largest_passing(check, check.stat, base, params)
            text += f". With the reference's {format_bytes(base)} on {where}: at most {format_bytes(limit)}"
        return text
    if isinstance(check, Retries):
        limit = next(n for n in range(1000) if not check.evaluate(_as_measurement({"retries": n + 1}), None, params).passed)
        return (
            "no cache-flush retry (`num_alloc_retries` is 0)"
            if limit == 0
            else f"at most {limit} cache-flush retries (`num_alloc_retries`)"
        )
    if isinstance(check, SameResults):
        given = ", ".join(f"`{k} = {v}`" for k, v in params.items())
        return (
            "every step's loss, and the final weights' sum and norm, within `atol + rtol × abs(reference)` of the "
            "reference fix's (the rule of `numpy.isclose`)" + (f", with {given}" if given else "")
        )
    return ""


# --------------------------------------------------------------------------- what the measurements mean

_PROCESS_IN_USE = re.compile(r"this process has ([\d.]+) ([KMGT]i?B) memory in use")
_FAILED_STEP = re.compile(r"asking for ([\d,.]+) MiB more with ([\d,.]+) MiB live")


def process_memory_note(ex: Exercise, row: dict) -> list[str]:
    """What the driver counted for the failed process against what the allocator reserved: memory outside the budget."""
    for label, run in runs(row):
        m = _PROCESS_IN_USE.search(run.get("message") or "")
        if not m or run.get("peak_reserved") is None:
            continue
        kind, _, name = label.partition(": ")
        label = f"the {kind} `{name}`" if name else f"the {label}"
        in_use = round(float(m.group(1)) * UNIT_BYTES[m.group(2).lower()])
        outside = in_use - run["peak_reserved"]
        if outside <= 0:
            return []
        return [
            f"When {label} failed, its message says the driver counted {m.group(1)} {m.group(2)} in use by the process "
            f"(*Including non-PyTorch memory, this process has ...*), while the allocator never reserved more than "
            f"{format_bytes(run['peak_reserved'])}: at least about {format_bytes(outside)} of the process's memory was outside "
            f"PyTorch's allocator, and so outside the {format_bytes(ex.budget_bytes)} budget, which caps only the allocator "
            f"([`set_per_process_memory_fraction`]({PYTORCH_SOURCE}c10/cuda/CUDACachingAllocator.cpp)). A GPU needs that "
            "much free on top of the budget to measure this exercise.",
            "",
        ]
    return []


def reserved_note(ex: Exercise, row: dict) -> list[str]:
    """Why the fix can reserve as much as the bug: reserved memory counts the allocator's cache."""
    bug, fix = row.get("buggy") or {}, row.get("solution") or {}
    keys = ("peak_allocated", "peak_reserved")
    if any(r.get(k) is None for r in (bug, fix) for k in keys):
        return []
    if not (fix["peak_allocated"] < bug["peak_allocated"] and fix["peak_reserved"] >= 0.98 * bug["peak_reserved"]):
        return []
    same = "the same" if fix["peak_reserved"] == bug["peak_reserved"] else "about as much"
    return [
        f"The reference fix lowers peak allocated memory ({in_mib(bug['peak_allocated'])} to {in_mib(fix['peak_allocated'])} MiB) "
        f"but reserves {same} ({in_mib(fix['peak_reserved'])} MiB, against the bug's {in_mib(bug['peak_reserved'])} MiB). "
        "Reserved memory is every segment the allocator holds, cached free ones included, and it can never exceed the "
        f"budget ({in_mib(ex.budget_bytes, 0)} MiB here): with the default settings the allocator keeps the segments that "
        "freed tensors leave and returns them to the driver only when a request cannot be served otherwise (a retry) or on "
        f"`empty_cache()` ([source]({PYTORCH_SOURCE}c10/cuda/CUDACachingAllocator.cpp)). What live tensors need at the worst "
        "moment is peak allocated, and that is what this exercise grades.",
        "",
    ]


def failed_step_note(ex: Exercise, figure: dict) -> list[str]:
    """The tool's failed-step figure against the run's peak in the measurements table."""
    m = _FAILED_STEP.search(figure.get("headline") or "")
    bug = (measured(ex.id) or {}).get("buggy") or {}
    if not m or bug.get("peak_allocated") is None:
        return []
    request, live = (float(g.replace(",", "")) for g in m.groups())
    peak = bug["peak_allocated"] / MIB
    md = [
        f"The headline's {m.group(2)} MiB is what was live in the step that failed, when it asked for {m.group(1)} MiB more: "
        f"{live + request:,.1f} MiB, over the {in_mib(ex.budget_bytes)} MiB budget."
    ]
    if peak > live + 1:
        md[0] += (
            f" The table's peak allocated for the buggy script, {peak:,.1f} MiB, is the allocator's highest figure over the "
            "whole run (`allocated_bytes.all.peak`): an earlier moment of the run went higher than the failed step did, and "
            "fit, because what it asked for came on top of less."
        )
    return md + [""]


def probes_measured(page_src_uri: str, *probes: str) -> str:
    """Where a generated page's measured facts come from, in a few words."""
    links = " and ".join(f"[`{p}.py`]({link_from(page_src_uri, f'{PROBES}/{p}.py')})" for p in probes)
    report = _state["facts"]
    if report is None:
        return f"the probes {links}, which `{site_facts.COMMAND}` runs on a CUDA GPU, have not run yet"
    return f"measured by the probes {links}, run by `{site_facts.COMMAND}` on {report.get('gpu') or '?'}, torch {report.get('torch') or '?'}"


def profile_legend(page_src_uri: str) -> list[str]:
    """What the profile chart's categories are, with the measured figures behind the "kept" band."""
    source = f"{PYTORCH_SOURCE}aten/src/ATen/cuda/CublasHandlePool.cpp"
    return [
        "**Reading the chart.** Each band is memory by what the tensor is for. The profiler's memory model "
        f"([`torch/profiler/_memory_profiler.py`]({PYTORCH_SOURCE}torch/profiler/_memory_profiler.py)) sorts tensors into "
        "parameters, gradients, optimizer state, activations, temporaries, inputs and autograd detail where it can; in a "
        "probe it named "
        f"{fact('profiler_memory_model.forward.named_fraction')} of the bytes allocated on the GPU in forward passes, "
        "so the tool names the rest by when each tensor lived: *activations* live from the forward pass into backward, "
        "*temporaries* are freed before backward, *autograd detail* is made by backward, and *kept past its step* is "
        "still live after the step that made it. With nothing leaking, that last band is library memory that lives as "
        "long as the process: the cuBLAS workspaces, which PyTorch's allocator hands to cuBLAS per thread and stream "
        f"the first time it multiplies matrices there, and keeps ([source]({source})). Backward runs on autograd's own "
        "thread, so a training step has two. Measured: "
        f"{fact('cublas_workspace.first_matmul_bytes')} at the first matrix product, "
        f"{fact('cublas_workspace.first_backward_bytes')} more at the first backward ("
        f"{probes_measured(page_src_uri, 'profiler_memory_model', 'cublas_workspace')}).",
        "",
    ]


# --------------------------------------------------------------------------- pages


def exercise_page(ex: Exercise, number: int, total: int) -> str:
    from oomlab.grading.checks import ALWAYS, CHECKS

    uri = page_uri(ex)
    script = ex.learner_path
    if not script.is_file():
        raise PluginError(f"{ex.manifest_path}: its script {script} does not exist.")
    rel_script = script.relative_to(ex.root).as_posix()
    alloc = f"`PYTORCH_CUDA_ALLOC_CONF={ex.alloc_conf}`" if ex.alloc_conf else "the defaults (no `PYTORCH_CUDA_ALLOC_CONF`)"

    md = [
        f"# {ex.title}",
        "",
        f"Exercise {number} of {total}. Workflow step: {step_tag(uri, ex)}.",
        "",
        prose(ex.summary),
        "",
        "| Exercise | |",
        "|---|---|",
        f"| Memory budget | {budget(ex)} |",
        f"| Allocator settings | {alloc} |",
        f"| Time limit | {ex.time_limit_s:g} s |",
        f"| The file you edit | `{rel_script}` |",
        "",
        *error_section(ex),
        "## Run it",
        "",
        fence(
            f"oomlab run {ex.id}     # run it under the budget\n"
            f"oomlab check {ex.id}   # grade it: the checks below\n"
            f"oomlab hint {ex.id}    # the next hint",
            "bash",
        ),
        "",
        f"## The script: `{rel_script}`",
        "",
        "As shipped. Fix it in place, without changing what it computes: the grader compares "
        "your run with a reference fix on the same GPU.",
        "",
        fence(script.read_text(encoding="utf-8"), f'python linenums="1" title="{rel_script}"'),
        "",
        "## What the grader checks",
        "",
        "Thresholds are relative to the reference fix measured on the same GPU and torch version; *passes when* is "
        "computed by the grader's own check from the settings in `exercise.toml`"
        + (
            f", with the reference's figures from `oomlab dev verify` on {measured_on(_state['report'])}."
            if measured(ex.id)
            else "."
        ),
        "",
        "| Check | Settings | Passes when | Why |",
        "|---|---|---|---|",
    ]
    row = measured(ex.id)
    reference = (row or {}).get("solution")
    where = measured_on(_state["report"]) if row else ""
    for name in [*ALWAYS, *(n for n in ex.checks if n not in ALWAYS)]:
        given = ex.checks.get(name, {})
        params = ", ".join(f"{k} = {v}" for k, v in given.items()) or "-"
        symptom = " (the seeded bug fails this one)" if name == ex.symptom else ""
        rule = passes_when(name, given, reference, where) or "-"
        md.append(f"| `{name}`{symptom} | {cell(params)} | {cell(rule)} | {cell(CHECKS[name].why)} |")

    md += [
        "",
        "## Hints",
        "",
        f"Open them in order, and only as far as you need; `oomlab hint {ex.id}` gives the same hints.",
        "",
    ]
    for i, hint in enumerate(ex.hints, 1):
        md += [f'??? hint "Hint {i} of {len(ex.hints)}"', "", "    " + prose(hint), ""]

    # In the order a learner needs them: what the tool finds, then the fix, then the measurements that compare them.
    md += figure_section(ex)
    md += fix_section(ex)
    md += measurement_section(ex)
    md += wrong_fix_section(ex)
    md += alternatives_section(ex)
    md += interview_section(ex)
    return FRONT_MATTER + "\n".join(md) + "\n"


FIX_FOLD = "The reference fix, as a change of the script above"


def script_diff(ex: Exercise) -> str:
    """The reference fix as a unified diff of the shipped script, with line numbers of both in its hunk headers."""
    old = ex.learner_path.read_text(encoding="utf-8").splitlines()
    new = ex.solution_path.read_text(encoding="utf-8").splitlines()
    name = ex.learner_path.relative_to(ex.root).as_posix()
    fixed = ex.solution_path.relative_to(ex.root).as_posix() if ex.solution_path.is_relative_to(ex.root) else name
    return "\n".join(difflib.unified_diff(old, new, name, fixed, lineterm="", n=3))


def fix_section(ex: Exercise) -> list[str]:
    """The reference fix, folded: a diff whose comments say why each changed line is there."""
    if not ex.solution_path.is_file():
        return []
    return [
        "## The fix",
        "",
        "Open it once your own fix passes, or when the hints and the tool have not got you there. The comments at the "
        f"changed lines say why. In the terminal, `oomlab solution {ex.id}` shows it once your version passes.",
        "",
        f'??? success "{FIX_FOLD}"',
        "",
        *indented(fence(script_diff(ex), "diff")),
        "",
        *compare_fold(
            _state["figures"].get("compares", {}).get(ex.id),
            ex.id,
            ex.solution_path.relative_to(ex.root).as_posix(),
            page_uri(ex),
            drawn_on(_state["figures"]),
        ),
    ]


def drawn_on(index: dict) -> str:
    """Where and when ``oomlab dev figures`` drew ``figures.json``: ``NVIDIA H200, torch 2.11.0, 2026-12-02``."""
    return f"{index.get('gpu', '?')}, torch {index.get('torch', '?')}, {str(index.get('created', '?'))[:10]}"


def measurement_section(ex: Exercise) -> list[str]:
    report, row = _state["report"], measured(ex.id)
    uri = page_uri(ex)
    if row is None:
        why = _state["report_problem"] or f"course/{VERIFY_JSON} has no entry for `{ex.id}` yet."
        return [
            "## Measured",
            "",
            '!!! info "Not measured yet"',
            "",
            f"    {why} `oomlab dev verify` on a CUDA GPU measures the buggy script, the reference fix, each wrong fix and each generic cheat.",
            "",
        ]
    md = [
        f"## Measured on {measured_on(report)}",
        "",
        f"From `oomlab dev verify`, {measured_date(report)}, CUDA {report.get('cuda') or '?'}; "
        f"[all exercises]({link_from(uri, 'measurements.md')}). "
        "Peaks in MiB; *non-releasable* is the peak of `inactive_split_bytes`, free memory inside segments "
        "that a live block pins; *retries* counts the times the allocator freed its cache and tried again. "
        "A run that ran out of memory has the peaks it reached up to the failed allocation.",
        "",
    ]
    for problem in staleness(ex, row):
        md += [
            '!!! warning "Measured on an older version of this exercise"',
            "",
            f"    {upper_first(problem)}: run `oomlab dev verify` again.",
            "",
        ]
    chart = peaks_chart(runs(row), ex.budget_bytes)
    if chart:
        md += [
            chart,
            "",
            "Each run's peak allocated memory (live tensors, dark) inside its peak reserved memory (the allocator's "
            "cache, light), against the budget (dashed).",
            "",
        ]
    md += [RUN_HEADER, *(run_row(label, run) for label, run in runs(row)), ""]
    for note in expectation_notes(row):
        md += ['!!! warning "Unexpected result"', "", f"    {upper_first(note)}", ""]

    md += process_memory_note(ex, row)
    md += reserved_note(ex, row)
    return md


def recorded_error(buggy: dict) -> list[str]:
    """A recorded OOM message as a learner running alone meets it, and a note on what was left out."""
    shown, others = learner_view(buggy["message"])
    # One long line, as a terminal shows it: the page's style sheet wraps it at the column's width, whatever that is.
    md = [fence(shown, "{ .text .oomlab-message }"), ""]
    if others:
        jobs = (_state["report"] or {}).get("jobs")
        md += [
            f"Left out: the lines of {others} other process(es), the runs that `oomlab dev verify` measured beside it"
            + (f", {jobs} at a time" if jobs else "")
            + ". Run alone, the driver names only yours (*Including non-PyTorch memory, this process has …*), and *of "
            "which … is free* no longer counts what they held.",
            "",
        ]
    return md


def error_section(ex: Exercise) -> list[str]:
    """The error the shipped script ends with on the GPU, as the learner meets it: the page's first clue."""
    buggy = (measured(ex.id) or {}).get("buggy") or {}
    if not buggy.get("message"):
        return []
    where = f" at `{buggy['where']}`" if buggy.get("where") else ""
    return [
        "## What you will see",
        "",
        f"The shipped script, run under the budget on {measured_on(_state['report'])}, ends with this error{where}:",
        "",
        *recorded_error(buggy),
    ]


OOM_MESSAGE_MARKER = re.compile(r"<!--\s*oomlab:oom-message\s+([\w-]+)\s*-->")


def oom_message_section(src_uri: str, exercise_id: str) -> str:
    """A hand-written page's marker: one exercise's recorded error, whole, and each of its clauses explained."""
    ex = next((ex for ex in _state["exercises"] if ex.id == exercise_id), None)
    if ex is None:
        raise PluginError(f"course/{src_uri}: oomlab:oom-message names {exercise_id!r}, which is not an exercise.")
    buggy = (measured(ex.id) or {}).get("buggy") or {}
    if not buggy.get("message"):
        return f"*(The error of [{ex.title}]({link_from(src_uri, page_uri(ex))}) is not measured yet: `oomlab dev verify` on a GPU.)*"
    links = {
        "sizes": link_from(src_uri, "allocator.md") + "#sizes-pools-and-segments",
        "fraction": link_from(src_uri, "allocator.md") + "#memory-fraction",
        "expandable": link_from(src_uri, "allocator.md") + "#allocator-settings",
    }
    md = [
        f"The shipped script of [{ex.title}]({link_from(src_uri, page_uri(ex))}), run under its budget on "
        f"{measured_on(_state['report'])}, ended with:",
        "",
        *recorded_error(buggy),
        "Clause by clause:",
        "",
        *annotated(buggy["message"], links),  # the other processes' lines match no clause
    ]
    return "\n".join(md)


def figure_section(ex: Exercise) -> list[str]:
    """The pictures `oomlab dev figures` drew for this exercise, with the tool's own one-line finding."""
    index = _state["figures"]
    shown = [f for f in index.get("figures", {}).values() if f.get("exercise") == ex.id and f.get("files")]
    if not shown:
        return []
    uri = page_uri(ex)
    tool = shown[0]["tool"]
    md = [
        f"## What `oomlab {tool}` shows",
        "",
        f"Run `oomlab {tool} {ex.id}` yourself first: what it finds is most of the answer. "
        f"Drawn by `oomlab dev figures` on {drawn_on(index)}: the tool run on the buggy script and on the reference fix.",
        "",
    ]
    body: list[str] = []
    if tool == "profile":
        body += profile_legend(uri)
    for figure in sorted(shown, key=lambda f: f["variant"] != "bug"):
        label = "The buggy script" if figure["variant"] == "bug" else "The reference fix"
        body += [f"**{label}.** The tool's finding, as it printed it:", "", "> " + escaped(figure.get("headline") or ""), ""]
        if figure["variant"] == "bug":
            body += failed_step_note(ex, figure)
        for name in figure["files"]:
            body += [picture(uri, name, f"{label}: {name}"), ""]
        if figure.get("snapshot"):
            body += [
                f"[Download this snapshot]({link_from(uri, 'figures/' + figure['snapshot'])}) and drop it on "
                "[pytorch.org/memory_viz](https://pytorch.org/memory_viz), PyTorch's own viewer, to explore every "
                "block and its stack yourself; `oomlab snapshot FILE.pickle` reads it offline.",
                "",
            ]
    md += ['??? example "What it found, with the pictures"', "", *indented("\n".join(body)), ""]
    return md


def wrong_fix_section(ex: Exercise) -> list[str]:
    """The tempting fixes from the manifest, each with why it fails and, if measured, whether it did."""
    if not ex.wrong_fixes:
        return []
    row = measured(ex.id) or {}
    fixes = {f.get("name"): f for f in row.get("wrong_fixes") or []}
    md = [
        "## Tempting fixes that do not work",
        "",
        "Each is an edit of the buggy script that the course measures, and the check that catches it.",
        "",
    ]
    for fix in ex.wrong_fixes:
        run = fixes.get(fix.name)
        result = ""
        if run:
            caught = fix.expect in (run.get("failed_checks") or [])
            result = f" Measured: {'fails' if caught else 'does NOT fail'} `{fix.expect}`."
        md += [f'??? failure "`{fix.name}`: caught by `{fix.expect}`"', "", f"    {prose(fix.why)}{result}", ""]
        md += folded_edits(fix)
    return md


def folded_edits(fix) -> list[str]:
    """A fix's edits of the buggy script, as diffs inside its fold."""
    md = []
    for edit in fix.edits:
        md += [*indented(fence(edit_diff(edit), "diff")), ""]
    return md


def alternatives_section(ex: Exercise) -> list[str]:
    """The other honest fixes the grader accepts, each with whether the course measured it passing."""
    if not ex.alternatives:
        return []
    row = measured(ex.id) or {}
    runs = {f.get("name"): f for f in row.get("alternatives") or []}
    md = ["## Other fixes the grader accepts", "", "Each is an edit of the buggy script that the course measures passing.", ""]
    for alt in ex.alternatives:
        run = runs.get(alt.name)
        result = f" Measured: {'passes' if run.get('verdict') == 'pass' else 'does NOT pass'}." if run else ""
        md += [f'??? success "`{alt.name}`"', "", f"    {prose(alt.why)}{result}", "", *folded_edits(alt)]
    return md


def interview_section(ex: Exercise) -> list[str]:
    """The exercise's interview question, its model answer folded until asked for."""
    answer = "\n\n".join(prose(p) for p in ex.interview.answer.split("\n\n") if p.strip())
    md = [
        "## In an interview",
        "",
        f"> {prose(ex.interview.question)}",
        "",
        '??? question "A model answer (about two minutes)"',
        "",
    ]
    md += indented(answer)
    return md + [""]


def measurements_page() -> str:
    report = _state["report"]
    md = [FRONT_MATTER + "# Measurements", ""]
    if report is None:
        return "\n".join(md + ['!!! info "Not measured yet"', "", f"    {_state['report_problem']}", ""]) + "\n"
    md += [
        f"Every figure below comes from [`{VERIFY_JSON}`]({VERIFY_JSON}), the report `oomlab dev verify` wrote.",
        "",
        "| Report | |",
        "|---|---|",
        f"| GPU | {cell(str(report.get('gpu')))} |",
        f"| torch | {cell(str(report.get('torch')))} |",
        f"| CUDA | {cell(str(report.get('cuda')))} |",
        f"| Date | {measured_date(report)} |",
        f"| Wall time | {report.get('wall_s', 'n/a')} s for {report.get('runs', 'n/a')} runs, {report.get('jobs', 1)} at a time"
        f"{in_sittings(report)} |",
        f"| Every run as expected | {'yes' if report.get('ok') else 'no'} |",
        "",
        (
            "Each run is a process of its own under the exercise's budget, forked from a warm server that imported "
            "torch once but never touched CUDA, so its allocator starts empty as a fresh process's does. "
            if report.get("runner") == "forked"
            else "Each run is a fresh process under the exercise's budget. "
        )
        + "*Peak allocated* is the allocator's "
        "`allocated_bytes.all.peak`, *peak reserved* `reserved_bytes.all.peak`, *non-releasable* "
        "`inactive_split_bytes.all.peak` (the *Non-releasable memory* row of `torch.cuda.memory_summary()`), "
        "*retries* `num_alloc_retries`. Peaks in MiB. A run that ran out of memory has the peaks it "
        "reached up to the failed allocation.",
        "",
    ]
    for number, ex in enumerate(_state["exercises"], 1):
        link = page_uri(ex)
        row = measured(ex.id)
        md += [f"## {number}. [{ex.title}]({link})", ""]
        if row is None:
            md += [f"Not in this report. Budget {budget(ex)}.", ""]
            continue
        md += [f"Budget {budget(ex)}.", ""]
        for problem in staleness(ex, row):
            md += ['!!! warning "Measured on an older version"', "", f"    {upper_first(problem)}.", ""]
        md += [RUN_HEADER, *(run_row(label, r) for label, r in runs(row, cheats=True)), ""]
        for note in expectation_notes(row):
            md += ['!!! warning "Unexpected result"', "", f"    {upper_first(note)}", ""]
    known = {ex.id for ex in _state["exercises"]}
    extra = [row.get("id") for row in report["exercises"] if row.get("id") not in known]
    if extra:
        md += ["The report also lists exercises the course no longer has: " + ", ".join(f"`{e}`" for e in extra) + ".", ""]
    md += equivalence_section(_state["equivalence"]) + speed_section(_state["speed"])
    md += witness_section(report, _state["speed"])
    return "\n".join(md) + "\n"


def in_sittings(report: dict) -> str:
    """How many sittings of some exercises each a report's wall time adds up (``--exercise``), where more than one."""
    n = report.get("sittings", 1)
    return f", in {n} sittings of some exercises each" if n > 1 else ""


def equivalence_section(report: dict | None) -> list[str]:
    """Whether a run forked from a warm server measures what a fresh process measures, from ``equivalence.json``."""
    md = ["## Forked and fresh runs", ""]
    if report is None:
        return md + ["Not compared yet: on a CUDA GPU, `make equivalence` (`oomlab dev equivalence`) compares them.", ""]
    differ = [f"{r['exercise']} {r['run']}" for r in report["rows"] if not r["equal"]]
    md += [
        f"[`{EQUIVALENCE_JSON}`]({EQUIVALENCE_JSON}) holds every run of the course measured twice on "
        f"{measured_on(report)}, {measured_date(report)}: in a fresh process and forked from a warm server. "
        f"Of {report['runs']} runs, {report['runs'] - len(differ)} gave the same verdict, workload and allocator "
        f"figures both ways (all {len(STAT_FIGURES)} that the course reads from `memory_stats()`, those above among "
        "them). The whole course took "
        f"{report['fresh_wall_s']} s fresh and {report['forked_wall_s']} s forked, {report.get('jobs', 1)} runs at a time"
        f"{in_sittings(report)}.",
        "",
    ]
    if differ:
        verdicts = [r for r in report["rows"] if r["fresh"]["verdict"] != r["forked"]["verdict"]]
        same = "none of them got another verdict" if not verdicts else f"{len(verdicts)} got another verdict"
        md += [
            '!!! warning "Runs that differ"',
            "",
            "    " + cell(", ".join(differ)) + f": in a figure, the final state or the workload's last bits; {same}.",
            "",
        ]
    return md


SPEED_COLUMNS = (  # (speed.json key, column heading)
    ("plain_s", "`python train.py` (fix)"),
    ("check_cold_s", "`oomlab check`"),
    ("recheck_warm_s", "re-check under `watch`"),
    ("plain_bug_s", "`python train.py` (bug)"),
    ("snapshot_s", "`snapshot`"),
    ("hunt_s", "`hunt`"),
    ("profile_s", "`profile`"),
    ("diagnose_s", "`diagnose`"),
)
TARGETS = {
    "recheck_warm_under_2_s": "a re-check under `watch` takes under 2 s",
    "check_cold_within_plain_plus_1_5_s": "`oomlab check` takes at most 1.5 s more than `python train.py`",
    "diagnose_within_2x_plain": "`diagnose` takes at most twice the plain run",
    "verify_under_30_s": "the whole `oomlab dev verify` takes under 30 s",
    "class_of_50_under_5_min": "a class of 50 is graded in under 5 minutes",
}


def speed_section(report: dict | None) -> list[str]:
    """How long a learner waits for each command, from ``speed.json``."""
    md = ["## How long a learner waits", ""]
    if report is None:
        return md + ["Not timed yet: on a CUDA GPU, `make bench` (`oomlab dev bench`) times every command.", ""]
    md += [
        f"Seconds of wall time, each the median of {report.get('repeat', 3)} runs in one sitting, from "
        f"[`{SPEED_JSON}`]({SPEED_JSON}), which `oomlab dev bench` wrote on {measured_on(report)}. Each command is "
        "run as a learner types it, in a course folder made by `oomlab init`; the reference is already cached for "
        "`check`. The tools run on the exercise as shipped, under its budget.",
        "",
        "| Exercise | " + " | ".join(heading for _, heading in SPEED_COLUMNS) + " |",
        "|---|" + "---:|" * len(SPEED_COLUMNS),
    ]
    for row in report.get("exercises", []):
        md.append(f"| {cell(row['id'])} | " + " | ".join(_seconds(row.get(k)) for k, _ in SPEED_COLUMNS) + " |")
    if report.get("scripts"):
        md += [
            "",
            "Scripts that are not in the course, run uncapped: `long_history.py` trains for 840 optimizer steps and "
            f"keeps each step's logits in a dict. The profiler follows its first {step('profile').options['max_steps']} steps "
            "(`--all-steps`: all of them).",
            "",
            "| Script | `python` | `snapshot` | `hunt` | `profile` | `diagnose` |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for row in report["scripts"]:
            keys = ("plain_s", "snapshot_s", "hunt_s", "profile_s", "diagnose_s")
            md.append(f"| {cell(row['id'])} | " + " | ".join(_seconds(row.get(k)) for k in keys) + " |")
    stale = {}  # target -> why its figure is not the current course's
    if "verify_wall_s" in report:
        md += [
            "",
            f"The whole `oomlab dev verify`: {report['verify_wall_s']} s for {report['verify_runs']} runs, "
            f"{report['verify_parallel']} at a time.",
        ]
        verify = _state["report"] or {}
        if verify.get("runs") and verify["runs"] != report["verify_runs"]:
            stale["verify_under_30_s"] = f"not timed on this course: {report['verify_runs']} of its {verify['runs']} runs"
            md[-1] += (
                f" That was on {str(report.get('verify_created', '?'))[:10]}, when the course had {report['verify_runs']} "
                f"runs; it has {verify['runs']} now, and the last `oomlab dev verify` ([`{VERIFY_JSON}`]({VERIFY_JSON})) "
                f"ran them in {verify.get('wall_s', '?')} s, {verify.get('jobs', '?')} at a time."
            )
    md += class_section(report.get("class"))
    md += oom_hook_section(report.get("oom_hook"), measured_on(report.get("oom_hook") or {}))
    md += big_snapshot_section(report.get("big_snapshot"), measured_on(report.get("big_snapshot") or {}))
    md += ["", "| Target | Met |", "|---|---|"]
    md += [
        f"| {TARGETS.get(name, cell(name))} | {stale.get(name, 'yes' if met else '**no**')} |"
        for name, met in report.get("targets", {}).items()
    ]
    return md + [""]


def class_section(row: dict | None) -> list[str]:
    """How long `oomlab nbgrader autograde` took for a class the benchmark made from the exercises' own variants."""
    if row is None:
        return []
    verdicts = (
        "every score as its variant predicts (the fixes earn every memory point, the rest do not)"
        if row["verdicts_as_expected"]
        else f"**{len(row['unexpected'])} score(s) not as predicted**"
    )
    return [
        "",
        "### Grading a class",
        "",
        f"`oomlab nbgrader autograde {row['assignment']}` for a class of {row['students']} "
        f"({row['notebooks']} notebooks, each student submitting the reference fix, the bug, a wrong fix or an "
        f"accepted alternative of each exercise): {row['wall_s']} s in all on {measured_on(row)}. Measuring the "
        f"{row['scripts_measured']} distinct scripts took {row['measure_s']} s, then nbgrader took {row['autograde_s']} s, "
        f"{row['jobs']} students at a time; {verdicts}.",
    ]


def _seconds(value) -> str:
    return "" if value is None else f"{value:.1f}"


def diagram(page_src_uri: str, name: str) -> str:
    if name not in DIAGRAMS:
        raise PluginError(f"course/{page_src_uri}: no diagram {name!r}; the diagrams are {', '.join(DIAGRAMS)}.")
    return DIAGRAMS[name]()


def figure_image(page_src_uri: str, name: str, alt: str) -> str:
    """A picture from course/figures/ that figures.json lists, or a line saying what will draw it."""
    drawn = {f for figure in _state["figures"].get("figures", {}).values() for f in figure.get("files") or []}
    if name not in drawn:
        return f"*(The picture {name} is not drawn yet: on a CUDA GPU, `oomlab dev figures` draws it.)*"
    return picture(page_src_uri, name, alt)


def exercise_list(page_src_uri: str, step_name: str | None) -> str:
    exercises = _state["exercises"]
    if step_name is not None:
        if step_name not in STEP_NAMES:
            raise PluginError(
                f"{page_src_uri}: unknown step {step_name!r} in an oomlab:exercises marker; use one of {', '.join(STEP_NAMES)}."
            )
        chosen = [(n, ex) for n, ex in enumerate(exercises, 1) if ex.step == step_name]
        items = [f"    - Exercise {n}: [{ex.title}]({link_from(page_src_uri, page_uri(ex))})" for n, ex in chosen]
        return '!!! example "Practise this step"\n\n' + ("\n".join(items) or "    No exercise teaches this step yet.")
    return exercise_table(page_src_uri, list(enumerate(exercises, 1)))


# --------------------------------------------------------------------------- hooks


def on_config(config):
    from oomlab.course import Course

    root = Path(config.config_file_path).resolve().parent
    try:
        _state["exercises"] = Course(root, working_tree=True).exercises  # the pages show the manifests as edited
    except OomLabError as err:
        raise PluginError(str(err)) from None
    _state["report"], _state["report_problem"] = load_report(Path(config.docs_dir))
    docs = Path(config.docs_dir)
    try:
        _state["facts"] = site_facts.load(docs / FACTS_JSON)
        _state["probes"] = {p.name: p for p in site_facts.find_probes(docs / PROBES)}
    except ValueError as err:
        raise PluginError(f"course/{FACTS_JSON} is not a facts report: {err}") from None
    except OomLabError as err:
        raise PluginError(str(err)) from None
    _state["derived"] = derived_facts(_state["exercises"], _state["facts"])
    if _state["facts"] is None:
        log.info(f"There is no {FACTS_JSON} yet: on a CUDA GPU, `{site_facts.COMMAND}` writes it.")
    for key, name in (("speed", SPEED_JSON), ("equivalence", EQUIVALENCE_JSON)):
        path = docs / name
        try:
            _state[key] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except ValueError as err:
            raise PluginError(f"course/{name} is not valid JSON: {err}") from None
    figures = Path(config.docs_dir) / FIGURES_JSON
    _state["figures"] = json.loads(figures.read_text(encoding="utf-8")) if figures.is_file() else {}
    if _state["report_problem"]:
        log.info(_state["report_problem"])

    entries = [
        {module.title: [{"About this module": module_uri(module)}, *({ex.title: page_uri(ex)} for _, ex in chosen)]}
        for module, chosen in taught(_state["exercises"])
    ]
    nav = config.nav
    if nav is not None:
        slot = next((item for item in nav if isinstance(item, dict) and "Exercises" in item), None)
        if slot is None:
            nav.append({"Exercises": entries})
        elif not slot["Exercises"]:
            slot["Exercises"] = entries
    return config


def on_files(files, config):
    modules = [m for m, _ in taught(_state["exercises"])]
    for uri in [*(page_uri(ex) for ex in _state["exercises"]), *map(module_uri, modules), "measurements.md", CLI_PAGE]:
        if files.get_file_from_path(uri) is not None:
            raise PluginError(f"course/{uri} exists, but the site generates that page: remove the file.")
    total = len(_state["exercises"])
    for number, ex in enumerate(_state["exercises"], 1):
        files.append(File.generated(config, page_uri(ex), content=exercise_page(ex, number, total)))
    for module in modules:
        files.append(File.generated(config, module_uri(module), content=module_page(module, _state["exercises"])))
    files.append(File.generated(config, "measurements.md", content=measurements_page()))
    files.append(File.generated(config, CLI_PAGE, content=FRONT_MATTER + cli_reference()))
    return files


def on_page_markdown(markdown, page, config, files):
    if "oomlab:figure" in markdown:
        markdown = FIGURE_MARKER.sub(lambda m: figure_image(page.file.src_uri, m["file"], m["alt"]), markdown)
    if "oomlab:diagram" in markdown:
        markdown = DIAGRAM_MARKER.sub(lambda m: diagram(page.file.src_uri, m.group(1)), markdown)
    if MODULES_MARKER in markdown:
        markdown = markdown.replace(MODULES_MARKER, modules_overview(page.file.src_uri, _state["exercises"], _state["speed"]))
    if "oomlab:exercises" in markdown:
        markdown = MARKER.sub(lambda m: exercise_list(page.file.src_uri, m.group(1)), markdown)
    if "oomlab:oom-message" in markdown:
        markdown = OOM_MESSAGE_MARKER.sub(lambda m: oom_message_section(page.file.src_uri, m.group(1)), markdown)
    charted: list[str] = []
    if "oomlab:chart" in markdown:
        markdown = CHART_MARKER.sub(lambda m: chart_section(page.file.src_uri, m.group(1), charted), markdown)
    if "oomlab:fact" in markdown or charted:
        markdown = render_facts(markdown, page.file.src_uri, charted)
    return markdown
