"""The workflow's tools as commands: one per step (``oomlab snapshot | hunt | profile``), ``diagnose`` and ``compare``.

Each works on an exercise (by id or number, under its budget) or on any
script with its arguments (``oomlab hunt --budget 2GiB train.py -- --lr 3e-4``);
``compare`` sets two snapshots or two runs side by side.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import typer
from rich.panel import Panel
from rich.text import Text

from oomlab.cli import app, console
from oomlab.course.state import make_folder, remove_empty_folders, shown, write_atomic
from oomlab.errors import OomLabError
from oomlab.steps import STEPS, fix_first, step
from oomlab.tools import analysis, presenter
from oomlab.tools.compare import DEFAULT_TOP
from oomlab.tools.ranks.analysis import needs_launcher
from oomlab.tools.run import (
    Target,
    budget_option,
    close_files,
    default_out_dir,
    is_pickle,
    path_kind,
    resolve,
    run_tool,
    run_tool_on_ranks,
    time_limit_option,
)

TARGET = typer.Argument(
    ...,
    help="an exercise id or number, or a script and its arguments (put -- before options meant for the script), "
    "or a torchrun job: torchrun --nproc-per-node N script.py",
)
BUDGET = typer.Option(
    None, metavar="SIZE", help="memory cap such as 2GiB (default: the exercise's budget; a script runs uncapped)"
)
TIME_LIMIT = typer.Option(None, metavar="SECONDS", help="seconds before the run is stopped")
ALL_STEPS = typer.Option(
    False,
    "--all-steps",
    help=f"profile every optimizer step, not the first {step('profile').options['max_steps']} (slow on long runs)",
)
CONTEXT = {"ignore_unknown_options": True, "allow_extra_args": True}


def tool_options(name: str, all_steps: bool = False) -> dict:
    """The probe options of a run from the command line: the step's own, less the bound ``--all-steps`` lifts."""
    options = dict(step(name).options)
    if all_steps:
        options.pop("max_steps", None)
    return options


def run_and_show(name: str, target: Target, out: Path | None, measured: tuple | None = None, all_steps: bool = False) -> dict:
    """Run one tool on the target (unless ``measured`` already holds its run), print what it found, draw its pictures."""
    if measured is None:
        with console.status(f"{name}: running {target.label} with the probe in a fresh process…"):
            measured = run_tool(target, name, out, tool_options(name, all_steps))
    m, result = measured
    run = result["run"]
    ended = f"OOM at {run['where']}" if m.oom else ("finished" if m.status == "ok" else f"{m.status} {run['where']}")
    console.rule(f"{name} · {target.label} · {ended} · {run['wall_s'] or 0:.1f} s")
    show(name, result, Path(result["out_dir"]))
    if needs_launcher(run.get("message") or ""):
        console.print(
            Text(
                f"{target.script.name} starts torch.distributed, which needs the environment its launcher sets: "
                f"run it as a torchrun job, oomlab {name} torchrun --nproc-per-node 2 {target.script.name}",
                style="yellow",
            )
        )
    return result


def run_and_show_ranks(name: str, target: Target, out: Path | None, result: dict | None = None, all_steps: bool = False) -> dict:
    """Run one tool on every rank of a torchrun job (unless ``result`` holds that run) and show the view across ranks.

    The rank to read first (the first to fail, else the largest) is shown in full, as one run
    would be; every rank's pictures are drawn into its own folder.
    """
    from oomlab.tools.ranks import present as ranks_present

    if result is None:
        with console.status(f"{name}: running {target.script.name} as {target.ranks} ranks under torchrun, each with the probe…"):
            result = run_tool_on_ranks(target, name, out, tool_options(name, all_steps))
    rank = ranks_present.focus(result)
    for other, report in sorted(result["reports"].items()):
        if other != rank:
            with contextlib.suppress(Exception):  # a picture is a bonus; the focused rank's problems are said below
                presenter(name).draw(report, Path(report["out_dir"]))
    if rank in result["reports"]:
        console.rule(f"{name} · {target.script.name} · rank {rank} of {target.ranks}")
        show(name, result["reports"][rank], Path(result["reports"][rank]["out_dir"]))
    console.rule(f"{name} · {target.script.name} · {target.ranks} ranks · {result['job']['wall_s']:.1f} s")
    show(name, result, Path(result["out_dir"]), ranks_present)
    if rank is not None:
        console.print(Text(f"Read rank {rank} first: {Path(result['out_dir']) / f'rank{rank}'}", style="dim"), soft_wrap=True)
    console.print(Text(f"Result: {Path(result['out_dir']) / 'ranks.json'}", style="dim"), soft_wrap=True)
    return result


def run_all_tools(target: Target, base: Path, all_steps: bool, status) -> dict[str, tuple]:
    """Each step's tool on ``target``, all at once: ``{name: (measurement, result)}``.

    Each tool is its own process under its own budget. Under a budget the GPU
    holds them side by side (as many as fit). A script run uncapped may want
    the whole GPU; the others' memory then changes its run only where a
    ``cudaMalloc`` failed, which the allocator counts (a retry, or an OOM).
    Such a run is measured again alone, so every figure is the one a run of
    its own would give.
    """
    from oomlab.measure.machine import parallel_runs

    jobs = min(len(STEPS), parallel_runs([target.budget_bytes])) if target.budget_bytes else len(STEPS)

    def run(name: str) -> tuple:
        return run_tool(target, name, base / name, tool_options(name, all_steps))

    with ThreadPoolExecutor(jobs) as pool:
        measured = dict(zip([s.name for s in STEPS], pool.map(run, [s.name for s in STEPS]), strict=True))
    if target.budget_bytes is None:
        crowded = [name for name, (m, _) in measured.items() if m.oom or (m.stats or {}).get("retries")]
        for name in crowded:
            status.update(f"diagnose: {name} ran short of GPU memory beside the others; running it alone…")
            measured[name] = run(name)
    return measured


def show(name: str, result: dict, out_dir: Path, present=None) -> None:
    """A tool's findings in the terminal, and its pictures drawn into ``out_dir`` (by ``present``, default the step's)."""
    present = present or presenter(name)
    for part in present.render(result):
        console.print(part)
    if result.get("error"):
        console.print(Text(f"The probe reported a problem: {result['error']}", style="yellow"))
    try:
        pictures = present.draw(result, out_dir)
    except Exception as err:  # a picture is a bonus: the findings above stand without it
        pictures = []
        console.print(Text(f"Could not draw the pictures: {type(err).__name__}: {err}", style="yellow"))
    for picture in pictures:
        console.print(Text(f"Picture: {picture}", style="dim"), soft_wrap=True)  # a path is copied whole, never broken


def tool_command(name: str, summary: str) -> None:
    """Register ``oomlab NAME TARGET``: one tool, run once on the target (``--all-steps`` where steps are bounded)."""

    def command(
        target: list[str] = TARGET,
        budget: Optional[str] = BUDGET,
        out: Optional[Path] = typer.Option(None, metavar="FOLDER", help="folder for the report and pictures"),
        time_limit: Optional[float] = TIME_LIMIT,
        all_steps: bool = ALL_STEPS,
    ) -> None:
        if name == "snapshot" and is_pickle(Path(target[0])):  # a snapshot by its name or its bytes: nothing runs
            show_snapshot_file(Path(target[0]), out)
            return
        resolved = resolve(target, budget, time_limit)
        if resolved.ranks:
            run_and_show_ranks(name, resolved, out, all_steps=all_steps)
        else:
            run_and_show(name, resolved, out, all_steps=all_steps)

    if "max_steps" not in step(name).options:  # the option only where it means something
        command.__signature__ = _without(command, "all_steps")
    command.__doc__ = summary[:1].upper() + summary[1:] + "."
    app.command(name, context_settings=CONTEXT)(command)


def _without(function, parameter: str) -> inspect.Signature:
    signature = inspect.signature(function)
    return signature.replace(parameters=[p for p in signature.parameters.values() if p.name != parameter])


def show_snapshot_file(path: Path, out: Path | None) -> None:
    """Analyze a snapshot dumped earlier (by this tool or by torch.cuda.memory._dump_snapshot); nothing runs.

    The pictures go under ``.oomlab/runs/`` (or ``--out``), never beside the snapshot.
    """
    if path_kind(path) == "missing":
        raise OomLabError(f"No snapshot at {shown(path)}.", f"{close_files(path, '*.pickle')}Give the path of a .pickle file.")
    snapshot = analysis("snapshot")
    result = snapshot.analyze(snapshot.load_snapshot(path))
    out_dir = out or default_out_dir(path.stem[:60], "snapshot")
    made = make_folder(out_dir) if out else []  # a folder the user named must take the pictures; ours is made as drawn
    try:
        console.rule(f"snapshot · {shown(path.name, 60)}")
        show("snapshot", result, out_dir)
    finally:
        remove_empty_folders(made)


for _step in STEPS:
    tool_command(_step.name, f"step {_step.number}: {_step.summary}")


@app.command(context_settings=CONTEXT)
def diagnose(
    target: list[str] = TARGET,
    budget: Optional[str] = BUDGET,
    out: Optional[Path] = typer.Option(None, metavar="FOLDER", help="folder for every tool's results"),
    time_limit: Optional[float] = TIME_LIMIT,
    all_steps: bool = ALL_STEPS,
) -> None:
    """Every step's tool, then one summary: what to fix first.

    A folder of OOM reports (``oomlab.oom_hook``'s) is read instead: one report's finding, or
    every rank's report of a torchrun job side by side.
    """
    if len(target) == 1 and path_kind(Path(target[0])) == "folder" and show_oom_reports(Path(target[0])):
        return
    resolved = resolve(target, budget, time_limit)
    if resolved.ranks:
        diagnose_ranks(resolved, out, all_steps)
        return
    base = out or default_out_dir(resolved.label, "diagnose")
    made = make_folder(base)
    try:
        with console.status(f"diagnose: running {resolved.label} with each tool's probe, at once…") as status:
            measured = run_all_tools(resolved, base, all_steps, status)
    finally:
        remove_empty_folders(made)  # a run that failed before writing anything leaves no empty folder behind
    results = {name: run_and_show(name, resolved, None, measured[name]) for name in measured}
    verdict = fix_first(results)
    write_atomic(base / "diagnose.json", json.dumps(verdict, indent=2) + "\n")
    body = Text()
    for name, finding in verdict["findings"].items():
        body.append(f"{name:<9}", style="bold")
        body.append(f"{finding['kind']:<16}", style="cyan")
        body.append(f"{finding['headline']}\n")
    body.append("\nFix first: ", style="bold")
    body.append(f"{verdict['headline']}\n")
    if verdict["why"]:
        body.append(f"{verdict['why']}\n", style="dim")
    body.append(f"{verdict['advice']}\n\n")
    body.append(verdict["then"], style="dim")
    console.print(Panel(body, title=f"diagnose · {resolved.label}", title_align="left", border_style="cyan"))


def show_oom_reports(folder: Path) -> bool:
    """What the OOM hook wrote into ``folder``, in the terminal; False when there is no report in it.

    Reports written under torchrun are set side by side, rank by rank (each rank's newest); a
    report of a single process is shown as its finding.
    """
    from oomlab.oom_hook.reports import find_reports, load_report, rank_rows
    from oomlab.tools.ranks import present as ranks_present
    from oomlab.tools.ranks.analysis import across

    reports = [r for r in (load_report(p) for p in find_reports(folder)) if r is not None]
    if not reports:
        return False
    rows, notes = rank_rows(reports)
    if not any(row["status"] != "unreported" for row in rows):  # no rank named: the newest report's finding
        newest = max(reports, key=lambda r: r["finding"].get("time") or 0)
        console.rule(f"OOM report · {newest['folder'].name}")
        try:
            text = (newest["folder"] / "finding.txt").read_text(encoding="utf-8")
            console.print(text, markup=False, highlight=False, soft_wrap=True)  # laid out already, at its own width
        except OSError:
            console.print(Text(newest["finding"].get("headline", ""), style="bold"))
        if len(reports) > 1:
            console.print(Text(f"{len(reports) - 1} older report(s) in {folder}", style="dim"), soft_wrap=True)
        return True
    result = {**across(rows, "OOM hook", from_start=False), "out_dir": str(folder)}
    console.rule(f"OOM reports · {folder} · {result['world_size']} ranks")
    for part in ranks_present.render(result):
        console.print(part)
    for note in notes:
        console.print(Text(note, style="dim"))
    rank = ranks_present.focus(result)
    shown = next((row.get("report") for row in rows if row["rank"] == rank), None)
    if shown:
        console.print(Text(f"Read rank {rank} first: {folder / shown}", style="dim"), soft_wrap=True)
    return True


def diagnose_ranks(target: Target, out: Path | None, all_steps: bool) -> None:
    """``diagnose`` on a torchrun job: each step's tool on every rank, one after another, then each rank's verdict.

    One tool at a time: every rank of a job may want a GPU of its own, and three jobs at once
    would change each other's figures.
    """
    base = out or default_out_dir(target.label, "diagnose")
    made = make_folder(base)
    results = {}
    try:
        for s in STEPS:
            with console.status(f"diagnose: {s.name} on {target.ranks} ranks of {target.script.name}…"):
                results[s.name] = run_tool_on_ranks(target, s.name, base / s.name, tool_options(s.name, all_steps))
    finally:
        remove_empty_folders(made)
    for name, result in results.items():
        run_and_show_ranks(name, target, None, result)
    verdicts = {}
    for rank in range(target.ranks):
        found = {name: r["reports"][rank] for name, r in results.items() if rank in r["reports"]}
        verdicts[rank] = fix_first(found) if found else None
    across = results[STEPS[0].name]
    write_atomic(base / "diagnose.json", json.dumps({"ranks": verdicts, "across": across["headline"]}, indent=2) + "\n")
    body = Text()
    body.append("Across ranks: ", style="bold")
    body.append(f"{across['headline']}\n\n")
    for rank, verdict in verdicts.items():
        body.append(f"rank {rank:<4}", style="bold")
        body.append(f"fix first: {verdict['headline']}\n" if verdict else "no tool reported\n")
    console.print(Panel(body, title=f"diagnose · {target.label}", title_align="left", border_style="cyan"))


@app.command()
def compare(
    a: str = typer.Argument(
        ..., metavar="A", help="the first side: a snapshot (.pickle or snapshot.json), a result folder, an exercise or a script"
    ),
    b: str = typer.Argument(..., metavar="B", help="the second side, the same kinds; every change is B minus A"),
    budget: Optional[str] = BUDGET,
    out: Optional[Path] = typer.Option(None, metavar="FOLDER", help="folder for compare.json, compare.png and the runs"),
    time_limit: Optional[float] = TIME_LIMIT,
    top: int = typer.Option(DEFAULT_TOP, min=1, metavar="N", help="how many sites to list each way"),
) -> None:
    """Diff two snapshots or two runs (bug vs fix, yesterday vs today): what grew, by line and by holder.

    A side given as an exercise or a script is run with the snapshot and the hunt tools first; an exercise's own file
    (solutions/ID/train.py too) runs under that exercise's budget. Lines are matched across different code by their
    text, so a line that moved is still the same line. Every change is B minus A.
    """
    from oomlab.tools.compare import analysis as compare_analysis
    from oomlab.tools.compare import present as compare_present
    from oomlab.tools.compare import sides

    # A bad option is refused even where both sides are files and nothing runs.
    budget_option(budget)
    time_limit_option(time_limit)
    prepared = {letter: sides.prepare(word, budget, time_limit) for letter, word in (("a", a), ("b", b))}  # both before any run
    labels = [p.label if isinstance(p, Target) else p["label"] for p in prepared.values()]
    base = out or default_out_dir("-vs-".join(_folder_name(label) for label in labels), "compare")
    made = make_folder(base)
    try:
        targets = {letter: p for letter, p in prepared.items() if isinstance(p, Target)}
        if targets:
            with console.status(
                f"compare: running {' and '.join(t.label for t in targets.values())} with the snapshot and hunt probes…"
            ):
                found = run_sides(targets, base)
            prepared.update({letter: sides.side_from_run(targets[letter], *found[letter]) for letter in targets})
        result = compare_analysis.compare(prepared["a"], prepared["b"], top)
        write_atomic(base / "compare.json", json.dumps(result, indent=1) + "\n")
    finally:
        remove_empty_folders(made)
    console.rule(f"compare · A {shown(labels[0], 40)} · B {shown(labels[1], 40)}")
    show("compare", result, base, compare_present)
    console.print(Text(f"Result: {base / 'compare.json'}", style="dim"))


def _folder_name(label: str) -> str:
    """A side's label as part of a folder name: no separators or odd characters, not too long."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._")[:40] or "side"


def run_sides(targets: dict[str, Target], base: Path) -> dict[str, tuple[dict, dict]]:
    """The snapshot and the hunt of each target, in ``base/LETTER-TOOL``: ``{letter: (snapshot result, hunt result)}``.

    Under budgets the runs go side by side, as many as the GPU holds (a budget
    caps each, so no run changes another's figures); a script run uncapped may
    want the whole GPU, so then they run one at a time.
    """
    from oomlab.measure.machine import parallel_runs

    jobs = [(letter, name) for letter in targets for name in ("snapshot", "hunt")]
    budgets = [t.budget_bytes for t in targets.values()]
    workers = min(len(jobs), parallel_runs(budgets)) if all(budgets) else 1

    def run(job: tuple[str, str]) -> dict:
        letter, name = job
        return run_tool(targets[letter], name, base / f"{letter}-{name}", tool_options(name))[1]

    with ThreadPoolExecutor(workers) as pool:
        results = dict(zip(jobs, pool.map(run, jobs), strict=True))
    return {letter: (results[letter, "snapshot"], results[letter, "hunt"]) for letter in targets}
