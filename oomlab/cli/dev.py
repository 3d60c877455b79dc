"""``oomlab dev``: maintainers' commands, run on a GPU, that write the course's committed reports.

- ``verify``: ``course/measurements/verify.json``, every exercise's runs;
- ``equivalence``: ``course/measurements/equivalence.json``, every run fresh and forked, side by side;
- ``bench``: ``course/measurements/speed.json``, how long a learner waits for each command;
- ``figures``: ``course/figures/``, the tools' pictures;
- ``facts``: ``course/measurements/facts.json``, the probes in ``course/probes/`` (see :mod:`oomlab.site.facts`);
- ``viewer-shots``: ``course/figures/*-memory-viz.png``, PyTorch's memory viewer on the committed snapshots, in
  Chromium and offline (no GPU; see :mod:`oomlab.site.viewer_shots`);
- ``calibrate``: an exercise's runs under a generous ceiling, to size its budget (writes nothing committed).

Each reads the manifests as the working tree has them (``Course(working_tree=True)``), not the
copies kept for learners: here they are the source of truth, and edited on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from oomlab.cli import console, dev_app
from oomlab.course import Course, reports
from oomlab.course.state import relpath, write_atomic
from oomlab.errors import OomLabError
from oomlab.figure_names import COMPARED, label
from oomlab.units import in_mib

JOBS = typer.Option(0, min=0, help="runs at once (default 0: as many as the cores and the GPU's free memory allow)")
ONLY = typer.Option(
    None,
    "--exercise",
    help="measure only this exercise (repeatable) and keep the report's other rows where the same code, GPU, torch "
    "and --jobs measured them (without --jobs, it runs as many at once as the report was measured with)",
)


def write_report(course: Course, path: Path, report: dict, failed: str | None) -> None:
    """Write a report, say where, and exit 1 (after writing: the failures are worth reading) when ``failed`` says why."""
    write_atomic(path, json.dumps(report, indent=2) + "\n")
    console.print(f"Wrote {relpath(path, course.root)}")
    if failed:
        console.print(Text(f"{failed}: see the ✗ rows.", style="bold red"))
        raise typer.Exit(1)


def read_report(path: Path) -> dict | None:
    """The report already at ``path``, or None where there is none or it cannot be read (then nothing of it is kept)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def say_dropped(path: Path, course: Course, dropped: list[str]) -> None:
    """Name the rows of a report that a partial sitting could not keep, and what measures them again."""
    if dropped:
        console.print(
            Text(f"Not kept from {relpath(path, course.root)}, measure them again: " + "; ".join(dropped), style="yellow")
        )


def run_label(run: dict) -> str:
    """A run of a report row as the tables name it: ``wrong-fix: empty-cache``, or ``bug`` alone."""
    return f"{run['kind']}: {run['name']}" if run["kind"] != run["name"] else run["name"]


def auto_jobs(course: Course) -> int:
    from oomlab.measure.machine import parallel_runs

    return parallel_runs([ex.budget_bytes for ex in course.scripts])


def sitting_jobs(course: Course, jobs: int, only: list[str] | None, report: Path) -> int:
    """Runs at once: as asked; else, for a sitting of some exercises, as many as the committed ``report`` was measured
    with, since a sitting at another parallelism could keep none of its rows; else as many as this machine allows."""
    committed = (read_report(report) or {}).get("jobs") if only else None
    return jobs or (committed if isinstance(committed, int) and committed > 0 else auto_jobs(course))


@dev_app.command()
def verify(
    json_path: Optional[Path] = typer.Option(None, "--json", help=f"where to write the report (default: {reports.VERIFY})"),
    jobs: int = JOBS,
    fresh: bool = typer.Option(False, "--fresh", help="measure each run in a new Python process, not forked from a warm server"),
    only: Optional[list[str]] = ONLY,
) -> None:
    """The course's truth check: every reference fix passes, every seeded bug, wrong fix and cheat fails.

    Drafts (modules.toml's ``drafts``), named by id, are checked the same way before they join the course, and
    their runs are shown, not written: the report describes the course.
    """
    from oomlab.grading.sittings import merge_verify
    from oomlab.grading.truth import verify as verify_course

    course = Course(working_tree=True)
    drafts = [e for e in only or [] if e in course.drafts]
    if drafts and len(drafts) != len(only):
        raise OomLabError(
            f"{', '.join(drafts)} {'is a draft' if len(drafts) == 1 else 'are drafts'}, checked without writing the report; "
            f"the others named are the course's: {', '.join(e for e in only if e not in drafts)}.",
            "Verify the drafts in one sitting and the course's exercises in another.",
        )
    chosen = [course.draft(e) for e in drafts] if drafts else [course.get(e) for e in only] if only else course.exercises
    path = json_path or course.root / reports.VERIFY
    jobs = (jobs or auto_jobs(course)) if drafts else sitting_jobs(course, jobs, only, path)
    with console.status(f"Verifying, {jobs} runs at a time…") as status:
        report = verify_course(chosen, note=lambda s: status.update(f"Verifying: {s}…"), jobs=jobs, fresh=fresh)
    if only and not drafts:
        report, dropped = merge_verify(read_report(path), report, course.exercises)
        say_dropped(path, course, dropped)
    print_verify_table(report)
    if drafts:
        console.print(f"Not written to {relpath(path, course.root)}: drafts join the report when they join the course.")
        if not report["ok"]:
            console.print(Text("Not every run of the drafts as expected: see the ✗ rows.", style="bold red"))
            raise typer.Exit(1)
        return
    write_report(course, path, report, None if report["ok"] else "Verification failed")
    console.print(
        Text(
            f"All as expected: {report['runs']} runs in {report['wall_s']} s, {jobs} at a time, {report['runner']}"
            + (f", in {report['sittings']} sittings." if report.get("sittings", 1) > 1 else "."),
            style="green",
        )
    )


def print_verify_table(report: dict) -> None:
    """Every run of a truth check, a line each: its verdict, what was expected, and its figures (an estimator's parts)."""
    from oomlab.grading.truth import all_runs

    table = Table(header_style="bold", title=f"verify on {report['gpu']}, torch {report['torch']}", title_justify="left")
    for col in (
        "exercise",
        "run",
        "verdict",
        "expected",
        "OOM",
        *(label(key, "MiB") for key in COMPARED[:3]),
        label("retries"),
    ):
        table.add_column(col)
    for row in report["exercises"]:
        for r in all_runs(row):
            expected = "pass" if not r["expected_failure"] else "fail " + " or ".join(r["expected_failure"])
            ok = Text("✓ " if r["as_expected"] else "✗ ", style="green" if r["as_expected"] else "bold red")
            if row.get("kind") == "estimate":  # no run under a budget: the parts within their tolerances instead
                parts = f"{r['within']} of {r['total']} parts within" + (
                    f" ({', '.join(r['failed_parts'])} off)" if r["failed_parts"] else ""
                )
                table.add_row(row["id"], run_label(r), r["verdict"], ok + expected, parts, "", "", "", "")
                continue
            table.add_row(
                row["id"],
                run_label(r),
                r["verdict"],
                ok + expected,
                "yes" if r["oom"] else "no",
                in_mib(r["peak_allocated"], 0),
                in_mib(r["peak_reserved"], 0),
                in_mib(r["inactive_split_peak"], 0),
                str(r["retries"]),
            )
    console.print(table)


@dev_app.command()
def calibrate(
    exercises: Optional[list[str]] = typer.Argument(None, help="exercise ids (default: all)"),
    ceiling: str = typer.Option("12GiB", help="the cap every run gets instead of its budget"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="also write the rows as JSON here"),
    write: bool = typer.Option(False, "--write", help="write each proposed budget into its exercise.toml"),
    jobs: int = JOBS,
) -> None:
    """Size budgets: each exercise's fixes, bug and wrong fixes under a generous ceiling, and the budget the fixes suggest.

    A draft (modules.toml's ``drafts``) is calibrated by its id, before it joins the course.
    """
    from oomlab.grading.calibrate import calibrate as calibrate_course
    from oomlab.grading.calibrate import fitting_failures, write_budget
    from oomlab.measure.machine import parallel_runs
    from oomlab.units import parse_size

    course = Course(working_tree=True)
    chosen = [course.draft(e) if e in course.drafts else course.get(e) for e in exercises] if exercises else course.scripts
    for ex in [ex for ex in chosen if ex.is_estimate]:  # make promote names every new exercise, estimates too
        console.print(f"{ex.id} is an estimate exercise: it runs under no budget, so there is none to size.")
    chosen = [ex for ex in chosen if not ex.is_estimate]
    cap = parse_size(ceiling)
    jobs = jobs or parallel_runs([cap])
    with console.status("Calibrating…") as status:
        report = calibrate_course(chosen, cap, jobs, note=lambda s: status.update(f"Calibrating: {s}…"))
    table = Table(header_style="bold", title=f"under a {ceiling} ceiling", title_justify="left")
    for col in ("exercise", "run", "status", *(label(key, "MiB") for key in COMPARED[:3]), label("retries"), "s"):
        table.add_column(col)
    for row in report:
        for r in row["runs"]:
            table.add_row(
                row["id"],
                run_label(r),
                r["status"] + (f" at {r['where']}" if r["where"] else ""),
                in_mib(r["peak_allocated"], 0),
                in_mib(r["peak_reserved"], 0),
                in_mib(r["inactive_split_peak"], 0),
                str(r["retries"]),
                str(r["wall_s"]),
            )
        table.add_row(
            row["id"],
            "budget now / proposed",
            "",
            "",
            f"{in_mib(row['budget_bytes'], 0)} / {in_mib(row['proposed_budget_bytes'], 0)}",
            "",
            "",
            "",
            end_section=True,
        )
    console.print(table)
    if json_path:
        write_atomic(json_path, json.dumps(report, indent=2) + "\n")
    if write:
        import torch

        measured_on = (torch.cuda.get_device_name(), torch.__version__.split("+")[0])
    for ex, row in zip(chosen, report, strict=True):
        budget = row["proposed_budget_bytes"]
        if budget and (fit := fitting_failures(row, budget)):
            console.print(f"[yellow]{row['id']}: {', '.join(fit)} must run out of memory but fit {in_mib(budget, 0)} MiB.[/]")
        if write and budget:
            write_budget(ex.manifest_path, row, *measured_on)
            console.print(f"{ex.manifest_path}: budget_bytes = {budget:_}")


def side_by_side(row: dict, key: str) -> str:
    """One figure of a fresh and a forked run: shown once when equal, both when not."""
    fresh, forked = row["fresh"][key], row["forked"][key]
    return str(fresh) if fresh == forked else f"{fresh} ≠ {forked}"


@dev_app.command()
def equivalence(
    json_path: Optional[Path] = typer.Option(None, "--json", help=f"where to write the table (default: {reports.EQUIVALENCE})"),
    verify_json: Optional[Path] = typer.Option(
        None, "--verify-json", help="also write the truth check of the forked runs here (what `verify` writes)"
    ),
    jobs: int = JOBS,
    only: Optional[list[str]] = ONLY,
) -> None:
    """Every run of the course twice, fresh and forked from a warm server: the table that shows they measure the same."""
    from oomlab.grading.equivalence import compare, defects
    from oomlab.grading.sittings import merge_equivalence, merge_verify

    course = Course(working_tree=True)
    chosen = [course.get(e) for e in only] if only else course.exercises
    path = json_path or course.root / reports.EQUIVALENCE
    jobs = sitting_jobs(course, jobs, only, verify_json or path)
    with console.status("Comparing…") as status:
        report, verified = compare(chosen, note=lambda s: status.update(f"Comparing, {s}…"), jobs=jobs)
    if only:
        kept = None
        if verify_json:
            verified, dropped = merge_verify(read_report(verify_json), verified, course.exercises)
            say_dropped(verify_json, course, dropped)
            kept = {row["id"] for row in verified["exercises"]}
        report, dropped = merge_equivalence(read_report(path), report, course.exercises, kept)
        say_dropped(path, course, dropped)
    if verify_json:
        write_atomic(verify_json, json.dumps(verified, indent=2) + "\n")
        console.print(
            f"Wrote {relpath(verify_json, course.root)}: {'every run as expected' if verified['ok'] else 'NOT every run as expected'}"
        )
    table = Table(header_style="bold", title=f"fresh vs forked on {report['gpu']}, torch {report['torch']}", title_justify="left")
    for col in ("exercise", "run", "verdict", *(label(key) for key in COMPARED), "OOM", "equal"):
        table.add_column(col)
    for r in report["rows"]:
        table.add_row(
            r["exercise"],
            r["run"],
            *(
                side_by_side(r, k)
                for k in ("verdict", "peak_allocated", "peak_reserved", "inactive_split_peak", "retries", "oom")
            ),
            Text("✓", style="green") if r["equal"] else Text("✗", style="bold red"),
        )
    console.print(table)
    found = defects(report)
    for line in found:
        console.print(Text(line, style="bold red"))
    write_report(course, path, report, "A forked run got another verdict, or a fix other figures" if found else None)
    differ = sum(not r["equal"] for r in report["rows"])
    console.print(
        Text(
            f"{report['runs'] - differ} of {report['runs']} runs equal"
            + (f", and the {differ} others (✗) only in what no grade reads" if differ else "")
            + f": fresh {report['fresh_wall_s']} s, forked {report['forked_wall_s']} s, {jobs} at a time.",
            style="green",
        )
    )


@dev_app.command()
def figures(
    out: Optional[Path] = typer.Option(None, help=f"where the site's pictures go (default: {reports.FIGURES_DIR})"),
    jobs: int = JOBS,
    only: Optional[list[str]] = typer.Option(
        None, "--exercise", help="redraw only this exercise's pictures (repeatable) and keep the others' in figures.json"
    ),
) -> None:
    """Redraw the site's pictures from real runs: each exercise's tool on its seeded bug and on its reference fix."""
    from oomlab.site.figures import regenerate

    course = Course(working_tree=True)
    jobs = jobs or auto_jobs(course)
    with console.status(f"Running each exercise's tool, {jobs} at a time…") as status:
        written = regenerate(
            course, out or course.root / reports.FIGURES_DIR, note=lambda s: status.update(s), jobs=jobs, only=only
        )
    for path in written:
        console.print(f"Wrote {relpath(path, course.root)}")


@dev_app.command("viewer-shots")
def viewer_shots(
    memory_viz: Path = typer.Option(
        ...,
        "--memory-viz",
        metavar="FILE",
        help="PyTorch's torch/utils/viz/MemoryViz.js, from its repository at the snapshots' torch version",
    ),
    d3: Path = typer.Option(
        ..., "--d3", metavar="FOLDER", help="the node_modules folder of `npm install d3@5` (d3 and its d3-* packages)"
    ),
    timeout: float = typer.Option(60.0, min=1.0, metavar="SECONDS", help="how long the viewer may take to draw a snapshot"),
) -> None:
    """Screenshot PyTorch's memory viewer on the committed snapshots, offline in headless Chromium; no GPU needed.

    Neither input is committed: the pictures and viewer-shots.json, which records what drew them, are.
    """
    from oomlab.site import viewer_shots as shots

    course = Course(working_tree=True)
    inputs = shots.check_inputs(memory_viz, d3)
    figures_dir = course.root / reports.FIGURES_DIR
    with console.status("Starting Chromium…") as status:
        written, record = shots.take(inputs, figures_dir, timeout_s=timeout, note=lambda s: status.update(f"Drawing {s}…"))
    for path in [*written, record]:
        console.print(f"Wrote {relpath(path, course.root)}")


@dev_app.command()
def readme() -> None:
    """Rewrite README.md's figures (the GPU memory the exercises need) from the manifests and facts.json; no GPU needed."""
    from oomlab.site.readme import regenerate

    course = Course(working_tree=True)
    path, changed = regenerate(course)
    console.print(f"{'Wrote' if changed else 'Already current:'} {relpath(path, course.root)}")


@dev_app.command()
def facts(
    probe: Optional[list[str]] = typer.Option(None, "--probe", help="run only this probe (repeatable); prints, writes nothing"),
    json_path: Optional[Path] = typer.Option(
        None, "--json", help="where to write the report (default: course/measurements/facts.json)"
    ),
    stale: bool = typer.Option(
        False,
        "--stale",
        help="run only the probes the report lacks or measured with another version of their script, and merge "
        "their facts into it (same GPU, torch and CUDA)",
    ),
) -> None:
    """Run the site's probes on this GPU, each in a fresh process, and write the facts the pages quote."""
    from oomlab.site import facts as site_facts

    course = Course(working_tree=True)
    probes = site_facts.find_probes(course.root / site_facts.PROBES_DIR)
    path = json_path or course.root / reports.FACTS
    committed = None
    if stale:
        if probe:
            raise OomLabError("--stale and --probe both choose the probes to run.", "Name one of them.")
        try:
            committed = site_facts.load(path)
        except (OSError, ValueError) as err:
            raise OomLabError(f"{relpath(path, course.root)} cannot be read: {err}", "Run every probe: drop --stale.") from None
        every = probes
        if committed is not None:
            stale_names = set(site_facts.stale_probes(committed, probes))  # once: it hashes every probe's script
            probes = [p for p in probes if p.name in stale_names]
        if not probes:
            console.print(f"Every probe's facts in {relpath(path, course.root)} are current: nothing to run.")
            return
        console.print("Stale: " + ", ".join(p.name for p in probes))
    if probe:
        unknown = sorted(set(probe) - {p.name for p in probes})
        if unknown:
            raise OomLabError(
                f"No probe named {', '.join(unknown)} in {site_facts.PROBES_DIR}.",
                "Probes: " + ", ".join(p.name for p in probes),
            )
        probes = [p for p in probes if p.name in probe]
    with console.status("Running the probes…") as status:
        report = site_facts.measure(probes, course.root, note=lambda s: status.update(f"Probe {s}…"))
    console.print(f"Measured on {report['gpu']}, torch {report['torch']}, CUDA {report['cuda']}:")
    console.print_json(json.dumps(report["facts"]))
    for name, error in (report.get("errors") or {}).items():
        console.print(Text(f"✗ probe {name}: {error}", style="bold red"))
    if report.get("errors"):
        console.print(Text("Nothing written: every probe must succeed.", style="bold red"))
        raise typer.Exit(1)
    if probe and json_path is None:
        console.print("Only some probes ran: nothing written (name --json to write them).")
        return
    if committed is not None:
        report = site_facts.merged(committed, report, every)
    site_facts.write(report, path)
    console.print(f"Wrote {relpath(path, course.root)}")


@dev_app.command()
def bench(
    exercise: Optional[list[str]] = typer.Option(None, "--exercise", help="time only this exercise (repeatable)"),
    exercises: bool = typer.Option(True, "--exercises/--no-exercises", help="time the course's exercises"),
    scripts: bool = typer.Option(True, "--scripts/--no-scripts", help="time the tools on scripts that are not in the course"),
    verify_too: bool = typer.Option(True, "--verify/--no-verify", help="time the whole `oomlab dev verify` as well"),
    repeat: int = typer.Option(3, min=3, help="runs per figure; each figure is their median"),
    class_size: int = typer.Option(0, "--class", min=0, help="also time grading a class of this many students (nbgrader)"),
    assignment: str = typer.Option("snapshot", help="the assignment the class submits, with --class"),
    oom_hook_steps: int = typer.Option(
        0, "--oom-hook", min=0, help="also time this many training steps with and without the OOM hook (oomlab.oom_hook)"
    ),
    big_snapshot_events: int = typer.Option(
        0, "--big-snapshot", min=0, metavar="EVENTS", help="also time the snapshot tool on a snapshot of this many events"
    ),
    witness_runs: int = typer.Option(
        0,
        "--witness",
        min=0,
        metavar="RUNS",
        help="also time this many runs with the driver read by the witness and as many without",
    ),
    witness_exercise: Optional[list[str]] = typer.Option(
        None, "--witness-exercise", help="the exercise whose reference fix --witness runs (repeatable; default: the first three)"
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help=f"where to write the figures (default: {reports.SPEED})"),
    checks_only: bool = typer.Option(
        False,
        "--checks-only",
        help="time only `oomlab check` of each exercise's reference fix: every reference cached first, then each "
        "exercise's first check of a sitting once, then --repeat checks forked from the server a check keeps",
    ),
    verify_json: Optional[Path] = typer.Option(
        None, "--verify-json", help=f"with --verify, also keep the truth check's report here (as {reports.VERIFY})"
    ),
    verify_measured: Optional[Path] = typer.Option(
        None,
        "--verify-measured",
        help="take the truth check's row from this report, already measured (its time is the sum of its sittings'), "
        "instead of running the truth check again",
    ),
) -> None:
    """Time what a learner waits for on this GPU: plain runs, checks, re-checks under watch, the tools, verify, a class.

    The figures are merged into the report row by row, as each is measured: a sitting cut short keeps its rows.
    """
    from oomlab.bench import ROWS, SPEED_COLUMNS, measured_verify_row, merge  # SPEED_COLUMNS: the measurements page's, in order
    from oomlab.bench import bench as run_bench

    course = Course(working_tree=True)
    path = json_path or course.root / reports.SPEED
    report = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    if verify_measured:
        measured = read_report(verify_measured)
        if not isinstance(measured, dict) or not isinstance(measured.get("exercises"), list):
            raise OomLabError(
                f"{verify_measured} is not a truth check's report: it is missing, unreadable or not what verify writes.",
                f"Name the verify.json that `oomlab dev verify` or `oomlab dev equivalence --verify-json` wrote ({reports.VERIFY}).",
            )
        report = merge(report, measured_verify_row(measured))
        write_atomic(path, json.dumps(report, indent=2) + "\n")
        verify_too = False
    with console.status("Benchmarking…") as status:
        for now in run_bench(
            exercise,
            repeat,
            exercises,
            scripts,
            verify_too,
            note=lambda s: status.update(f"Benchmarking {s}…"),
            class_size=class_size,
            assignment=assignment,
            oom_hook_steps=oom_hook_steps,
            big_snapshot_events=big_snapshot_events,
            witness_runs=witness_runs,
            witness_exercises=witness_exercise,
            verify_json=verify_json.resolve() if verify_json else None,
            checks_only=checks_only,
        ):
            report = merge(report, now)
            write_atomic(path, json.dumps(report, indent=2) + "\n")
    if report is None:
        raise OomLabError("Nothing was timed.", "Leave out --no-exercises, --no-scripts or --no-verify.")

    keys = [key for key, _ in SPEED_COLUMNS]
    table = Table(header_style="bold", title=f"seconds on {report['gpu']}, torch {report['torch']}", title_justify="left")
    for col in ("exercise or script", *keys):
        table.add_column(col.removesuffix("_s"))
    for kind in ROWS:
        for row in report[kind]:
            name = f"{row['id']} (checks only)" if kind == "checks" else row["id"]
            table.add_row(name, *(f"{row[k]:.2f}" if k in row else "" for k in keys))
    console.print(table)
    if "verify_wall_s" in report:
        console.print(
            f"oomlab dev verify: {report['verify_wall_s']} s, {report.get('verify_vs_floor', '?')}x its floor of "
            f"{report.get('verify_floor_s', '?')} s ({report['verify_created']})"
            + (
                f"; tasks held {report['verify_slots_held']:.0%} of the slots, {report['verify_outside_runs_s']} s outside "
                "the scripts' runs"
                if report.get("verify_slots_held") is not None
                else ""
            )
        )
    if "class" in report:
        c = report["class"]
        console.print(
            f"A class of {c['students']} ({c['notebooks']} notebooks of {c['assignment']}) graded in {c['wall_s']} s ({c['created']})"
        )
    if "oom_hook" in report:
        for loop, row in report["oom_hook"].get("loops", {}).items():
            overhead = ", ".join(f"{v.replace('_', ' ')} {f:+.1%}" for v, f in row["overhead"].items())
            console.print(f"OOM hook on the {loop} loop: {overhead} per step ({report['oom_hook']['created']})")
    if "witness" in report:
        for ex_id, row in report["witness"]["exercises"].items():
            w, overhead = row["with"], row["script_wall_overhead"]
            if w["samples"] is None:  # the driver was not read: its statuses say why
                console.print(f"Witness on {ex_id}: the driver was not read ({', '.join(w['statuses'])})")
                continue
            console.print(
                f"Witness on {ex_id}: {w['samples']:.0f} samples of {w['sample_ms_mean']} ms each, the supervisor's CPU "
                f"{w['supervisor_cpu_s']} s, the script {'n/a' if overhead is None else f'{overhead:+.1%}'} "
                f"({report['witness']['created']})"
            )
    if "big_snapshot" in report:
        big = report["big_snapshot"]
        console.print(
            f"snapshot tool on {big['pickle_bytes'] / 1e6:,.0f} MB ({big['events']:,} events): load {big['load_s']} s, "
            f"analyze {big['analyze_s']} s, peak {big['peak_rss_bytes'] / 1e9:.2f} GB ({big['created']})"
        )
    for target, met in report["targets"].items():
        console.print(Text(f"{'✓' if met else '✗'} {target.replace('_', ' ')}", style="green" if met else "yellow"))
    console.print(f"Wrote {relpath(path, course.root)}")
