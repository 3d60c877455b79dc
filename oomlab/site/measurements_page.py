"""The measurements page, ``measurements.md``: every figure the course measured on a GPU, in one place.

From the reports (:mod:`oomlab.site.reports`): each exercise's runs from ``verify.json`` (as its
own page shows them, :mod:`oomlab.site.measured_runs`); forked runs against fresh ones from
``equivalence.json``; from ``speed.json`` how long a learner waits for each command, how long a
class takes to grade and what the OOM hook and a big snapshot cost (:mod:`oomlab.site.tool_costs`);
and what the witness saw (:mod:`oomlab.site.witness_section`). A report not written yet leaves
its section saying which command writes it.
"""

from __future__ import annotations

from oomlab.bench import SPEED_COLUMNS, TARGETS, check_rows
from oomlab.measure.stats import FIGURES as STAT_FIGURES
from oomlab.site.markdown import FRONT_MATTER, cell
from oomlab.site.measured_runs import RUN_HEADER, budget, expectation_notes, run_row, runs, staleness, upper_first
from oomlab.site.module_pages import page_uri
from oomlab.site.reports import EQUIVALENCE_JSON, SPEED_JSON, VERIFY_JSON, Reports, measured_date, measured_on
from oomlab.site.tool_costs import big_snapshot_section, oom_hook_section
from oomlab.site.witness_section import witness_section
from oomlab.steps import step

__all__ = ["measurements_page"]


def measurements_page(reports: Reports) -> str:
    """The whole page, as Markdown."""
    report = reports.verify
    md = [FRONT_MATTER + "# Measurements", ""]
    if report is None:
        return "\n".join(md + ['!!! info "Not measured yet"', "", f"    {reports.verify_problem}", ""]) + "\n"
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
    for number, ex in enumerate(reports.exercises, 1):
        link = page_uri(ex)
        row = reports.measured(ex.id)
        md += [f"## {number}. [{ex.title}]({link})", ""]
        said = ESTIMATED if ex.is_estimate else f"Budget {budget(ex)}."
        if row is None:
            md += [f"Not in this report. {said}", ""]
            continue
        md += [said, ""]
        for problem in staleness(ex, row):
            md += ['!!! warning "Measured on an older version"', "", f"    {upper_first(problem)}.", ""]
        if ex.is_estimate:
            md += [ESTIMATE_HEADER, *(estimate_run_row(label, r) for label, r in runs(row)), ""]
        else:
            md += [RUN_HEADER, *(run_row(label, r) for label, r in runs(row, cheats=True)), ""]
        for note in expectation_notes(row):
            md += ['!!! warning "Unexpected result"', "", f"    {upper_first(note)}", ""]
    known = {ex.id for ex in reports.exercises}
    extra = [row.get("id") for row in report["exercises"] if row.get("id") not in known]
    if extra:
        md += ["The report also lists exercises the course no longer has: " + ", ".join(f"`{e}`" for e in extra) + ".", ""]
    md += equivalence_section(reports.equivalence) + speed_section(reports.speed, report)
    md += witness_section(report, reports.speed)
    return "\n".join(md) + "\n"


# An estimate exercise's rows: each estimator graded on its hidden configs, part by part, instead of a run's peaks.
ESTIMATED = "No budget: each estimator is graded on hidden configs, each measured on the GPU, every part within its tolerance."
ESTIMATE_HEADER = "| Estimator | Verdict | Parts within their tolerance | Parts off in some config |\n|---|---|---:|---|"


def estimate_run_row(label: str, r: dict) -> str:
    """One estimator's line: its verdict, how many parts of its configs came within tolerance, which parts did not."""
    off = ", ".join(f"`{part}`" for part in r.get("failed_parts") or []) or "none"
    return f"| {cell(label)} | {r.get('verdict', 'n/a')} | {r.get('within', 'n/a')} of {r.get('total', 'n/a')} | {off} |"


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


def speed_section(report: dict | None, verify: dict | None) -> list[str]:
    """How long a learner waits for each command, from ``speed.json``.

    ``verify`` is the current ``verify.json``: a timing of the whole verify made when the course had
    other runs is said to be of that course, not this one.
    """
    md = ["## How long a learner waits", ""]
    if report is None:
        return md + ["Not timed yet: on a CUDA GPU, `make bench` (`oomlab dev bench`) times every command.", ""]
    md += [
        f"Seconds of wall time, each the median of {report.get('repeat', 3)} runs in one sitting, from "
        f"[`{SPEED_JSON}`]({SPEED_JSON}), which `oomlab dev bench` wrote on {measured_on(report)}. Each command is "
        "run as a learner types it, in a course folder made by `oomlab init`; the reference is already cached for "
        "`check`. The first `check` of a sitting starts a fresh Python process, which imports torch before the "
        "script's first line; it leaves a measuring server with torch imported (`oomlab stop`, or ten idle minutes, "
        "ends it), from which every later `check` forks its run (an `oomlab run` leaves one too). The tools run on the exercise as shipped, under its "
        "budget.",
        "",
        "| Exercise | " + " | ".join(heading for _, heading in SPEED_COLUMNS) + " |",
        "|---|" + "---:|" * len(SPEED_COLUMNS),
    ]
    for row in report.get("exercises", []):
        md.append(f"| {cell(row['id'])} | " + " | ".join(_seconds(row.get(k)) for k, _ in SPEED_COLUMNS) + " |")
    md += check_table(report)
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
            f"{report['verify_parallel']} at a time"
            + (f", in {report['verify_sittings']} sittings, their times added up" if report.get("verify_sittings", 1) > 1 else "")
            + (
                f". Its floor, which no order of the runs can beat, is {report['verify_floor_s']} s: the longer of its "
                f"longest run ({report['verify_longest_run_s']} s) and the sum of its runs ({report['verify_runs_sum_s']} s, "
                f"each reference fix counted at its fix's time) shared by {report['verify_parallel']} slots; it ran in "
                f"{report['verify_vs_floor']} times that, the longest run that can start going first."
                if report.get("verify_floor_s")
                else "."
            )
            + (
                f" Its tasks held {report['verify_slots_held']:.0%} of the slots' time; {report['verify_outside_runs_s']} s "
                "of theirs went outside the scripts' own runs (starting each process and CUDA, grading), and the first "
                f"began {report['verify_first_start_s']} s in (the warm servers importing torch)."
                if report.get("verify_slots_held") is not None
                else ""
            )
            + (
                " A typical run (the median of each part): {start} s from its process's start to its script's, "
                "{script} s of script, {end} s from the script's end to the process's, and {parent} s in the grader "
                "around it.".format(**report["verify_run_parts_s"])
                if report.get("verify_run_parts_s")
                else ""
            ),
        ]
        verify = verify or {}
        if verify.get("runs") and verify["runs"] != report["verify_runs"]:
            stale["verify_within_1_2x_floor"] = f"not timed on this course: {report['verify_runs']} of its {verify['runs']} runs"
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


def check_table(report: dict) -> list[str]:
    """``oomlab check`` of each exercise's reference fix as last timed, by a whole sitting or one of checks alone."""
    rows = check_rows(report)
    if not rows:
        return []
    md = [
        "",
        "`oomlab check` of each exercise's reference fix, as last timed (`oomlab dev bench --checks-only` times only "
        "these: each reference measured and cached first, then each exercise's first check with no server anywhere, "
        f"once, then the median of {report.get('repeat', 3)} checks forked from the kept server):",
        "",
        "| Exercise | The first check of a sitting | Every later check | Timed on |",
        "|---|---:|---:|---|",
    ]
    return md + [
        f"| {cell(ex_id)} | {_seconds(row.get('check_cold_s'))} | {_seconds(row.get('check_kept_s'))} | {measured_on(row)}, {measured_date(row)} |"
        for ex_id, row in rows.items()
    ]


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
