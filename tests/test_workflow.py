"""The tools' plumbing on CPU: targets, sizes, probes inside the measuring process, the diagnose verdict."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.measure import machine
from oomlab.measure.harness import measure
from oomlab.measure.machine import has_nvidia_driver
from oomlab.steps import fix_first as summarize
from oomlab.steps import step
from oomlab.tools.run import resolve
from oomlab.units import MIB, parse_size
from tests.forked_commands import oomlab_commands

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

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
        tool={
            "name": "hunt",
            "probe": step("hunt").probe,
            "out_dir": str(out),
            "options": {"script": str(script), "device": "cpu"},
        },
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
        tool={"name": "no_such_tool", "probe": "oomlab.tools.no_such_tool.probe", "out_dir": str(tmp_path), "options": {}},
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


def hunted(kind: str, grew: int | None) -> dict:
    """A hunt's result whose culprit grew by ``grew`` bytes since its baseline step."""
    return {**finding(kind), "culprit": "global 'log'", "holders": [{"name": "global 'log'", "grew_bytes": grew}]}


def test_a_leak_that_grew_more_than_fragmentation_strands_is_fixed_first():
    fragmented = {**finding("fragmentation"), "culprit_bytes": 89 * MIB}  # what the snapshot says it strands
    verdict = summarize({"snapshot": fragmented, "hunt": hunted("graph-leak", 1151 * MIB), "profile": finding("steady")})
    assert verdict["fix_first"] == "graph-leak" and verdict["found_by"] == "hunt"
    assert verdict["headline"] == "a graph-leak" and "no_grad" in verdict["advice"]
    assert verdict["why"] == (
        "The leak grew by 1,151.0 MiB across optimizer steps, more than the 89.0 MiB that fragmentation strands, "
        "so it comes first."
    )
    # A leak that grew less than what is stranded, or did not grow at all, waits for the fragmentation.
    for grew in (47 * MIB, 0, None):
        verdict = summarize({"snapshot": {**fragmented, "culprit_bytes": 709 * MIB}, "hunt": hunted("container-leak", grew)})
        assert (verdict["fix_first"], verdict["why"]) == ("fragmentation", "")
    # Growth without a leak's finding (a holder the hunt only reports) ranks nothing.
    verdict = summarize({"snapshot": fragmented, "hunt": hunted("held", 1151 * MIB)})
    assert verdict["fix_first"] == "fragmentation"


def test_diagnose_with_nothing_structural_says_so_and_ends_with_hyperparameters():
    verdict = summarize({"snapshot": finding("none"), "hunt": finding("held"), "profile": finding("steady")})
    assert verdict["fix_first"] is None and "work" in verdict["advice"]
    assert verdict["then"].startswith("Tune hyperparameters") and "only after" in verdict["then"]


def oomlab(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OOMLAB_ROOT", None)
    done = oomlab_commands.run(list(args), cwd, env, 120, program="oomlab")  # a process of its own, forked
    assert "Traceback" not in done.stdout + done.stderr
    return done


def test_tools_bad_input_gets_one_message(tmp_path):
    (tmp_path / "corrupt.pickle").write_bytes(b"\x80\x04not really")
    (tmp_path / "foreign.pickle").write_bytes(pickle.dumps({"segments": [{"size": 1}]}, protocol=4))
    (tmp_path / "foreign.bin").write_bytes(pickle.dumps({"segments": [{"size": 1}]}, protocol=4))  # a pickle by its bytes
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(3, device='cuda')\n")
    cases = {
        ("snapshot", "corrupt.pickle"): "not a readable pickle",
        ("snapshot", "foreign.pickle"): "snapshot format",
        ("snapshot", "foreign.bin"): "snapshot format",  # read as a snapshot, not refused as a pickle that is no script
        ("hunt", "missing.py"): "does not exist",
        # No GPU here: where there is no driver at all that is said before torch is imported, else torch says it.
        ("diagnose", "train.py"): "sees no CUDA device" if has_nvidia_driver() else "has no NVIDIA driver",
        ("profile", "train.py", "--budget", "lots"): "not a memory size",
    }
    for args, message in cases.items():
        done = oomlab(tmp_path, *args)
        out = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2 and message in out, (args, out)


def test_a_deleted_exercise_file_under_a_tool_points_at_reset(course_copy):
    (course_copy / "exercises" / "eval-graphs" / "train.py").unlink()
    done = oomlab(course_copy, "snapshot", "eval-graphs")
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 2, out
    assert "the file does not exist" in out and "`oomlab reset eval-graphs` puts the exercise's original back" in out, out


def fake_run(monkeypatch, tmp_path, **measured):
    """run_tool with the measuring process replaced: what the probe wrote and how the run ended are given."""
    from oomlab.measure.harness import Measurement
    from oomlab.tools import run as workflow

    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: True)  # as on a GPU machine: the run is what is faked

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


# --- what the tools are given: each problem is one message (exit 2), named before any talk of course folders ---


@pytest.mark.parametrize(
    "args, message",
    [
        (["hunt", "train.py", "--budget", "0"], "--budget: '0' is less than one byte"),
        (["hunt", "train.py", "--budget", "0GiB"], "--budget: '0GiB' is less than one byte"),
        (["hunt", "train.py", "--budget", "0.0001B"], "--budget: '0.0001B' is not a whole number of bytes"),
        (["hunt", "train.py", "--budget", ""], "--budget: '' is not a memory size"),
        (["hunt", "train.py", "--budget", "1.5"], "--budget: '1.5' is not a whole number of bytes"),
        (["hunt", "train.py", "--time-limit", "-5"], "--time-limit: -5 is not a positive number of seconds"),
        (["hunt", "train.py", "--time-limit", "0"], "--time-limit: 0 is not a positive number of seconds"),
        (["hunt", "trian.py"], "trian.py does not exist. Did you mean train.py?"),
        (["hunt", "somefolder/"], "somefolder/ is a folder, not a training script. Give a script in it (somefolder/model.py)"),
        (["profile", "somefolder"], "somefolder is a folder, not a training script"),
        (["hunt", "feature-cach"], "'feature-cach' is neither a file here nor an exercise"),
        (["hunt", "train.py", "--out", "/proc/nope"], "Cannot make the folder /proc/nope"),
        (["hunt", "train.py", "--out", "notes.txt"], "A file stands where a folder is needed"),
        (["hunt", "a" * 5000 + ".py"], "is too long to be a file name or an exercise id"),
        (["snapshot", "a" * 5000 + ".pickle"], "is too long to be a file name or an exercise id"),
        (["snapshot", "snapshto.pickle"], "No snapshot at snapshto.pickle"),
        (["hunt", "mem.pickle"], "mem.pickle is a pickle (an allocator snapshot?), not a training script"),
        (["diagnose", "mem.pickle"], "`oomlab snapshot mem.pickle` analyzes a snapshot, and `oomlab compare A B`"),
        (["profile", "dump.bin"], "dump.bin is a pickle (an allocator snapshot?), not a training script"),
    ],
    ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None,
)
def test_a_bad_target_or_option_gets_one_clear_message(tmp_path, args, message):
    (tmp_path / "train.py").write_text("import torch\n")
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "mem.pickle").write_bytes(pickle.dumps({"segments": []}))
    (tmp_path / "dump.bin").write_bytes(pickle.dumps({"segments": []}))  # a snapshot by its bytes, whatever its name
    (tmp_path / "somefolder").mkdir()
    (tmp_path / "somefolder" / "model.py").write_text("\n")
    done = oomlab(tmp_path, *args)
    out = " ".join(re.sub(r"[│╭╮╰╯─]+", " ", done.stdout + done.stderr).split())
    assert done.returncode == 2, out
    assert message in out, out
    assert "No OOM Lab course folder" not in out
    assert len(out) < 1500, "a long argument is shortened in the message"
    assert not (tmp_path / ".oomlab").exists(), "nothing is written for a run that never started"
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_failed_run_leaves_no_empty_folder_behind(tmp_path):
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(3, device='cuda')\n")
    for command in ("hunt", "diagnose"):
        done = oomlab(tmp_path, command, "train.py")
        assert done.returncode == 2  # no GPU here, or the script allocates nothing: either way nothing was written
        assert not (tmp_path / ".oomlab").exists(), command
    done = oomlab(tmp_path, "hunt", "train.py", "--out", "reports/hunt")
    assert done.returncode == 2 and not (tmp_path / "reports").exists()


def test_a_folder_named_with_out_keeps_the_users_files(tmp_path):
    mine = {"train.py": "import torch\nx = torch.ones(3, device='cuda')\n", "notes.txt": "mine\n", "profile.json": "{}\n"}
    for name, text in mine.items():
        (tmp_path / name).write_text(text)
    done = oomlab(tmp_path, "hunt", "train.py", "--out", ".")
    assert done.returncode == 2
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == mine


def test_a_run_folder_is_removed_only_when_the_run_left_it_empty(monkeypatch, tmp_path):
    from oomlab.tools import run as workflow

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OOMLAB_ROOT", raising=False)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")

    def no_gpu(script, tool, **kwargs):
        from oomlab.measure.harness import Measurement

        return Measurement(script=str(script), status="no_cuda", message="no GPU")

    monkeypatch.setattr(workflow, "measure", no_gpu)
    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: True)  # a driver, but torch sees no GPU
    with pytest.raises(OomLabError, match="could not be measured here"):
        workflow.run_tool(resolve([str(script)]), "hunt")
    assert not (tmp_path / ".oomlab").exists()
    kept = tmp_path / "kept"
    kept.mkdir()  # a folder that was there before the run stays
    with pytest.raises(OomLabError):
        workflow.run_tool(resolve([str(script)]), "hunt", kept)
    assert kept.is_dir()


def test_a_time_limit_must_be_a_positive_number_of_seconds(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    for bad in (-5, 0, float("nan"), float("inf")):
        with pytest.raises(OomLabError, match="--time-limit: .* is not a positive number of seconds"):
            resolve([str(script)], time_limit_s=bad)
    assert resolve([str(script)], time_limit_s=5).time_limit_s == 5


def test_an_empty_budget_is_an_error_not_the_default(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    for bad in ("", "0", "0GiB", "0.0001B"):
        with pytest.raises(OomLabError, match="--budget: "):
            resolve([str(script)], budget=bad)


def test_a_snapshot_file_is_read_into_the_state_folder_never_beside_it(tmp_path):
    shipped = REPO / "course" / "figures" / "feature-cache-bug-snapshot.pickle"
    if not shipped.is_file():
        pytest.skip("the course's figures are not in this checkout")
    (tmp_path / "snaps").mkdir()
    pickle_path = tmp_path / "snaps" / shipped.name
    pickle_path.write_bytes(shipped.read_bytes())
    done = oomlab(tmp_path, "snapshot", "snaps/" + shipped.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == [shipped.name]
    pictures = sorted(p.name for p in (tmp_path / ".oomlab" / "runs").glob("*/*.png"))
    assert pictures == ["segments.png", "timeline.png"]


def test_diagnose_runs_the_tools_at_once_and_measures_again_alone_what_ran_short_beside_the_others(monkeypatch, tmp_path):
    import threading

    from oomlab.cli import tools as commands
    from oomlab.measure.harness import Measurement

    calls, running, most = [], [0], [0]
    lock, together = threading.Lock(), threading.Barrier(3, timeout=10)

    def fake_run_tool(target, name, out, options):
        with lock:
            calls.append(name)
            running[0] += 1
            most[0] = max(most[0], running[0])
            first = calls.count(name) == 1
        if first:
            together.wait()  # every tool's first run is under way at the same time
        with lock:
            running[0] -= 1
        short = first and name == "hunt"  # a cudaMalloc failed beside the others: the allocator retried
        stats = {"peak_allocated": 1, "retries": 1 if short else 0, "ooms": 0}
        return Measurement(script=str(target.script), status="ok", stats=stats), {"options": options}

    monkeypatch.setattr(commands, "run_tool", fake_run_tool)
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")

    class Status:
        def update(self, text):
            calls.append(text)

    measured = commands.run_all_tools(resolve([str(script)]), tmp_path, False, Status())
    assert most[0] == 3
    assert calls[3:] == ["diagnose: hunt ran short of GPU memory beside the others; running it alone…", "hunt"]
    assert measured["hunt"][0].stats["retries"] == 0  # the figures of the run alone
    assert measured["profile"][1]["options"] == {"max_steps": 20}
    assert commands.run_all_tools(resolve([str(script)]), tmp_path, True, Status())["profile"][1]["options"] == {}
