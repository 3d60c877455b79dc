"""How measurements, verdicts and failures look in the terminal (rich)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from oomlab.course.manifest import Exercise
from oomlab.course.originals import manifest_note
from oomlab.course.state import relpath
from oomlab.figure_names import NAMES
from oomlab.grading.verdict import Report, unwitnessed
from oomlab.measure.harness import SCRIPT_FAILURES, Measurement
from oomlab.oom import first_line
from oomlab.units import format_bytes

FIGURES = ("peak_allocated", "peak_reserved", "inactive_split_peak", "retries", "ooms")  # the figures table's rows


def figures_table(m: Measurement) -> Table:
    table = Table(title="Allocator figures", title_justify="left", show_header=True, header_style="bold")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("what it means", style="dim")
    stats = m.stats or {}
    for key in FIGURES:
        value = stats.get(key)
        shown = str(value) if key in ("retries", "ooms") else format_bytes(value)
        table.add_row(NAMES[key].label, shown, NAMES[key].meaning)
    budget = format_bytes(m.budget_bytes) if m.budget_bytes else "none"
    table.add_row("budget", budget, "the cap the run had (set_per_process_memory_fraction)")
    return table


def workload_line(m: Measurement) -> str:
    w = m.workload or {}
    if not w:
        return ""
    return (
        f"Workload: {w.get('optimizer_steps', 0)} optimizer steps, {w.get('train_samples', 0):,} training samples, "
        f"{w.get('inference_samples', 0):,} evaluation/no-grad samples; ran for {m.wall_s or 0:.1f} s "
        f"({runner_text(m)})."
    )


def runner_text(m: Measurement) -> str:
    """How the run was measured, and why in a fresh process when a warm server was about but could not take it."""
    total = f"{m.process_s:.1f} s in all" if m.process_s is not None else "measured"
    if m.runner == "forked":
        return f"{total}, forked from the warm server"
    return f"{total}, in a fresh process" + (
        f": {m.runner_note.removeprefix('measured in a fresh process: ')}" if m.runner_note else ""
    )


def oom_panel(m: Measurement, root: Path) -> Panel:
    first = first_line(m.message, None) or "CUDA out of memory"
    body = Text()
    if m.where:
        body.append(f"{relpath(m.script, root)}:{m.line_no}\n", style="bold")
        body.append(f"    {m.line}\n\n", style="cyan")
    # The allocator's own message is long; its sentences are worth reading one per line.
    for sentence in first.replace("; ", ".\n").replace(". ", ".\n").splitlines():
        body.append(sentence.strip() + "\n")
    return Panel(body, title="CUDA out of memory", border_style="red", title_align="left")


def script_failure(m: Measurement, ex: Exercise) -> Panel:
    """A run that did not reach its end through the script's own doing, in one clear message."""
    path = relpath(m.script, ex.root)
    text = Text()
    if m.status == "missing":
        title = "File missing"
        text.append(f"{path} does not exist.\n")
        text.append(f"`oomlab reset {ex.id}` puts the original back.")
    elif m.status == "syntax":
        title = "Syntax error"
        text.append(f"{path}:{m.line_no}: {m.message}\n", style="bold")
        text.append(f"    {m.line}\n\n", style="cyan")
        text.append("Fix the line and run again. Nothing was run, and your file was not changed.")
    elif m.status == "timeout":
        title = "Time limit"
        text.append(f"{path} ran longer than its limit of {ex.time_limit_s:g} s and was stopped.\n")
        text.append("Look for a loop that never ends, or work added to every step.")
    elif m.status == "exit":
        title = "Script exited"
        text.append(f"{path}: {m.message}.\n")
        text.append("A graded run has to reach the end of the script.")
    elif m.status == "crashed":
        title = "Process ended early"
        text.append(f"{path}: {m.message}.\n")
        text.append("os._exit() or a crash in native code ends the process before it can be measured.")
    else:
        title = f"{m.error_type or 'Error'} in the script"
        where = f" at {path}:{m.line_no}" if m.line_no else ""
        text.append(f"{m.error_type}{where}: {m.message[:500]}\n", style="bold")
        if m.line:
            text.append(f"    {m.line}\n", style="cyan")
        text.append("\nFix the error and run again; `oomlab run` shows the script's own output.")
    tail = "\n".join(m.stderr.splitlines()[-6:]) if m.status in ("error", "crashed") and not m.line_no else ""
    parts = [text] + ([Text("\nLast lines on stderr:\n" + tail, style="dim")] if tail else [])
    return Panel(Group(*parts), title=title, border_style="red", title_align="left")


def notes(m: Measurement, ex: Exercise) -> list[str]:
    found = []
    if m.alloc_conf_changed:
        conf = m.alloc_conf or "the defaults"
        where = (
            "Set it at the top of the script, before anything but imports, as the reference fix does."
            if ex.learner_settings
            else "This exercise keeps the allocator settings fixed: fix the code."
        )
        found.append(
            f"The script sets {', '.join(m.alloc_conf_changed)} after CUDA had started with {conf}, "
            f"so the setting had no effect. {where}"
        )
    elif m.alloc_conf_declared:
        found.append(f"The script sets the allocator's settings itself: the run started with {m.alloc_conf or 'the defaults'}.")
    sandbox = m.sandbox or {}
    if sandbox and not sandbox.get("applied") and sandbox.get("reason") != "not asked for":
        found.append(
            f"This run was not sandboxed ({sandbox.get('reason')}): the script could have read the answers. "
            "A class's grading refuses a machine like this one."
        )
    if why := unwitnessed(m):
        found.append(
            f"The driver did not witness this run ({why}): its memory figures are the process's own word. "
            "A class's grading refuses a machine like this one."
        )
    return found


def checks_table(report: Report) -> Table:
    table = Table(show_header=True, header_style="bold", title=f"Checks for {report.exercise.id}", title_justify="left")
    table.add_column("")
    table.add_column("check")
    table.add_column("measured", justify="right")
    table.add_column("required", justify="right")
    for c in report.checks:
        mark = Text("PASS", style="green") if c.passed else Text("FAIL", style="bold red")
        table.add_row(mark, c.name, c.measured, c.threshold)
    return table


def print_manifest_note(console: Console, ex: Exercise) -> None:
    """Name the learner's edited ``exercise.toml``, which grades nothing: the course's own was used."""
    if note := manifest_note(ex):
        console.print(Text(f"Note: {note}", style="yellow"))


def print_run(console: Console, m: Measurement, ex: Exercise) -> None:
    """A run's own figures, as ``oomlab run`` shows them: how it failed, or its OOM and the allocator's figures."""
    if m.status in SCRIPT_FAILURES:
        console.print(script_failure(m, ex))
        return
    if m.status == "oom":
        console.print(oom_panel(m, ex.root))
    console.print(figures_table(m))
    for note in notes(m, ex):
        console.print(Text(f"Note: {note}", style="yellow"))
    if line := workload_line(m):
        console.print(Text(line, style="dim"))


def unfinished(report: Report) -> bool:
    """Whether the run did not get to its end (a syntax error, a crash, the time limit, the sandbox): not graded, and
    any check it carries says only why (what it reached for)."""
    return not report.checks or report.measurement.status in SCRIPT_FAILURES


def print_report(console: Console, report: Report) -> None:
    m, ex = report.measurement, report.exercise
    if unfinished(report):
        console.print(script_failure(m, ex))
        for c in report.checks:  # a run the sandbox stopped says what it reached for
            console.print(Text.assemble(("✗ ", "red"), (c.name, "bold"), f": {c.detail}"))
            console.print(Text(f"  Why it matters: {c.why}", style="dim"))
        print_manifest_note(console, ex)
        return
    if m.oom and m.status == "oom":
        console.print(oom_panel(m, ex.root))
    console.print(checks_table(report))
    for c in report.checks:
        if not c.passed:
            console.print(Text.assemble(("✗ ", "red"), (c.name, "bold"), f": {c.detail}"))
            console.print(Text(f"  Why it matters: {c.why}", style="dim"))
    for note in notes(m, ex):
        console.print(Text(f"Note: {note}", style="yellow"))
    print_manifest_note(console, ex)
    if line := workload_line(m):
        console.print(Text(line, style="dim"))
