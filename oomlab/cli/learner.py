"""The learner's loop: where am I, run it, grade it, a hint, start again, see the fix."""

from __future__ import annotations

import contextlib
import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from oomlab import __version__
from oomlab.cli import app, console
from oomlab.course import Course
from oomlab.course.manifest import Exercise
from oomlab.course.modules import READ_FIRST, SIZE_FIRST, met_before_its_step, step_label
from oomlab.course.originals import keep_originals, pristine_source
from oomlab.course.originals import reset as reset_exercise
from oomlab.course.progress import Progress
from oomlab.course.shipped import init_course
from oomlab.course.state import StateDir, read_error, relpath, require_readable
from oomlab.errors import OomLabError
from oomlab.measure.machine import has_nvidia_driver, machine_error, refuse_without_a_driver
from oomlab.steps import STEPS, step
from oomlab.units import in_gib

if TYPE_CHECKING:
    from oomlab.grading.verdict import Report

EXERCISE = typer.Argument(..., help="exercise id or number")


def load() -> tuple[Course, Progress]:
    """The course (a broken manifest blocks only its own exercise) and the progress, with a note if it was damaged."""
    course = Course(strict=False)
    keep_originals(course.exercises)  # at first sight, so that `oomlab reset` has the original
    progress = Progress(course.state)
    if progress.recovered is not None:
        console.print(
            Text(
                f"Note: your progress file {relpath(progress.path, course.root)} was damaged. It was moved aside to "
                f"{relpath(progress.recovered, course.root)} (nothing else was touched), and progress starts afresh: "
                "`oomlab check ID` marks an exercise passed again.",
                style="yellow",
            )
        )
    return course, progress


def readable(ex: Exercise) -> None:
    """Your file must be readable before anything measures it (a missing one is explained by the run)."""
    require_readable(ex.learner_path, "your exercise", relpath(ex.learner_path, ex.root))


def current(course: Course, progress: Progress) -> Exercise | None:
    return next((e for e in course.exercises if not progress.passed(e.id)), None)


def next_steps(ex: Exercise) -> Group:
    """What to do now: each command whole on its line (never cut, never run into its words), its words beside it."""
    ran = (
        "your estimate for the example configs, beside the CPU's count of each"
        if ex.is_estimate
        else f"run it under its {in_gib(ex.budget_bytes)} budget and see what happens"
    )
    rows = (
        (f"oomlab run {ex.id}", ran),
        (f"oomlab check {ex.id}", "grade your estimate on hidden configs" if ex.is_estimate else "grade your fix"),
        (f"oomlab hint {ex.id}", "a hint; one more each time you ask"),
        ("oomlab watch", "re-check on every save"),
    )
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True, style="bold cyan")
    grid.add_column()
    for cmd, what in rows:
        grid.add_row(f"  {cmd}", what)
    return Group(Text(f"Edit {relpath(ex.learner_path, ex.root)}, then:"), grid)


def show_version(value: bool) -> None:
    if value:
        console.print(f"oomlab {__version__}")
        raise typer.Exit()


@app.callback()
def overview(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", is_eager=True, callback=show_version, help="print the version and exit"),
) -> None:
    """With no command: your progress, the current exercise and what to do next."""
    if ctx.invoked_subcommand is not None:
        return
    course, progress = load()
    done = sum(progress.passed(e.id) for e in course.exercises)
    total = len(course.exercises) + len(course.broken)
    console.print(Text("OOM Lab", style="bold"))
    bar = Table.grid(padding=(0, 2))  # the bar and its label on a line of their own
    bar.add_row(ProgressBar(total=max(total, 1), completed=done, width=30), Text(f"{done}/{total} exercises passed"))
    console.print(bar)
    console.print()
    ex = current(course, progress)
    rows = Table.grid(padding=(0, 1))
    for col in ("mark", "n", "id", "title"):
        rows.add_column(col, no_wrap=col != "title")
    by_id = {e.id: e for e in course.exercises}
    for i, ex_id in enumerate(course.ids_in_order, 1):
        if ex_id in course.broken:
            rows.add_row(" ✗", f"{i}.", ex_id, f"broken: {course.problem(ex_id)}", style="red")
            continue
        e = by_id[ex_id]
        mark = "✓" if progress.passed(e.id) else ("→" if e is ex else "·")
        style = "green" if mark == "✓" else ("bold" if mark == "→" else "dim")
        # Text, not markup: rich would take the bracketed step for a style tag and drop it.
        rows.add_row(f" {mark}", f"{i}.", e.id, Text(f"{e.title}  [{step_label(e.module, e.step)}]"), style=style)
    console.print(rows)
    if course.broken:
        console.print(Text("Fix what is named above for each broken exercise; the other exercises work meanwhile.", style="red"))
    if ex is None and course.broken:
        return
    if ex is None:
        console.print(
            Panel(
                "Every exercise passes. `oomlab solution ID` shows each reference fix to compare with yours.",
                border_style="green",
            )
        )
        return
    console.print(Panel(Text(ex.summary), title=f"Now: {ex.id}: {ex.title}", title_align="left"))
    console.print(next_steps(ex))
    if not has_nvidia_driver():  # cheap: the overview does not import torch
        needs = "`check` measures on a GPU (`run` works here)" if ex.is_estimate else "`run` and `check` need a GPU"
        console.print(Text(f"No NVIDIA driver on this machine: {needs}. `oomlab doctor` says more.", style="yellow"))


@app.command()
def init(folder: Path = typer.Argument(..., help="a new or empty folder for your course")) -> None:
    """Write a fresh course folder to work in: the exercises and their graders."""
    init_course(folder)
    console.print(f"Wrote a fresh OOM Lab course into {folder}.")
    console.print(Text(f"  cd {folder}\n  oomlab", style="bold cyan"))


@app.command("list")
def list_exercises() -> None:
    """All exercises, module by module, with their status."""
    course, progress = load()
    ex_now = current(course, progress)
    table = Table(header_style="bold", box=box.SIMPLE_HEAD)  # no column rules: the room goes to the words
    # Fixed widths, the title taking what is left: an id is copied into the next command, so it is never cut (the
    # module headings beside the ids wrap instead), and at 80 columns every column still shows.
    longest = max((len(ex_id) for ex_id in course.ids_in_order), default=8)
    widths = {"#": len(str(len(course.ids_in_order))), "exercise": longest, "step": 4, "budget": 8, "status": 7}
    for col in ("#", "exercise", "title", "step", "budget", "status"):
        table.add_column(col, width=widths.get(col), no_wrap=col in ("#", "step", "budget", "status"))
    numbered = [(course.number(e.id), e) for e in course.exercises]
    for module in course.modules:
        rows = [(i, e) for i, e in numbered if e.module == module]
        if not rows:
            continue
        table.add_row("", Text(module.title, style="bold cyan"), "", "", "", "", end_section=False)
        for i, e in rows:
            if progress.passed(e.id):
                status = Text("passed", style="green")
            else:
                status = Text("current" if e is ex_now else "to do", style="bold" if e is ex_now else "dim")
            # 0: read the error first; an estimate exercise, sized before anything runs, has no step
            number = "–" if e.is_estimate else ("0→" if met_before_its_step(e.module, e.step) else "") + str(step(e.step).number)
            budget = "none" if e.is_estimate else in_gib(e.budget_bytes)  # an estimator runs under no budget
            table.add_row(str(i), Text(e.id, no_wrap=True), e.title, number, budget, status)
        table.add_section()
    for ex_id in course.broken:  # listed last, under the number that is theirs
        problem = Text(course.problem(ex_id), style="red")
        table.add_row(str(course.number(ex_id)), Text(ex_id, no_wrap=True), problem, "", "", Text("broken", style="bold red"))
    console.print(table)
    sized = [f"– {SIZE_FIRST.lower()}"] if any(e.is_estimate for e in course.exercises) else []
    console.print("Steps: " + ", ".join([*sized, f"0 {READ_FIRST.lower()}", *(s.label for s in STEPS)]) + ".", style="dim")


KEEP_WARM = typer.Option(
    True,
    "--keep-warm/--no-keep-warm",
    envvar="OOMLAB_KEEP_WARM",
    help="keep a measuring server with torch imported for the next run or check (it stops after "
    "10 idle minutes, or at `oomlab stop`)",
)


def keep_server_warm(ex: Exercise, m) -> None:
    """After a run measured on this machine, keep a measuring server for the next one (:mod:`oomlab.measure.keeper`),
    for the allocator settings this run started with: a script that sets its own at its top ran with them."""
    if not has_nvidia_driver():
        return
    from oomlab.measure.keeper import IDLE_S
    from oomlab.measure.keeper import keep_warm as start_keeper

    if start_keeper(ex.root, m.alloc_conf if m.alloc_conf_declared else ex.alloc_conf):
        console.print(
            Text(
                "A measuring server now keeps torch imported, so your next run or check costs the script, not the "
                f"imports (it stops after {IDLE_S / 60:g} idle minutes, or at `oomlab stop`).",
                style="dim",
            )
        )


def measuring(ex: Exercise, what: str = "Measuring"):
    return console.status(f"{what} {ex.id} in a process of its own under its {in_gib(ex.budget_bytes)} budget…")


OWN_CONFIG = typer.Option(
    None,
    "--config",
    metavar="NAME=VALUE,...",
    help="an exercise sized before it runs: also count this config, the first example with these fields set "
    '(repeatable; e.g. --config "layers=8,checkpointing=true")',
)


@app.command()
def run(exercise: str = EXERCISE, keep_warm: bool = KEEP_WARM, config: Optional[list[str]] = OWN_CONFIG) -> None:
    """Run your version under the exercise's budget and show the OOM or the memory figures (an exercise sized before
    it runs: your estimate for its examples beside the CPU's count, no GPU needed)."""
    from oomlab.grading.present import print_manifest_note, print_run
    from oomlab.measure.harness import MACHINE_PROBLEMS, SCRIPT_FAILURES, measure_exercise_file

    course, _ = load()
    ex = course.get(exercise)
    readable(ex)
    print_manifest_note(console, ex)
    if ex.is_estimate:
        return run_estimate(ex, config or [])
    if config:
        raise OomLabError(f"--config is for an exercise sized before it runs; {ex.id} runs its script as it is.")
    refuse_without_a_driver(ex.learner_path, f"running {ex.id}")
    with measuring(ex, "Running"):
        # Not a grade: run as `python train.py` would be, beside its files, outside the grading sandbox.
        m = measure_exercise_file(ex, ex.learner_path, sandboxed=False)
    if m.status in MACHINE_PROBLEMS:
        raise machine_error(m, ex)
    if m.stdout.strip():
        console.print(Panel(Text(m.stdout.rstrip()[-3000:]), title="Script output", title_align="left", border_style="dim"))
    print_run(console, m, ex)
    if keep_warm:  # a run comes before a check: the check it leads to need not import torch again
        keep_server_warm(ex, m)
    if m.status in SCRIPT_FAILURES:
        raise typer.Exit(1)
    if m.oom:
        console.print(f"It does not fit yet. `oomlab hint {ex.id}` when you want a nudge.")
        raise typer.Exit(1)
    console.print(f"It ran within the budget. `oomlab check {ex.id}` grades it against the reference.")


def run_estimate(ex: Exercise, own: list[str]) -> None:
    """``oomlab run`` of an estimate exercise: the learner's answers for its public examples, and the configs ``own``
    describes (:func:`oomlab.sizing.cpu_count.own_config`), beside the CPU's count.

    Not a grade, and no GPU needed: the estimator runs in its sandbox where this kernel has one (as a check's does),
    and the same configs are counted on the CPU, tensor by tensor (:mod:`oomlab.sizing.cpu_count`).
    """
    from oomlab.grading.estimates import validate
    from oomlab.sizing.cpu_count import count_on_cpu, own_config
    from oomlab.sizing.grade import SIZED
    from oomlab.sizing.present import examples_table
    from oomlab.sizing.sandboxed import run_estimator

    validate(ex)
    kind = SIZED[ex.sizes]
    examples = [*ex.examples, *(own_config(kind, ex.examples[0], text) for text in own)]
    with console.status(f"Running your estimate() on {len(examples)} example configs…"):
        estimates = run_estimator(ex.learner_path, examples, ex.root, sandbox_required=False, parts=kind.parts)
    with console.status(f"Counting the same {len(examples)} configs on the CPU, tensor by tensor…"):
        counts = [count_on_cpu(kind, kind.parse(cfg)) for cfg in examples]
    console.print(examples_table(examples, estimates, counts, kind, "The examples, then yours:" if own else "The examples:"))
    console.print(f"`oomlab check {ex.id}` grades it on hidden configs, each measured on a GPU.")


def estimate_and_show(ex: Exercise, progress: Progress) -> bool:
    """``oomlab check`` of an estimate exercise: its grade (:mod:`oomlab.grading.estimates`) as a table; passed?"""
    from oomlab.grading.estimates import failed_parts, grade_estimate
    from oomlab.grading.present import print_manifest_note
    from oomlab.sizing.present import scores_table

    readable(ex)
    with console.status(f"Checking {ex.id}: your estimate() in its sandbox, then each hidden config on the GPU…"):
        report = grade_estimate(ex, ex.learner_path)
    console.print(scores_table(report))
    print_manifest_note(console, ex)
    show_verdict(ex, progress, report.passed, f"{', '.join(failed_parts(report))} off in some config")
    return report.passed


def show_verdict(ex: Exercise, progress: Progress, passed: bool, why: str = "") -> None:
    """A check's last line, and the exercise marked passed where it passed; ``why`` it did not, where that is short."""
    if passed:
        progress.mark_passed(ex.id)
        console.print(Text(f"✓ {ex.id} passes.", style="bold green"))
    else:
        said = f": {why}." if why else "."
        console.print(Text(f"✗ {ex.id} does not pass yet{said}", style="bold red") + Text(f" `oomlab hint {ex.id}` for a nudge."))


def grade_and_show(ex: Exercise, progress: Progress) -> Report:
    from oomlab.grading.present import print_report
    from oomlab.grading.verdict import grade

    readable(ex)
    refuse_without_a_driver(ex.learner_path, f"grading {ex.id}")
    first = not StateDir(ex.root).references.is_dir()
    with measuring(ex, "Checking (first time here: the reference solution too)" if first else "Checking"):
        report = grade(ex, ex.learner_path)
    print_report(console, report)
    show_verdict(ex, progress, report.passed)
    return report


@app.command()
def check(exercise: str = EXERCISE, keep_warm: bool = KEEP_WARM) -> None:
    """Grade your version: every check, measured against the reference solution on this GPU."""
    course, progress = load()
    ex = course.get(exercise)
    if ex.is_estimate:
        passed = estimate_and_show(ex, progress)  # its configs are measured by the course's code: no server to keep
    else:
        report = grade_and_show(ex, progress)
        if keep_warm:
            keep_server_warm(ex, report.measurement)
        passed = report.passed
    if not passed:
        raise typer.Exit(1)
    nxt = current(course, progress)
    if nxt is not None:
        console.print(f"Next: {nxt.id}. Run `oomlab` for what it is about.")
    else:
        console.print("That was the last exercise: every one passes.")


@app.command()
def hint(exercise: str = EXERCISE) -> None:
    """The next hint: a nudge first, then which tool to use, then what to change."""
    course, progress = load()
    ex = course.get(exercise)
    again = progress.hints_shown(ex.id) >= len(ex.hints)  # every hint was shown already: this repeats the last
    i = progress.next_hint(ex.id, len(ex.hints))
    console.print(Panel(Text(ex.hints[i]), title=f"Hint {i + 1} of {len(ex.hints)} for {ex.id}", title_align="left"))
    if i + 1 < len(ex.hints):
        console.print(Text(f"  (`oomlab hint {ex.id}` again for the next)", style="dim"))
    elif again:
        console.print(Text("  That was the last hint, shown again: there are no more.", style="dim"))
    else:
        console.print(Text("  That is the last hint.", style="dim"))


@app.command()
def interview(
    exercise: str = EXERCISE,
    answer: bool = typer.Option(False, "--answer", help="Show the model answer too: answer aloud first."),
) -> None:
    """The interview question this exercise prepares you for; --answer shows a model answer."""
    course, _ = load()
    ex = course.get(exercise)
    console.print(Panel(Text(ex.interview.question), title=f"Interview question: {ex.id}", title_align="left"))
    if answer:
        console.print(Panel(Text(ex.interview.answer), title="A model answer (about two minutes)", title_align="left"))
    else:
        console.print(Text(f"  Answer it aloud in two minutes, then `oomlab interview {ex.id} --answer`.", style="dim"))


@app.command()
def watch(
    exercise: Optional[str] = typer.Argument(None, help="exercise id or number (default: the current one)"),
    interval: float = typer.Option(0.25, metavar="SECONDS", help="seconds between looks at the file"),
    max_checks: int = typer.Option(0, hidden=True, metavar="N", help="stop after this many checks (0: never)"),
) -> None:
    """Re-check the exercise every time you save it; moves on to the next one when it passes.

    It keeps a measuring server warm (torch imported once), so a re-check costs the
    workload, not the imports; `oomlab check` in another terminal uses it too. Where a
    check or run already keeps one ready, it uses that one, and keeps it from idling out.
    """
    from oomlab.measure import warm
    from oomlab.measure.harness import child_env
    from oomlab.measure.keeper import keep_warm

    course, progress = load()
    ex = course.get(exercise) if exercise else current(course, progress)
    with contextlib.ExitStack() as servers:
        warmed: set[str] = set()

        def own_server(conf: str) -> None:
            warmed.add(conf)
            servers.enter_context(warm.serving(ex.root, [conf], child_env))

        checks, seen = 0, None
        while ex is not None:
            try:
                stamp = ex.learner_path.stat().st_mtime_ns
            except FileNotFoundError:
                stamp = -1
            if stamp != seen:
                seen = stamp
                # torch imported once per setting: each re-check costs the workload alone (without a GPU, nothing runs)
                kept = False
                # An estimate exercise has no script to fork: its configs are measured in a process of their own.
                if not ex.is_estimate and ex.alloc_conf not in warmed and has_nvidia_driver():
                    kept = warm.WarmServer.find(ex.root, ex.alloc_conf) is not None
                    if kept:
                        keep_warm(ex.root, ex.alloc_conf)  # a kept server, ready: used now, so its keeper stays
                    else:
                        own_server(ex.alloc_conf)
                console.rule(f"{ex.id}  {time.strftime('%H:%M:%S')}")
                if ex.is_estimate:
                    passed = estimate_and_show(ex, progress)
                else:
                    report = grade_and_show(ex, progress)
                    if kept and report.measurement.runner != "forked":  # it could not serve this terminal's run: own one
                        own_server(ex.alloc_conf)
                    passed = report.passed
                checks += 1
                if passed and exercise is None:
                    ex = current(course, progress)
                    seen = None
                    if ex is not None:
                        console.print(Panel(Text(ex.summary), title=f"Next: {ex.id}: {ex.title}", title_align="left"))
                        console.print(next_steps(ex))
                    continue
                console.print(
                    Text(f"Watching {relpath(ex.learner_path, ex.root)}; save to re-check, Ctrl-C to stop.", style="dim")
                )
            if max_checks and checks >= max_checks:
                return
            time.sleep(interval)
    console.print(Text("Every exercise passes.", style="bold green"))


@app.command()
def stop() -> None:
    """Stop the measuring servers `oomlab check` and `run` keep warm for this course (they stop by themselves when idle)."""
    from oomlab.measure.keeper import stop_keepers

    stopped = stop_keepers(Course(strict=False).root)  # whatever state the exercises and the progress are in
    console.print(
        f"Stopped {stopped} warm measuring server{'s' if stopped != 1 else ''}."
        if stopped
        else "No warm measuring server runs for this course."
    )


@app.command()
def reset(exercise: str = EXERCISE) -> None:
    """Put the original exercise back; your version is kept as a backup."""
    course, _ = load()
    ex = course.get(exercise)
    missing = not ex.learner_path.exists()
    backup = reset_exercise(ex)
    path = relpath(ex.learner_path, ex.root)
    if missing:
        console.print(f"{path} was missing: restored the original.")
    elif backup is None:
        console.print(f"{path} is already the original.")
    else:
        console.print(f"Restored {path}. Your version is kept at {relpath(backup, ex.root)}.")


@app.command()
def solution(exercise: str = EXERCISE) -> None:
    """The reference fix, as a diff against the original: only once your version passes."""
    course, progress = load()
    ex = course.get(exercise)
    if not progress.passed(ex.id):
        console.print(f"The solution opens once {ex.id} passes `oomlab check {ex.id}`. `oomlab hint {ex.id}` helps meanwhile.")
        raise typer.Exit(1)
    try:
        fixed = ex.solution_path.read_text(encoding="utf-8")
    except OSError as err:
        raise read_error(ex.solution_path, err, "the reference fix") from None
    diff = "".join(
        difflib.unified_diff(
            pristine_source(ex).splitlines(keepends=True),
            fixed.splitlines(keepends=True),
            fromfile=f"exercises/{ex.id}/{ex.file} (original)",
            tofile=f"solutions/{ex.id}/{ex.file}",
        )
    )
    if diff:
        console.print(Syntax(diff, "diff", theme="ansi_dark", word_wrap=True))  # long lines wrap, never cut
    else:  # the original was first seen already fixed: show the whole reference fix
        console.print(Syntax(fixed, "python", theme="ansi_dark", line_numbers=True, word_wrap=True))
    console.print(Text(f"Whole file: {relpath(ex.solution_path, ex.root)}", style="dim"))


@app.command()
def doctor() -> None:
    """Is this machine ready? Python, torch, GPU, whether each budget fits, allocator settings, a warm server kept."""
    from oomlab.measure.machine import diagnose, has_nvidia_driver, without_a_gpu

    with console.status("Looking at Python, torch and the GPU…"):
        rows, ready = diagnose()
    table = Table(header_style="bold")
    for col in ("", "item", "finding"):
        table.add_column(col)
    marks = {"ok": Text("ok", style="green"), "warn": Text("warn", style="yellow"), "fail": Text("FAIL", style="bold red")}
    for level, item, finding in rows:
        table.add_row(marks[level], item, finding)
    console.print(table)
    if not ready and not has_nvidia_driver():
        console.print(
            Text(
                "There is no NVIDIA GPU on this machine, so nothing can be measured here "
                "(`oomlab check`, `watch`, the tools, and `run` of a script need one). What works without a GPU:",
                style="yellow",
            )
        )
        for cmd, what in without_a_gpu():
            console.print(Text.assemble("  ", (cmd, "bold cyan"), f": {what}"))
        raise typer.Exit(1)
    if not ready:
        console.print(
            "Measuring (`oomlab run`, `check`, `watch`, the tools on a script, `dev verify`) needs what is marked FAIL. "
            "Without it, `oomlab list`, `hint`, `interview`, `reset`, and `snapshot` and `compare` on saved snapshots still work."
        )
        raise typer.Exit(1)
    console.print(Text("Ready: every exercise can be measured here.", style="green"))
