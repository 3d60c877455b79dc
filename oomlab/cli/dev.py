"""``oomlab dev``: maintainers' commands, run on a GPU, that write the course's committed reports.

- ``verify``: ``course/measurements/verify.json``, every exercise's runs;
- ``figures``: ``course/figures/``, the tools' pictures;
- ``facts``: ``course/measurements/facts.json``, the probes in ``course/probes/`` (see :mod:`oomlab.site.facts`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from oomlab.cli import console, dev_app
from oomlab.cli.render import relpath
from oomlab.course import Course
from oomlab.course.state import write_atomic
from oomlab.errors import OomLabError
from oomlab.units import in_mib

VERIFY_JSON = Path("course/measurements/verify.json")
FIGURES_DIR = Path("course/figures")


@dev_app.command()
def verify(
    json_path: Optional[Path] = typer.Option(None, "--json", help=f"where to write the report (default: {VERIFY_JSON})"),
    jobs: int = typer.Option(0, min=0, help="runs at once (default 0: as many as the cores and the GPU's free memory allow)"),
) -> None:
    """The course's truth check: every reference fix passes, every seeded bug, wrong fix and cheat fails."""
    from oomlab.grading.truth import all_runs
    from oomlab.grading.truth import verify as verify_course
    from oomlab.measure.machine import parallel_runs

    course = Course()
    jobs = jobs or parallel_runs([ex.budget_bytes for ex in course.exercises])
    with console.status(f"Verifying, {jobs} runs at a time…") as status:
        report = verify_course(course.exercises, note=lambda s: status.update(f"Verifying: {s}…"), jobs=jobs)
    table = Table(header_style="bold", title=f"verify on {report['gpu']}, torch {report['torch']}", title_justify="left")
    for col in (
        "exercise",
        "run",
        "verdict",
        "expected",
        "OOM",
        "peak alloc MiB",
        "peak reserved MiB",
        "non-releasable MiB",
        "retries",
    ):
        table.add_column(col)
    for row in report["exercises"]:
        for r in all_runs(row):
            expected = "pass" if not r["expected_failure"] else "fail " + " or ".join(r["expected_failure"])
            ok = Text("✓ " if r["as_expected"] else "✗ ", style="green" if r["as_expected"] else "bold red")
            table.add_row(
                row["id"],
                f"{r['kind']}: {r['name']}" if r["kind"] != r["name"] else r["name"],
                r["verdict"],
                ok + expected,
                "yes" if r["oom"] else "no",
                in_mib(r["peak_allocated"], 0),
                in_mib(r["peak_reserved"], 0),
                in_mib(r["inactive_split_peak"], 0),
                str(r["retries"]),
            )
    console.print(table)
    path = json_path or course.root / VERIFY_JSON
    write_atomic(path, json.dumps(report, indent=2) + "\n")
    console.print(f"Wrote {relpath(path, course.root)}")
    if not report["ok"]:
        console.print(Text("Verification failed: see the ✗ rows.", style="bold red"))
        raise typer.Exit(1)
    console.print(Text(f"All as expected: {report['runs']} runs in {report['wall_s']} s, {jobs} at a time.", style="green"))


@dev_app.command()
def figures(out: Optional[Path] = typer.Option(None, help=f"where the site's pictures go (default: {FIGURES_DIR})")) -> None:
    """Redraw the site's pictures from real runs: each exercise's tool on its seeded bug and on its reference fix."""
    from oomlab.site.figures import regenerate

    course = Course()
    with console.status("Running each exercise's tool…") as status:
        written = regenerate(course, out or course.root / FIGURES_DIR, note=lambda s: status.update(s))
    for path in written:
        console.print(f"Wrote {relpath(path, course.root)}")


@dev_app.command()
def facts(
    probe: Optional[list[str]] = typer.Option(None, "--probe", help="run only this probe (repeatable); prints, writes nothing"),
    json_path: Optional[Path] = typer.Option(
        None, "--json", help="where to write the report (default: course/measurements/facts.json)"
    ),
) -> None:
    """Run the site's probes on this GPU, each in a fresh process, and write the facts the pages quote."""
    from oomlab.site import facts as site_facts

    course = Course()
    probes = site_facts.find_probes(course.root / site_facts.PROBES_DIR)
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
    path = json_path or course.root / site_facts.FACTS_JSON
    site_facts.write(report, path)
    console.print(f"Wrote {relpath(path, course.root)}")
