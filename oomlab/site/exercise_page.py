"""The page of one exercise, ``exercises/<id>.md``, generated from its manifest, its scripts and the reports.

In the order a learner needs it: the exercise (budget, allocator settings, the file to edit),
the error the shipped script ends with, the commands, the script itself, what the grader checks
(each threshold in words, from the grader's own check: ``Check.passes_when``), the hints,
what the step's tool showed on the bug and on the fix (``figures.json``) and, where it was drawn,
PyTorch's own memory viewer on the same snapshot (``viewer-shots.json``), the reference fix
folded away with what it changed (:mod:`oomlab.site.compare_fold`), the measured runs
(``verify.json``), the tempting fixes that fail, the other fixes that pass, and the interview
question. The manifest's text is shown as written; every figure comes from a report, passed in
as :class:`~oomlab.site.reports.Reports`, so none is typed here.
"""

from __future__ import annotations

import difflib
import re

from mkdocs.exceptions import PluginError

from oomlab.course.manifest import CHECK_WAIT_S, Exercise
from oomlab.site import facts as site_facts
from oomlab.site.charts import peaks_chart
from oomlab.site.compare_fold import compare_fold
from oomlab.site.markdown import FRONT_MATTER, cell, escaped, indented, link_from, picture
from oomlab.site.measured_runs import RUN_HEADER, budget, expectation_notes, run_row, runs, staleness, upper_first
from oomlab.site.module_pages import page_uri, step_tag
from oomlab.site.oom_message import learner_view
from oomlab.site.reports import PROBES, VERIFY_JSON, Reports, drawn_on, measured_date, measured_on
from oomlab.site.viewer_shots import SHOTS
from oomlab.units import MIB, UNIT_BYTES, format_bytes, in_mib

__all__ = ["ESTIMATE_FOLD", "FIX_FOLD", "exercise_page", "recorded_error"]

PYTORCH_SOURCE = "https://github.com/pytorch/pytorch/blob/main/"

# --------------------------------------------------------------------------- formatting

_CODE_LIKE = re.compile(
    r"\.?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*\((?:[^()]|\([^()]*\))*\)"  # calls: f(x), a.b(c=[1, 2])
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+"  # dotted names: torch.empty
    r"|[A-Za-z]\w*_\w+"  # snake_case names: self_cuda_memory_usage
)
_NOT_CODE = {"e.g", "i.e"}


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


# --------------------------------------------------------------------------- facts.json


def fact(name: str, reports: Reports) -> str:
    """One measured fact as a page shows it (for the generated pages; hand-written ones use the marker)."""
    try:
        value = site_facts.lookup(reports.facts, name, reports.probes)
    except site_facts.UnknownFact as err:
        raise PluginError(f"oomlab/site/exercise_page.py: {err}") from None
    return value if value is site_facts.NOT_MEASURED else site_facts.format_value(name, value)


# --------------------------------------------------------------------------- what the measurements mean

_PROCESS_IN_USE = re.compile(r"this process has ([\d.]+) ([KMGT]i?B) memory in use")


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


def failed_step_note(ex: Exercise, figure: dict, reports: Reports) -> list[str]:
    """The tool's failed-step figures (the profile tool's ``failure``) against the run's peak in the measurements table."""
    failure = figure.get("failure") or {}
    live, request = failure.get("live_bytes"), failure.get("request_bytes")
    bug = (reports.measured(ex.id) or {}).get("buggy") or {}
    if live is None or not request or bug.get("peak_allocated") is None:
        return []  # the headline names no request to set against the peak
    peak = bug["peak_allocated"]
    md = [
        f"The headline's {format_bytes(live)} is what was live in the step that failed, when it asked for "
        f"{format_bytes(request)} more: {format_bytes(live + request)}, over the {format_bytes(ex.budget_bytes)} budget."
    ]
    if peak > live + MIB:  # over a MiB higher: an earlier moment than the failed step set the peak
        md[0] += (
            f" The table's peak allocated for the buggy script, {format_bytes(peak)}, is the allocator's highest figure over "
            "the whole run (`allocated_bytes.all.peak`): an earlier moment of the run went higher than the failed step did, "
            "and fit, because what it asked for came on top of less."
        )
    return md + [""]


def probes_measured(page_src_uri: str, reports: Reports, *probes: str) -> str:
    """Where a generated page's measured facts come from, in a few words."""
    links = " and ".join(f"[`{p}.py`]({link_from(page_src_uri, f'{PROBES}/{p}.py')})" for p in probes)
    report = reports.facts
    if report is None:
        return f"the probes {links}, which `{site_facts.COMMAND}` runs on a CUDA GPU, have not run yet"
    return f"measured by the probes {links}, run by `{site_facts.COMMAND}` on {report.get('gpu') or '?'}, torch {report.get('torch') or '?'}"


def profile_legend(page_src_uri: str, reports: Reports) -> list[str]:
    """What the profile chart's categories are, with the measured figures behind the "kept" band."""
    source = f"{PYTORCH_SOURCE}aten/src/ATen/cuda/CublasHandlePool.cpp"
    return [
        "**Reading the chart.** Each band is memory by what the tensor is for. The profiler's memory model "
        f"([`torch/profiler/_memory_profiler.py`]({PYTORCH_SOURCE}torch/profiler/_memory_profiler.py)) sorts tensors into "
        "parameters, gradients, optimizer state, activations, temporaries, inputs and autograd detail where it can; in a "
        "probe it named "
        f"{fact('profiler_memory_model.forward.named_fraction', reports)} of the bytes allocated on the GPU in forward passes, "
        "so the tool names the rest by when each tensor lived: *activations* live from the forward pass into backward, "
        "*temporaries* are freed before backward, *autograd detail* is made by backward, and *kept past its step* is "
        "still live after the step that made it. With nothing leaking, that last band is library memory that lives as "
        "long as the process: the cuBLAS workspaces, which PyTorch's allocator hands to cuBLAS per thread and stream "
        f"the first time it multiplies matrices there, and keeps ([source]({source})). Backward runs on autograd's own "
        "thread, so a training step has two. Measured: "
        f"{fact('cublas_workspace.first_matmul_bytes', reports)} at the first matrix product, "
        f"{fact('cublas_workspace.first_backward_bytes', reports)} more at the first backward ("
        f"{probes_measured(page_src_uri, reports, 'profiler_memory_model', 'cublas_workspace')}).",
        "",
    ]


# --------------------------------------------------------------------------- pages


def check_time_row(ex: Exercise, reports: Reports, why: str = "") -> list[str]:
    """How long `oomlab check` of the fix takes, where ``oomlab dev bench`` timed it; and why, where it is long (``why``,
    or the manifest's ``long_check``)."""
    from oomlab.bench import check_rows, learner_check_s

    row = check_rows(reports.speed or {}).get(ex.id)
    seconds = learner_check_s(row or {})
    if row is None or not isinstance(seconds, (int, float)):
        return []
    first = row.get("check_cold_s") if "check_kept_s" in row else None
    text = (
        f"{seconds:.1f} s on {measured_on(row)}, "
        + ("grading the reference estimator" if ex.is_estimate else "the reference cached")
        + (f" (the first check of a sitting, which imports torch: {first:.1f} s)" if first is not None else "")
        + f" ([how long a learner waits]({link_from(page_uri(ex), 'measurements.md#how-long-a-learner-waits')}))"
    )
    why = why or ex.long_check
    if seconds > CHECK_WAIT_S:
        if not why:
            raise PluginError(
                f"{ex.manifest_path}: `oomlab check` takes {seconds:.1f} s here, more than {CHECK_WAIT_S} s: say why in "
                "its long_check, or make the check shorter."
            )
        text += f". Longer than most: {why}"
    return [f"| `oomlab check` takes | {cell(text)} |"]


def exercise_page(ex: Exercise, number: int, total: int, reports: Reports) -> str:
    """The whole page of exercise ``number`` of ``total``, as Markdown."""
    from oomlab.grading.checks import ALWAYS, CHECKS

    if ex.is_estimate:  # no budget, no run of a script: a page of its own
        from oomlab.site.estimate_page import estimate_page

        return estimate_page(ex, number, total, reports)

    script = ex.learner_path
    if not script.is_file():
        raise PluginError(f"{ex.manifest_path}: its script {script} does not exist.")
    rel_script = script.relative_to(ex.root).as_posix()
    alloc = f"`PYTORCH_CUDA_ALLOC_CONF={ex.alloc_conf}`" if ex.alloc_conf else "the defaults (no `PYTORCH_CUDA_ALLOC_CONF`)"

    md = [
        *page_head(ex, number, total),
        f"| Memory budget | {budget(ex)} |",
        f"| Allocator settings | {alloc} |",
        f"| Time limit | {ex.time_limit_s:g} s |",
        *check_time_row(ex, reports),
        f"| The file you edit | `{rel_script}` |",
        "",
        *error_section(ex, reports),
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
            f", with the reference's figures from `oomlab dev verify` on {measured_on(reports.verify)}."
            if reports.measured(ex.id)
            else "."
        ),
        "",
        "| Check | Settings | Passes when | Why |",
        "|---|---|---|---|",
    ]
    row = reports.measured(ex.id)
    reference = (row or {}).get("solution")
    where = measured_on(reports.verify) if row else ""
    for name in [*ALWAYS, *(n for n in ex.checks if n not in ALWAYS)]:
        given = ex.checks.get(name, {})
        params = ", ".join(f"{k} = {v}" for k, v in given.items()) or "-"
        symptom = " (the seeded bug fails this one)" if name == ex.symptom else ""
        rule = CHECKS[name].passes_when(given, reference, where) or "-"
        md.append(f"| `{name}`{symptom} | {cell(params)} | {cell(rule)} | {cell(CHECKS[name].why)} |")

    md += ["", *hints_section(ex)]

    # In the order a learner needs them: what the tool finds, then the fix, then the measurements that compare them.
    md += figure_section(ex, reports)
    md += fix_section(ex, reports)
    md += measurement_section(ex, reports)
    md += wrong_fix_section(ex, reports)
    md += alternatives_section(ex, reports)
    md += interview_section(ex)
    return FRONT_MATTER + "\n".join(md) + "\n"


FIX_FOLD = "The reference fix, as a change of the script above"
ESTIMATE_FOLD = "The reference estimator, as a change of the estimator above"  # an estimate exercise's FIX_FOLD


def script_diff(ex: Exercise) -> str:
    """The reference fix as a unified diff of the shipped script, with line numbers of both in its hunk headers."""
    old = ex.learner_path.read_text(encoding="utf-8").splitlines()
    new = ex.solution_path.read_text(encoding="utf-8").splitlines()
    name = ex.learner_path.relative_to(ex.root).as_posix()
    fixed = ex.solution_path.relative_to(ex.root).as_posix() if ex.solution_path.is_relative_to(ex.root) else name
    return "\n".join(difflib.unified_diff(old, new, name, fixed, lineterm="", n=3))


def fix_section(ex: Exercise, reports: Reports) -> list[str]:
    """The reference fix (an estimate exercise's: its reference estimator), folded: a diff whose comments say why each
    changed line is there."""
    if not ex.solution_path.is_file():
        return []
    md = [
        "## The reference estimator" if ex.is_estimate else "## The fix",
        "",
        f"Open it once your own {'estimate' if ex.is_estimate else 'fix'} passes, or when the hints"
        f"{'' if ex.is_estimate else ' and the tool'} have not got you there. The comments at the changed lines say why. In the terminal, `oomlab solution {ex.id}` shows it once "
        "your version passes.",
        "",
        f'??? success "{ESTIMATE_FOLD if ex.is_estimate else FIX_FOLD}"',
        "",
        *indented(fence(script_diff(ex), "diff")),
        "",
    ]
    if ex.is_estimate:  # nothing of it runs: no tool's figures to compare
        return md
    return [
        *md,
        *compare_fold(
            reports.figures.get("compares", {}).get(ex.id),
            ex.id,
            ex.solution_path.relative_to(ex.root).as_posix(),
            page_uri(ex),
            drawn_on(reports.figures),
        ),
    ]


def measurement_section(ex: Exercise, reports: Reports) -> list[str]:
    report, row = reports.verify, reports.measured(ex.id)
    uri = page_uri(ex)
    if row is None:
        why = reports.verify_problem or f"course/{VERIFY_JSON} has no entry for `{ex.id}` yet."
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


def recorded_error(buggy: dict, reports: Reports) -> list[str]:
    """A recorded OOM message as a learner running alone meets it, and a note on what was left out."""
    shown, others = learner_view(buggy["message"])
    # One long line, as a terminal shows it: the page's style sheet wraps it at the column's width, whatever that is.
    md = [fence(shown, "{ .text .oomlab-message }"), ""]
    if others:
        jobs = (reports.verify or {}).get("jobs")
        md += [
            f"Left out: the lines of {others} other process(es), the runs that `oomlab dev verify` measured beside it"
            + (f", {jobs} at a time" if jobs else "")
            + ". Run alone, the driver names only yours (*Including non-PyTorch memory, this process has …*), and *of "
            "which … is free* no longer counts what they held.",
            "",
        ]
    return md


def error_section(ex: Exercise, reports: Reports) -> list[str]:
    """The error the shipped script ends with on the GPU, as the learner meets it: the page's first clue."""
    buggy = (reports.measured(ex.id) or {}).get("buggy") or {}
    if not buggy.get("message"):
        return []
    where = f" at `{buggy['where']}`" if buggy.get("where") else ""
    return [
        "## What you will see",
        "",
        f"The shipped script, run under the budget on {measured_on(reports.verify)}, ends with this error{where}:",
        "",
        *recorded_error(buggy, reports),
    ]


def figure_section(ex: Exercise, reports: Reports) -> list[str]:
    """The pictures `oomlab dev figures` drew for this exercise, with the tool's own one-line finding."""
    index = reports.figures
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
        body += profile_legend(uri, reports)
    for figure in sorted(shown, key=lambda f: f["variant"] != "bug"):
        label = "The buggy script" if figure["variant"] == "bug" else "The reference fix"
        body += [f"**{label}.** The tool's finding, as it printed it:", "", "> " + escaped(figure.get("headline") or ""), ""]
        if figure["variant"] == "bug":
            body += failed_step_note(ex, figure, reports)
        for name in figure["files"]:
            body += [picture(uri, name, f"{label}: {name}"), ""]
        if figure.get("snapshot"):
            body += [
                f"[Download this snapshot]({link_from(uri, 'figures/' + figure['snapshot'])}) and drop it on "
                "[pytorch.org/memory_viz](https://pytorch.org/memory_viz), PyTorch's own viewer, to explore every "
                "block and its stack yourself; `oomlab snapshot FILE.pickle` reads it offline.",
                "",
            ]
            body += viewer_shot(uri, reports.viewer_shot(figure["snapshot"]))
    md += ['??? example "What it found, with the pictures"', "", *indented("\n".join(body)), ""]
    return md


def viewer_shot(page_src_uri: str, record: dict | None) -> list[str]:
    """PyTorch's viewer on a snapshot, as `oomlab dev viewer-shots` took it, with what the picture shows; [] where none.

    The caption is the shot's own (:data:`~oomlab.site.viewer_shots.SHOTS`), and what the viewer printed
    where the pointer rests is quoted from the record, as the viewer printed it.
    """
    shot = next((s for s in SHOTS if record and s.png == record.get("png") and s.view == record.get("view")), None)
    if shot is None:
        return []
    said = ""
    if record.get("pointed_at"):
        said = f" Below the drawing it prints `{record['pointed_at']}`"
        said += f", and the stack below names `{record['course_frame']}`." if record.get("course_frame") else "."
    return [
        f"In PyTorch's own viewer, *{shot.view}*, the same snapshot looks like this (taken offline by "
        "`oomlab dev viewer-shots`):",
        "",
        picture(page_src_uri, shot.png, f"PyTorch's memory viewer, {shot.view}, on {shot.pickle}"),
        "",
        f"{shot.caption}{said} Drop the snapshot on [pytorch.org/memory_viz](https://pytorch.org/memory_viz) and "
        f"choose *{shot.view}* in its second menu to see it there yourself.",
        "",
    ]


def wrong_fix_section(ex: Exercise, reports: Reports) -> list[str]:
    """The tempting fixes from the manifest, each with why it fails and, if measured, whether it did."""
    return tempting_edits(
        ex,
        reports,
        "Tempting fixes that do not work",
        "Each is an edit of the buggy script that the course measures, and the check that catches it.",
        lambda fix: f"caught by `{fix.expect}`",
        lambda fix, run: f"{'fails' if fix.expect in (run.get('failed_checks') or []) else 'does NOT fail'} `{fix.expect}`",
    )


def page_head(ex: Exercise, number: int, total: int) -> list[str]:
    """An exercise page's top: its title, its place and step, its summary, and the head of its facts table."""
    return [
        f"# {ex.title}",
        "",
        f"Exercise {number} of {total}. Workflow step: {step_tag(page_uri(ex), ex)}.",
        "",
        prose(ex.summary),
        "",
        "| Exercise | |",
        "|---|---|",
    ]


def hints_section(ex: Exercise) -> list[str]:
    """The three hints, folded, in the order a learner should open them."""
    md = ["## Hints", "", f"Open them in order, and only as far as you need; `oomlab hint {ex.id}` gives the same hints.", ""]
    for i, hint in enumerate(ex.hints, 1):
        md += [f'??? hint "Hint {i} of {len(ex.hints)}"', "", "    " + prose(hint), ""]
    return md


def tempting_edits(ex: Exercise, reports: Reports, heading: str, intro: str, caught_by, measured) -> list[str]:
    """A section of the manifest's wrong fixes, each folded with why it is wrong, its edits and, where ``verify.json``
    has its run, what was measured: ``caught_by(fix)`` titles it and ``measured(fix, run)`` says whether it was."""
    if not ex.wrong_fixes:
        return []
    row = reports.measured(ex.id) or {}
    runs = {f.get("name"): f for f in row.get("wrong_fixes") or []}
    md = [f"## {heading}", "", intro, ""]
    for fix in ex.wrong_fixes:
        run = runs.get(fix.name)
        result = f" Measured: {measured(fix, run)}." if run else ""
        md += [f'??? failure "`{fix.name}`: {caught_by(fix)}"', "", f"    {prose(fix.why)}{result}", ""]
        md += folded_edits(fix)
    return md


def folded_edits(fix) -> list[str]:
    """A fix's edits of the buggy script, as diffs inside its fold."""
    md = []
    for edit in fix.edits:
        md += [*indented(fence(edit_diff(edit), "diff")), ""]
    return md


def alternatives_section(ex: Exercise, reports: Reports) -> list[str]:
    """The other honest fixes the grader accepts, each with whether the course measured it passing."""
    if not ex.alternatives:
        return []
    row = reports.measured(ex.id) or {}
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
