"""``oomlab hunt`` and ``oomlab diagnose`` on held-out scripts: leaks of kinds the course does not teach, on a real GPU.

Each script in tests/heldout/ seeds one memory leak and runs out of memory
under its budget; tests/heldout/expected.toml says which holder the hunt must
blame and the path it must print. The tools run as ``oomlab diagnose SCRIPT
--budget B`` runs them (:func:`oomlab.cli.tools.run_all_tools`, each tool in a
process of its own), so these are the findings a person would read, and
diagnose must put the hunt's finding first. The GPU tests skip
cleanly where there is no GPU; the manifest's own checks run everywhere.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from oomlab.units import format_bytes

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HELDOUT = Path(__file__).resolve().parent / "heldout"
EXPECTED = tomllib.loads((HELDOUT / "expected.toml").read_text(encoding="utf-8"))
FIELDS = {"leak", "budget", "culprit", "path", "kinds", "phase", "back_search"}


def test_every_heldout_script_has_one_expectation_and_each_reads():
    from oomlab.units import parse_size

    assert sorted(p.stem for p in HELDOUT.glob("*.py")) == sorted(EXPECTED)
    assert len(EXPECTED) >= 6
    for name, case in EXPECTED.items():
        assert set(case) <= FIELDS and {"budget", "culprit", "path", "kinds"} <= set(case), name
        assert parse_size(case["budget"]) > 0
        for pattern in (case["culprit"], case["path"]):
            re.compile(pattern)
        assert "cuda" in (HELDOUT / f"{name}.py").read_text(encoding="utf-8"), f"{name} must train on the GPU"


def diagnose(name: str, tmp_path: Path) -> dict:
    """``oomlab diagnose tests/heldout/NAME.py --budget B``, as the command runs it: each tool's result, and the verdict."""
    from types import SimpleNamespace

    from oomlab.cli.tools import run_all_tools
    from oomlab.steps import fix_first
    from oomlab.tools.run import resolve

    target = resolve([str(HELDOUT / f"{name}.py")], budget=EXPECTED[name]["budget"])
    measured = run_all_tools(target, tmp_path / name, False, SimpleNamespace(update=lambda _: None))
    results = {tool: result for tool, (_, result) in measured.items()}
    return {**results, "verdict": fix_first(results)}


def shown(result: dict) -> str:
    """What ``oomlab hunt`` prints for ``result``, as plain text."""
    from rich.console import Console

    from oomlab.tools.hunt import present

    console = Console(file=io.StringIO(), width=400, color_system=None)
    for part in present.render(result):
        console.print(part)
    return console.file.getvalue()


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_hunt_and_diagnose_name_the_holder_of_a_heldout_leak(name, tmp_path):
    from oomlab.tools.hunt.analysis import IN_FLIGHT, stable_name

    case = EXPECTED[name]
    found = diagnose(name, tmp_path)
    result = found["hunt"]
    summary = (
        f"{name}: {result.get('kind')} {result.get('culprit')!r} at {result.get('culprit_path')!r}: {result.get('headline')}"
    )
    assert result["run"]["status"] == "oom", f"{name} must run out of memory under {case['budget']}: {result['run']}"
    assert result["kind"] in case["kinds"], summary
    assert re.search(case["culprit"], stable_name(result["culprit"])), summary
    assert re.search(case["path"], result["culprit_path"]), summary

    # Named first: the culprit heads the table, and its path is printed.
    text = shown(result)
    culprit = next(h for h in result["holders"] if h["name"] == result["culprit"])
    others = [h["what"] for h in result["holders"] if h is not culprit]
    assert f"Held at: {result['culprit_path']}" in text, text
    assert all(text.index(culprit["what"]) < text.index(other) for other in others if other in text), text

    # The graph in flight when the run died is the step's own: reported as such, never blamed.
    flight = [h for h in result["holders"] if h["label"] == IN_FLIGHT]
    assert all(h["name"] != result["culprit"] for h in flight)
    if "phase" in case:
        assert result["walk"]["in_flight"] == case["phase"], summary
        graph = [h for h in flight if h["name"].startswith("the autograd graph")]
        assert graph and graph[0]["bytes"] > 0, result["holders"]
        assert "In flight:" in text

    # What no walk from a root reaches, the back search names; what stays unexplained is said with its size.
    if case.get("back_search"):
        assert result["walk"]["back_search"]["explained"] >= 1, result["walk"]
    allocated = result["allocated_bytes"]
    assert 0 < result["explained_bytes"] + result["unexplained_bytes"] <= allocated
    assert f"of the {format_bytes(allocated)} allocated" in text

    # diagnose puts the leak first: the hunt's finding, over whatever the snapshot and the profile saw.
    verdict = found["verdict"]
    findings = {tool: f["kind"] for tool, f in verdict["findings"].items()}
    assert verdict["found_by"] == "hunt" and verdict["fix_first"] == result["kind"], f"{summary}; diagnose: {findings}"
    assert verdict["headline"] == result["headline"]
