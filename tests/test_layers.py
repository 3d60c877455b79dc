"""Imports point down: each part of the package imports only parts on lower floors, and the command line is the top.

A part that imports one above it ties the lower floor to everything the upper one
needs: the measuring child to the tools, the course to the grader, the notebooks'
cells to the command line. The floors, bottom up, are :data:`FLOORS`; an import
inside a function counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "oomlab"

FLOORS = (
    # what everything may use: standard library only, or nearly
    {"oomlab", "units", "errors", "oom", "frames", "steps", "figure_names"},
    {"course"},  # the course folder: manifests, modules, state
    {"measure"},  # one process per run
    {"grading", "tools", "sizing"},  # what a run is judged by, the workflow's tools, and sizing a step before a run
    {"classroom", "oom_hook", "production"},  # grading in nbgrader, and outside the course
    {"bench", "site"},  # what maintainers measure and publish
    {"cli", "__main__"},  # the command line: the top floor
)
# The one import up, on purpose: the site's command reference is generated from the CLI itself.
ALLOWED_UP = {("site", "cli")}


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "oomlab"


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "oomlab":
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "oomlab"}
    return found


def floor(part: str) -> int:
    return next(i for i, parts in enumerate(FLOORS) if part in parts)


def test_every_part_of_the_package_has_a_floor():
    parts = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    parts |= {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    placed = set().union(*FLOORS)
    assert parts - placed == set(), f"give each part of oomlab a floor in FLOORS: {sorted(parts - placed)}"


def test_no_part_imports_one_on_a_higher_floor():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        here = relative.parts[1] if len(relative.parts) > 2 else relative.stem
        here = "oomlab" if here == "__init__" else here
        for module in imports(path):
            there = part_of(module)
            if there != here and floor(there) > floor(here) and (here, there) not in ALLOWED_UP:
                wrong.append(f"{relative} imports {module}")
    assert not wrong, "imports that point up:\n" + "\n".join(wrong)


def test_the_floors_can_catch_an_import_that_points_up(tmp_path):
    """The scan sees imports inside functions too: the way the wrong ones used to hide."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from oomlab.cli.learner import app\n    import oomlab.grading.checks\n")
    assert imports(module) == {"oomlab.cli.learner", "oomlab.grading.checks"}
