"""``oomlab``: the learner's command line.

Exit codes: 0 done or passed, 1 the exercise does not pass yet (or the run
failed), 2 something to fix outside the exercise (a clear message says what),
3 a bug in oomlab itself (the traceback goes to .oomlab/last-error.txt).
"""

from __future__ import annotations

import difflib
import json
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from oomlab import __version__
from oomlab.course import Course
from oomlab.errors import OomLabError
from oomlab.grading.verdict import Report, grade, machine_error
from oomlab.measure.harness import MACHINE_PROBLEMS, SCRIPT_FAILURES, measure_exercise_file
from oomlab.course.manifest import Exercise
from oomlab.course.progress import Progress, keep_originals, pristine_source, reset as reset_exercise
from oomlab.cli.render import figures_table, notes, oom_panel, print_report, relpath, script_failure, workload_line

app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    help="OOM Lab: debug PyTorch GPU out-of-memory errors and allocator fragmentation, one graded exercise at a time.",
)
console = Console(highlight=False)
STEP_NAMES = {"snapshot": "1 snapshot", "hunt": "2 hunt references", "profile": "3 profile peaks"}


def load() -> tuple[Course, Progress]:
    course = Course()
    keep_originals(course.exercises)  # at first sight, so that `oomlab reset` has the original without git
    return course, Progress(course.state_dir)


def current(course: Course, progress: Progress) -> Exercise | None:
    return next((e for e in course.exercises if not progress.passed(e.id)), None)


def next_steps(ex: Exercise) -> Text:
    rows = (
        (f"oomlab run {ex.id}", f"run it under its {ex.budget_mib / 1024:.2f} GiB budget and see what happens"),
        (f"oomlab check {ex.id}", "grade your fix"),
        (f"oomlab hint {ex.id}", "a hint; one more each time you ask"),
        ("oomlab watch", "re-check on every save"),
    )
    text = Text(f"Edit {relpath(ex.learner_path, ex.root)}, then:\n")
    for cmd, what in rows:
        text.append(f"  {cmd:<28}", style="bold cyan")
        text.append(f"{what}\n")
    return text


@app.callback()
def overview(ctx: typer.Context) -> None:
    """With no command: your progress, the current exercise and what to do next."""
    if ctx.invoked_subcommand is not None:
        return
    course, progress = load()
    done = sum(progress.passed(e.id) for e in course.exercises)
    total = len(course.exercises)
    console.print(Text("OOM Lab", style="bold"), Text(f"  {done}/{total} exercises passed"))
    console.print(ProgressBar(total=max(total, 1), completed=done, width=40))
    ex = current(course, progress)
    for i, e in enumerate(course.exercises, 1):
        mark = "✓" if progress.passed(e.id) else ("→" if e is ex else "·")
        style = "green" if mark == "✓" else ("bold" if mark == "→" else "dim")
        console.print(Text(f" {mark} {i}. {e.id:<16} {e.title}  [{STEP_NAMES[e.step]}]", style=style))
    if ex is None:
        console.print(Panel("Every exercise passes. `oomlab solution ID` shows each reference fix to compare with yours.", border_style="green"))
        return
    console.print(Panel(Text(ex.summary), title=f"Now: {ex.id}: {ex.title}", title_align="left"))
    console.print(next_steps(ex))
    if shutil.which("nvidia-smi") is None:  # cheap: the overview does not import torch
        console.print(Text("No NVIDIA driver on this machine: `run` and `check` need a GPU. `oomlab doctor` says more.", style="yellow"))


@app.command("list")
def list_exercises() -> None:
    """All exercises, in order, with their status."""
    course, progress = load()
    ex_now = current(course, progress)
    table = Table(header_style="bold")
    for col in ("#", "exercise", "title", "workflow step", "budget", "status"):
        table.add_column(col)
    for i, e in enumerate(course.exercises, 1):
        status = Text("passed", style="green") if progress.passed(e.id) else Text("current" if e is ex_now else "to do", style="bold" if e is ex_now else "dim")
        table.add_row(str(i), e.id, e.title, STEP_NAMES[e.step], f"{e.budget_mib / 1024:.2f} GiB", status)
    console.print(table)


def measuring(ex: Exercise, what: str = "Measuring"):
    return console.status(f"{what} {ex.id} in a fresh process under its {ex.budget_mib / 1024:.2f} GiB budget…")


@app.command()
def run(exercise: str = typer.Argument(..., help="exercise id or number")) -> None:
    """Run your version under the exercise's budget and show the OOM or the memory figures."""
    course, _ = load()
    ex = course.get(exercise)
    with measuring(ex, "Running"):
        m = measure_exercise_file(ex, ex.learner_path)
    if m.status in MACHINE_PROBLEMS:
        raise machine_error(m, ex)
    if m.stdout.strip():
        console.print(Panel(Text(m.stdout.rstrip()[-3000:]), title="Script output", title_align="left", border_style="dim"))
    if m.status in SCRIPT_FAILURES:
        console.print(script_failure(m, ex))
        raise typer.Exit(1)
    if m.status == "oom":
        console.print(oom_panel(m, ex.root))
    console.print(figures_table(m))
    for note in notes(m, ex):
        console.print(Text(f"Note: {note}", style="yellow"))
    if line := workload_line(m):
        console.print(Text(line, style="dim"))
    if m.oom:
        console.print(f"It does not fit yet. `oomlab hint {ex.id}` when you want a nudge.")
        raise typer.Exit(1)
    console.print(f"It ran within the budget. `oomlab check {ex.id}` grades it against the reference.")


def grade_and_show(ex: Exercise, progress: Progress) -> Report:
    first = not (ex.root / ".oomlab" / "reference").is_dir()
    with measuring(ex, "Checking (first time here: the reference solution too)" if first else "Checking"):
        report = grade(ex, ex.learner_path)
    print_report(console, report)
    if report.passed:
        progress.mark_passed(ex.id)
        console.print(Text(f"✓ {ex.id} passes.", style="bold green"))
    else:
        console.print(Text(f"✗ {ex.id} does not pass yet.", style="bold red") + Text(f" `oomlab hint {ex.id}` for a nudge."))
    return report


@app.command()
def check(exercise: str = typer.Argument(..., help="exercise id or number")) -> None:
    """Grade your version: every check, measured against the reference solution on this GPU."""
    course, progress = load()
    ex = course.get(exercise)
    report = grade_and_show(ex, progress)
    if not report.passed:
        raise typer.Exit(1)
    nxt = current(course, progress)
    if nxt is not None:
        console.print(f"Next: {nxt.id}. Run `oomlab` for what it is about.")
    else:
        console.print("That was the last exercise: every one passes.")


@app.command()
def hint(exercise: str = typer.Argument(..., help="exercise id or number")) -> None:
    """The next hint: a nudge first, then which tool to use, then what to change."""
    course, progress = load()
    ex = course.get(exercise)
    i = progress.next_hint(ex.id, len(ex.hints))
    more = "" if i + 1 == len(ex.hints) else f"  (`oomlab hint {ex.id}` again for the next)"
    console.print(Panel(Text(ex.hints[i]), title=f"Hint {i + 1} of {len(ex.hints)} for {ex.id}", title_align="left"))
    if more:
        console.print(Text(more, style="dim"))


@app.command()
def watch(
    exercise: Optional[str] = typer.Argument(None, help="exercise id or number (default: the current one)"),
    interval: float = typer.Option(0.5, help="seconds between looks at the file"),
    max_checks: int = typer.Option(0, hidden=True, help="stop after this many checks (0: never)"),
) -> None:
    """Re-check the exercise every time you save it; moves on to the next one when it passes."""
    course, progress = load()
    ex = course.get(exercise) if exercise else current(course, progress)
    checks, seen = 0, None
    while ex is not None:
        try:
            stamp = ex.learner_path.stat().st_mtime_ns
        except FileNotFoundError:
            stamp = -1
        if stamp != seen:
            seen = stamp
            console.rule(f"{ex.id}  {time.strftime('%H:%M:%S')}")
            report = grade_and_show(ex, progress)
            checks += 1
            if report.passed and exercise is None:
                ex = current(course, progress)
                seen = None
                if ex is not None:
                    console.print(Panel(Text(ex.summary), title=f"Next: {ex.id}: {ex.title}", title_align="left"))
                    console.print(next_steps(ex))
                continue
            console.print(Text(f"Watching {relpath(ex.learner_path, ex.root)}; save to re-check, Ctrl-C to stop.", style="dim"))
        if max_checks and checks >= max_checks:
            return
        time.sleep(interval)
    console.print(Text("Every exercise passes.", style="bold green"))


@app.command()
def reset(exercise: str = typer.Argument(..., help="exercise id or number")) -> None:
    """Put the original exercise back; your version is kept as a backup."""
    course, _ = load()
    ex = course.get(exercise)
    backup = reset_exercise(ex)
    path = relpath(ex.learner_path, ex.root)
    if backup is None:
        console.print(f"{path} is already the original.")
    else:
        console.print(f"Restored {path}. Your version is kept at {relpath(backup, ex.root)}.")


@app.command()
def solution(exercise: str = typer.Argument(..., help="exercise id or number")) -> None:
    """The reference fix, as a diff against the original: only once your version passes."""
    course, progress = load()
    ex = course.get(exercise)
    if not progress.passed(ex.id):
        console.print(f"The solution opens once {ex.id} passes `oomlab check {ex.id}`. `oomlab hint {ex.id}` helps meanwhile.")
        raise typer.Exit(1)
    fixed = ex.solution_path.read_text(encoding="utf-8")
    diff = "".join(
        difflib.unified_diff(
            pristine_source(ex).splitlines(keepends=True),
            fixed.splitlines(keepends=True),
            fromfile=f"exercises/{ex.id}/{ex.file} (original)",
            tofile=f"solutions/{ex.id}/{ex.file}",
        )
    )
    if diff:
        console.print(Syntax(diff, "diff", theme="ansi_dark"))
    else:  # the original was first seen already fixed (no git): show the whole reference fix
        console.print(Syntax(fixed, "python", theme="ansi_dark", line_numbers=True))
    console.print(Text(f"Whole file: {relpath(ex.solution_path, ex.root)}", style="dim"))


@app.command()
def doctor() -> None:
    """Is this machine ready? Python, torch, GPU, whether each budget fits, allocator settings."""
    from oomlab.measure.machine import diagnose

    with console.status("Looking at Python, torch and the GPU…"):
        rows, ready = diagnose()
    table = Table(header_style="bold")
    for col in ("", "item", "finding"):
        table.add_column(col)
    marks = {"ok": Text("ok", style="green"), "warn": Text("warn", style="yellow"), "fail": Text("FAIL", style="bold red")}
    for level, item, finding in rows:
        table.add_row(marks[level], item, finding)
    console.print(table)
    if not ready:
        console.print(
            "Measuring (`oomlab run`, `check`, `watch`, `verify`) needs what is marked FAIL. "
            "Without it, `oomlab list`, `hint`, `reset` and the course pages still work."
        )
        raise typer.Exit(1)
    console.print(Text("Ready: every exercise can be measured here.", style="green"))


@app.command()
def verify(
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the machine-readable report here"),
) -> None:
    """The course's own truth check: every seeded bug fails, every reference fix passes, every wrong fix is caught."""
    from oomlab.grading.truth import verify as verify_course

    course, _ = load()
    with console.status("Verifying…") as status:
        report = verify_course(course.exercises, note=lambda s: status.update(f"Verifying: {s}…"))
    table = Table(header_style="bold", title=f"verify on {report['gpu']}, torch {report['torch']}", title_justify="left")
    for col in ("exercise", "run", "verdict", "expected", "OOM", "peak alloc", "peak reserved", "non-releasable", "retries"):
        table.add_column(col)
    fmt = lambda b: "n/a" if b is None else f"{b / 2**20:,.0f} MiB"  # noqa: E731
    for row in report["exercises"]:
        runs = [("buggy", row["buggy"]), ("solution", row["solution"])] + [(w["name"], w) for w in row["wrong_fixes"]]
        for name, r in runs:
            expected = "pass" if r["expected_failure"] is None else f"fail {r['expected_failure']}"
            ok = Text("✓ " if r["as_expected"] else "✗ ", style="green" if r["as_expected"] else "bold red")
            table.add_row(row["id"], name, r["verdict"], ok + expected, "yes" if r["oom"] else "no", fmt(r["peak_allocated"]), fmt(r["peak_reserved"]), fmt(r["inactive_split_peak"]), str(r["retries"]))
    console.print(table)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        console.print(f"Wrote {json_path}")
    if not report["ok"]:
        console.print(Text("Verification failed: see the ✗ rows.", style="bold red"))
        raise typer.Exit(1)
    console.print(Text(f"All as expected ({report['wall_s']} s).", style="green"))


TARGET_HELP = "an exercise id or number, or a script and its arguments (put -- before options meant for the script)"
BUDGET_HELP = "memory cap such as 2GiB (default: the exercise's budget; a script runs uncapped)"
TOOL_CONTEXT = {"ignore_unknown_options": True, "allow_extra_args": True}


def tool_module(name: str):
    import importlib

    return importlib.import_module(f"oomlab.tools.{name}")


def run_and_show(name: str, target, out: Path | None) -> dict:
    """Run one tool on the target, print what it found and draw its pictures."""
    from oomlab.tools.run import run_tool

    with console.status(f"{name}: running {target.label} with the probe in a fresh process…"):
        m, result = run_tool(target, name, out)
    run = result["run"]
    ended = f"OOM at {run['where']}" if m.oom else ("finished" if m.status == "ok" else f"{m.status} {run['where']}")
    console.rule(f"{name} · {target.label} · {ended} · {run['wall_s'] or 0:.1f} s")
    module = tool_module(name)
    for part in module.render(result):
        console.print(part)
    if result.get("error"):
        console.print(Text(f"The probe reported a problem: {result['error']}", style="yellow"))
    try:
        pictures = module.draw(result, Path(result["out_dir"]))
    except Exception as err:  # a picture is a bonus: the findings above stand without it
        pictures = []
        console.print(Text(f"Could not draw the pictures: {type(err).__name__}: {err}", style="yellow"))
    for picture in pictures:
        console.print(Text(f"Picture: {picture}", style="dim"))
    return result


@app.command(context_settings=TOOL_CONTEXT)
def snapshot(
    target: list[str] = typer.Argument(..., help=TARGET_HELP),
    budget: Optional[str] = typer.Option(None, help=BUDGET_HELP),
    out: Optional[Path] = typer.Option(None, help="folder for the snapshot, report and pictures"),
    time_limit: Optional[float] = typer.Option(None, help="seconds before the run is stopped"),
) -> None:
    """Step 1: record the allocator's history, dump a snapshot at the OOM or the end, and explain the fragmentation.

    Given a snapshot file (.pickle) instead of a target, it analyzes that file without running anything.
    """
    from oomlab.tools.run import resolve

    if target[0].endswith((".pickle", ".pkl")):
        show_snapshot_file(Path(target[0]), out)
        return
    result = run_and_show("snapshot", resolve(target, budget, time_limit), out)
    pickle_path = Path(result["out_dir"]) / "snapshot.pickle"
    if pickle_path.is_file():
        console.print(
            Text(
                f"Snapshot: {pickle_path}. PyTorch's viewer (https://pytorch.org/memory_viz, needs the internet) opens it; "
                f"offline, `python -m torch.cuda._memory_viz stats {pickle_path}` prints its totals.",
                style="dim",
            )
        )


def show_snapshot_file(path: Path, out: Path | None) -> None:
    """Analyze a snapshot dumped earlier (by this tool or by torch.cuda.memory._dump_snapshot)."""
    from oomlab.tools import snapshot as tool

    result = tool.analyze(tool.load_snapshot(path))
    out_dir = out or path.with_suffix("")
    out_dir.mkdir(parents=True, exist_ok=True)
    console.rule(f"snapshot · {path.name}")
    for part in tool.render(result):
        console.print(part)
    for picture in tool.draw(result, out_dir):
        console.print(Text(f"Picture: {picture}", style="dim"))


def tool_command(name: str, doc: str) -> None:
    """Register ``oomlab NAME TARGET``: one tool, run once on the target."""

    def command(
        target: list[str] = typer.Argument(..., help=TARGET_HELP),
        budget: Optional[str] = typer.Option(None, help=BUDGET_HELP),
        out: Optional[Path] = typer.Option(None, help="folder for the report and picture"),
        time_limit: Optional[float] = typer.Option(None, help="seconds before the run is stopped"),
    ) -> None:
        from oomlab.tools.run import resolve

        run_and_show(name, resolve(target, budget, time_limit), out)

    command.__doc__ = doc
    app.command(name, context_settings=TOOL_CONTEXT)(command)


tool_command("hunt", "Step 2: find GPU memory that outlives its step and name the object that holds it.")
tool_command("profile", "Step 3: profile memory by operator and category, and name the op and line at the peak.")


@app.command(context_settings=TOOL_CONTEXT)
def diagnose(
    target: list[str] = typer.Argument(..., help=TARGET_HELP),
    budget: Optional[str] = typer.Option(None, help=BUDGET_HELP),
    out: Optional[Path] = typer.Option(None, help="folder for all three tools' results"),
    time_limit: Optional[float] = typer.Option(None, help="seconds before each run is stopped"),
) -> None:
    """All three steps in order, then one summary: what to fix first."""
    from oomlab.tools.run import TOOLS, default_out_dir, resolve, summarize

    resolved = resolve(target, budget, time_limit)
    base = out or default_out_dir(resolved, "diagnose")
    results = {name: run_and_show(name, resolved, base / name) for name in TOOLS}
    verdict = summarize(results)
    (base / "diagnose.json").write_text(json.dumps(verdict, indent=2) + "\n", encoding="utf-8")
    body = Text()
    for name, finding in verdict["findings"].items():
        body.append(f"{name:<9}", style="bold")
        body.append(f"{finding['kind']:<16}", style="cyan")
        body.append(f"{finding['headline']}\n")
    body.append("\nFix first: ", style="bold")
    body.append(f"{verdict['headline']}\n{verdict['advice']}\n\n")
    body.append(verdict["then"], style="dim")
    console.print(Panel(body, title=f"diagnose · {resolved.label}", title_align="left", border_style="cyan"))


@app.command()
def figures(out: Path = typer.Option(Path("course/figures"), help="where the site's pictures go")) -> None:
    """Regenerate the course site's pictures from real runs: each exercise's tool on its seeded bug."""
    from oomlab.site.figures import regenerate

    course, _ = load()
    with console.status("Running each exercise's tool…") as status:
        written = regenerate(course, out, note=lambda s: status.update(s))
    for path in written:
        console.print(f"Wrote {relpath(path, course.root)}")


@app.command(hidden=True)
def version() -> None:
    console.print(__version__)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error the user can act on becomes one message, never a traceback."""
    try:
        app(args=argv, prog_name="oomlab")
    except OomLabError as err:
        console.print(Panel(Text(err.what) + (Text("\n" + err.todo, style="bold") if err.todo else Text()), border_style="red", title="oomlab", title_align="left"))
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("Interrupted.")
        sys.exit(130)
    except Exception as err:  # a bug in oomlab: keep the details, show one line
        try:
            log = Course().state_dir / "last-error.txt"
        except Exception:  # no course folder here: keep it beside the user
            log = Path(".oomlab") / "last-error.txt"
        try:
            log.parent.mkdir(exist_ok=True)
            log.write_text(traceback.format_exc(), encoding="utf-8")
            where = f" Details: {log}."
        except OSError:
            where = ""
        console.print(Text(f"oomlab hit an internal error: {type(err).__name__}: {err}.{where} Please report it.", style="red"))
        sys.exit(3)
