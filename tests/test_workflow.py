"""The tools' plumbing on CPU: targets, sizes, probes inside the measuring process, the diagnose verdict."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.measure.harness import measure
from oomlab.steps import fix_first as summarize
from oomlab.tools.run import resolve
from oomlab.units import parse_size

REPO = Path(__file__).resolve().parents[1]

LEAK = """
import torch, torch.nn as nn, torch.nn.functional as F
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def evaluate():
    losses = []
    for _ in range(3):
        losses.append(F.cross_entropy(model(torch.randn(512, 256)), torch.randint(10, (512,))))
    {ending}

for step in range(2):
    loss = F.cross_entropy(model(torch.randn(512, 256)), torch.randint(10, (512,)))
    opt.zero_grad(); loss.backward(); opt.step()
    evaluate()
"""


@pytest.mark.parametrize(
    "text,expected",
    [("2GiB", 2 << 30), ("1.5g", 3 << 29), ("800MiB", 800 << 20), ("12 mb", 12 << 20), ("1073741824", 1 << 30)],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text,why",
    [
        ("lots", "not a memory size"),
        ("2 parsecs", "unknown unit"),
        ("1.5", "not a whole number of bytes"),
        ("0GiB", "less than one byte"),
        ("", "not a memory size"),
        ("9" * 5000, "far larger than any GPU"),
    ],
)
def test_a_size_that_is_not_one_says_why(text, why):
    with pytest.raises(ValueError, match=why):
        parse_size(text)


def test_a_bad_budget_option_is_a_clear_error():
    with pytest.raises(OomLabError, match="--budget: '1.5' is not a whole number of bytes"):
        resolve([__file__], budget="1.5")


def test_targets(tmp_path, monkeypatch):
    monkeypatch.setenv("OOMLAB_ROOT", str(REPO))
    ex = resolve(["eval-graphs"])
    assert ex.exercise is not None and ex.budget_bytes == ex.exercise.budget_bytes and ex.script == ex.exercise.learner_path
    with pytest.raises(OomLabError, match="takes no arguments"):
        resolve(["eval-graphs", "--lr", "3"])
    with pytest.raises(OomLabError, match="does not exist"):
        resolve([str(tmp_path / "nothere.py")])
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    plain = resolve([str(script), "--lr", "3e-4"], budget="2GiB")
    assert plain.args == ("--lr", "3e-4") and plain.budget_bytes == 2 << 30 and plain.exercise is None
    assert resolve([str(script)]).budget_bytes is None  # a script of one's own runs uncapped unless asked


def hunt_run(tmp_path, ending: str) -> tuple:
    script = tmp_path / "leak.py"
    script.write_text(textwrap.dedent(LEAK).replace("{ending}", ending))
    out = tmp_path / "out"
    m = measure(
        script,
        budget_bytes=None,
        require_cuda=False,
        time_limit_s=120,
        tool={"name": "hunt", "out_dir": str(out), "options": {"script": str(script), "device": "cpu"}},
    )
    return m, json.loads((out / "hunt.json").read_text())


def test_a_probe_sees_the_frames_of_a_failed_run(tmp_path):
    # The probe's finish runs inside the child's except block: evaluate()'s locals are still alive.
    m, found = hunt_run(tmp_path, 'raise RuntimeError("stop here")')
    assert m.status == "error" and not m.tool_error
    assert found["kind"] == "graph-leak"
    assert "losses" in found["headline"] and "evaluate()" in found["headline"]


def test_a_probe_sees_the_globals_of_a_finished_run(tmp_path):
    m, found = hunt_run(tmp_path, "global kept\n    kept = losses")
    assert m.status == "ok" and not m.tool_error
    assert found["kind"] == "graph-leak" and "kept" in found["headline"]


def test_a_probe_that_cannot_start_leaves_the_run_alone(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    m = measure(
        script,
        budget_bytes=None,
        require_cuda=False,
        time_limit_s=60,
        tool={"name": "no_such_tool", "out_dir": str(tmp_path), "options": {}},
    )
    assert m.status == "ok" and "ran" in m.stdout
    assert "no_such_tool could not start" in m.tool_error


def finding(kind: str, headline: str = "") -> dict:
    return {"kind": kind, "headline": headline or f"a {kind}"}


def test_diagnose_fixes_fragmentation_before_a_leak_before_a_peak():
    verdict = summarize(
        {"snapshot": finding("fragmentation"), "hunt": finding("graph-leak"), "profile": finding("transient-peak")}
    )
    assert verdict["fix_first"] == "fragmentation" and verdict["found_by"] == "snapshot"
    verdict = summarize({"snapshot": finding("live-memory"), "hunt": finding("graph-leak"), "profile": finding("transient-peak")})
    assert verdict["fix_first"] == "graph-leak" and "no_grad" in verdict["advice"]
    verdict = summarize({"snapshot": finding("live-memory"), "hunt": finding("none"), "profile": finding("transient-peak")})
    assert verdict["fix_first"] == "transient-peak"


def test_diagnose_with_nothing_structural_says_so_and_ends_with_hyperparameters():
    verdict = summarize({"snapshot": finding("none"), "hunt": finding("held"), "profile": finding("steady")})
    assert verdict["fix_first"] is None and "work" in verdict["advice"]
    assert verdict["then"].startswith("Tune hyperparameters") and "only after" in verdict["then"]


def oomlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OOMLAB_ROOT", None)
    done = subprocess.run([sys.executable, "-m", "oomlab", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_tools_bad_input_gets_one_message(tmp_path):
    (tmp_path / "corrupt.pickle").write_bytes(b"\x80\x04not really")
    (tmp_path / "foreign.pickle").write_bytes(pickle.dumps({"segments": [{"size": 1}]}, protocol=4))
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(3, device='cuda')\n")
    cases = {
        ("snapshot", "corrupt.pickle"): "not a readable pickle",
        ("snapshot", "foreign.pickle"): "snapshot format",
        ("hunt", "missing.py"): "does not exist",
        ("diagnose", "train.py"): "sees no CUDA device",
        ("profile", "train.py", "--budget", "lots"): "not a memory size",
    }
    for args, message in cases.items():
        done = oomlab(tmp_path, *args)
        out = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2 and message in out, (args, out)


def fake_run(monkeypatch, tmp_path, **measured):
    """run_tool with the measuring process replaced: what the probe wrote and how the run ended are given."""
    from oomlab.measure.harness import Measurement
    from oomlab.tools import run as workflow

    def fake_measure(script, tool, **kwargs):
        out = Path(tool["out_dir"])
        (out / f"{tool['name']}.json").write_text(
            json.dumps({"tool": tool["name"], "kind": "none", "headline": "", "culprit_bytes": 0})
        )
        return Measurement(script=str(script), **measured)

    monkeypatch.setattr(workflow, "measure", fake_measure)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    return workflow.run_tool(resolve([str(script)]), "hunt", tmp_path / "out")


def test_a_script_that_never_touches_the_gpu_is_named(monkeypatch, tmp_path):
    stats = {"peak_allocated": 0, "peak_reserved": 0, "ooms": 0}
    with pytest.raises(OomLabError, match="train.py finished without allocating any GPU memory"):
        fake_run(monkeypatch, tmp_path, status="ok", stats=stats)
    with pytest.raises(OomLabError, match=r"stopped \(exit at train.py:1: exit code 3\) without allocating"):
        fake_run(monkeypatch, tmp_path, status="exit", line_no=1, message="exit code 3", stats=stats)


def test_a_script_that_cannot_run_is_named(monkeypatch, tmp_path):
    with pytest.raises(OomLabError, match="syntax error at train.py:3"):
        fake_run(monkeypatch, tmp_path, status="syntax", message="invalid syntax", line_no=3)
    with pytest.raises(OomLabError, match="ran longer than"):
        fake_run(monkeypatch, tmp_path, status="timeout", message="the script ran longer than its limit of 5 s")


def test_a_finished_run_carries_its_figures(monkeypatch, tmp_path):
    m, result = fake_run(monkeypatch, tmp_path, status="ok", stats={"peak_allocated": 1 << 20, "ooms": 0}, wall_s=1.5)
    assert result["run"]["status"] == "ok" and result["run"]["peak_allocated"] == 1 << 20
    assert Path(result["out_dir"]).name == "out"
