"""The ``oomlab`` command as a learner meets it: exit codes, one clear message, never a traceback.

Each case runs ``python -m graders`` in a fresh process against a copy of the
course. Most commands do not import torch and take a fraction of a second; the
two that measure or diagnose do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOX = re.compile(r"[│╭╮╰╯─┃━┏┓┗┛┡┩╇┳┻╋┣┫━┯┷┼]+")


def oomlab(root: Path, *args: str) -> tuple[int, str]:
    """Run the CLI in ``root``; return the exit code and stdout+stderr with the boxes and wrapping flattened."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "CLICOLOR_FORCE")}
    env.update(
        OOMLAB_ROOT=str(root),
        COLUMNS="200",
        PYTHONPATH=str(REPO),  # the graders under test, whether or not the course is installed
        CUDA_VISIBLE_DEVICES="",  # the same answers on a machine with a GPU
    )
    proc = subprocess.run([sys.executable, "-m", "oomlab", *args], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    assert proc.returncode != 3 and not (root / ".oomlab" / "last-error.txt").exists(), out
    return proc.returncode, " ".join(BOX.sub(" ", out).split())


@pytest.fixture
def root(course_copy) -> Path:
    return course_copy


def learner_file(root: Path, ex_id: str = "eval-graphs") -> Path:
    return root / "exercises" / ex_id / "train.py"


def test_help(root):
    rc, out = oomlab(root, "--help")
    assert rc == 0
    for command in ("run", "check", "hint", "watch", "reset", "solution", "doctor", "init", "list", "dev"):
        assert re.search(rf"\b{command}\b", out), command


def test_no_arguments_shows_progress_and_what_to_do(root):
    rc, out = oomlab(root)
    assert rc == 0
    assert "0/3 exercises passed" in out
    assert "Now: feature-cache" in out
    assert "oomlab run feature-cache" in out
    # Once the first one passes, the second is the current one.
    state = root / ".oomlab" / "state.json"
    state.write_text(json.dumps({"passed": {"feature-cache": "2025-01-01T00:00:00"}, "hints": {}}))
    rc, out = oomlab(root)
    assert rc == 0
    assert "1/3 exercises passed" in out
    assert "Now: eval-graphs" in out and "oomlab run eval-graphs" in out


def test_list(root):
    rc, out = oomlab(root, "list")
    assert rc == 0
    assert re.search(r"1 feature-cache .* current", out)
    assert re.search(r"2 eval-graphs .* to do", out)
    assert "3 one-hot-peak" in out
    assert "1.00 GiB" in out  # eval-graphs' budget


def test_hint_advances(root):
    rc, first = oomlab(root, "hint", "1")
    assert rc == 0 and "Hint 1 of 3 for feature-cache" in first
    assert "again for the next" in first
    rc, second = oomlab(root, "hint", "1")
    assert rc == 0 and "Hint 2 of 3 for feature-cache" in second


def test_unknown_exercise(root):
    rc, out = oomlab(root, "hint", "feature-cach")
    assert rc == 2
    assert "There is no exercise 'feature-cach'" in out
    assert "Did you mean 'feature-cache'?" in out


def test_check_with_a_syntax_error(root):
    path = learner_file(root)
    broken = path.read_text().replace("losses = []", "losses = [", 1)
    path.write_text(broken)
    rc, out = oomlab(root, "check", "eval-graphs")
    assert rc == 1
    assert "Syntax error" in out
    assert "exercises/eval-graphs/train.py:" in out
    assert "your file was not changed" in out
    assert path.read_text() == broken


def test_check_without_a_gpu(root):
    rc, out = oomlab(root, "check", "eval-graphs")
    assert rc == 2
    assert "No CUDA GPU is visible" in out
    assert "`oomlab list`, `hint`, `reset` and `doctor` still work" in out


def test_run_with_the_file_deleted_then_reset(root):
    oomlab(root, "list")  # first sight: oomlab keeps the originals
    path = learner_file(root)
    original = path.read_text()
    path.unlink()
    rc, out = oomlab(root, "run", "eval-graphs")
    assert rc == 1
    assert "exercises/eval-graphs/train.py does not exist" in out
    assert "`oomlab reset eval-graphs` puts the original back" in out
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and path.read_text() == original


def test_reset_after_an_edit(root):
    rc, _ = oomlab(root, "list")  # first sight, before any edit; the copy is not a git checkout
    assert rc == 0
    path = learner_file(root)
    original = path.read_text()
    edited = original.replace("losses = []", "losses = []  # my attempt", 1)
    path.write_text(edited)
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0
    assert path.read_text() == original
    match = re.search(r"Your version is kept at (\S+)\.", out)
    assert match, out
    backup = root / match.group(1)
    assert backup.read_text() == edited
    rc, out = oomlab(root, "reset", "eval-graphs")
    assert rc == 0 and "already the original" in out


def test_solution_opens_only_once_passed(root):
    rc, out = oomlab(root, "solution", "eval-graphs")
    assert rc == 1
    assert "opens once eval-graphs passes" in out
    (root / ".oomlab").mkdir(exist_ok=True)
    (root / ".oomlab" / "state.json").write_text(json.dumps({"passed": {"eval-graphs": "2025-01-01T00:00:00"}}))
    rc, out = oomlab(root, "solution", "eval-graphs")
    assert rc == 0
    assert "solutions/eval-graphs/train.py" in out
    assert "no_grad" in out  # the reference fix, shown as a diff


def test_malformed_manifest(root):
    path = root / "exercises" / "one-hot-peak" / "exercise.toml"
    path.write_text(path.read_text().replace("order = 3", "order = = 3"))
    rc, out = oomlab(root, "list")
    assert rc == 2
    assert f"{path} is not valid TOML" in out


def test_doctor_without_a_gpu(root):
    import torch  # the test session has imported it already (conftest checks for CUDA)

    rc, out = oomlab(root, "doctor")
    assert rc == 1
    assert "FAIL" in out
    assert ("CPU-only" if torch.version.cuda is None else "sees no GPU") in out
    assert f"{root}: 3 exercises, every manifest valid" in out


def test_watch_checks_once_and_says_what_it_watches(root):
    path = learner_file(root, "feature-cache")
    path.write_text("for i in range(3)\n    pass\n")
    rc, out = oomlab(root, "watch", "--max-checks", "1", "--interval", "0.1")
    assert rc == 0
    assert "Syntax error" in out and "feature-cache does not pass yet" in out
    assert "Watching exercises/feature-cache/train.py" in out
    assert path.read_text() == "for i in range(3)\n    pass\n"
