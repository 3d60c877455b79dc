"""The instructor's guide, followed as written: every command of its flow, in its order, in a fresh folder.

The commands are read from the guide's page (``course/instructors.md``), so the
guide cannot drift from what works. A student fetches and submits through a local
exchange in between, as nbgrader's own commands do it. Without a GPU,
``oomlab nbgrader autograde`` and plain ``nbgrader autograde`` must both refuse
(nothing can be measured, and nothing may be recorded as a grade); the rest of the
flow is then followed with plain autograde told that the machine was checked, so that
feedback and export are tried on what nbgrader makes of cells that could not measure.
``jupyter lab`` starts a server for marking by hand in nbgrader's Formgrader (a Jupyter
server extension since nbgrader 0.9, not an nbgrader command); only that extension is
checked to be there and enabled.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from oomlab.classroom.autograde_guard import CHECKED
from oomlab.classroom.classgrade import nbgrader_env
from oomlab.grading.pytest_plugin import cuda_available
from tests.forked_commands import nbgrader_commands

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

GUIDE = Path(__file__).resolve().parents[1] / "course" / "instructors.md"


def guide_commands() -> list[list[str]]:
    """The commands of the guide's flow: its first ``sh`` block, one a line, without comments."""
    block = re.search(r"## From build to grades.*?```sh\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S).group(1)
    return [shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.split("#", 1)[0].strip()]


def run(words: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    env = {**nbgrader_env(), "COLUMNS": "200", **env}
    if words[0] in ("nbgrader", "oomlab"):  # a process of its own, forked from one that imported nbgrader once
        return nbgrader_commands.run(words[1:], cwd, env, program=words[0])
    program = [sys.executable, "-m", words[0]]  # jupyter, from this Python
    return subprocess.run(program + words[1:], cwd=cwd, capture_output=True, text=True, timeout=600, env=env)


def test_the_guide_names_the_whole_flow():
    verbs = [" ".join(w[:3] if w[0] == "oomlab" else w[:2]) for w in guide_commands()]
    assert verbs == [
        "oomlab nbgrader build",
        "cd gpu-memory-course",
        "nbgrader generate_assignment",
        "nbgrader release_assignment",
        "nbgrader collect",
        "oomlab nbgrader autograde",
        "jupyter lab",
        "nbgrader generate_feedback",
        "nbgrader release_feedback",
        "nbgrader export",
    ]


def test_the_guide_works_as_written(tmp_path):
    exchange = tmp_path / "exchange"
    exchange.mkdir()
    student = tmp_path / "student-home"
    student.mkdir()
    cwd = tmp_path
    assignment = None
    for words in guide_commands():
        if words[0] == "cd":
            cwd = cwd / words[1]
            # The guide's step 3: an exchange is set in nbgrader_config.py, below the line that loads ours.
            with open(cwd / "nbgrader_config.py", "a") as config:
                config.write(f'c.Exchange.root = "{exchange}"\n')
            continue
        if words[:2] == ["jupyter", "lab"]:  # a server: only its Formgrader is checked to be enabled
            listed = run(["jupyter", "server", "extension", "list"], cwd)
            enabled = re.search(r"nbgrader\.server_extensions\.formgrader\s+(\x1b\[\d+m)?enabled", listed.stdout + listed.stderr)
            assert listed.returncode == 0 and enabled, listed.stdout + listed.stderr
            continue
        if words[:2] == ["nbgrader", "collect"]:  # a student fetches and submits first, with nbgrader's student commands
            for verb in ("fetch_assignment", "submit"):
                done = run(["nbgrader", verb, assignment, "--course", "oomlab", f"--Exchange.root={exchange}"], student)
                assert done.returncode == 0, done.stdout + done.stderr
        done = run(words, cwd)
        out = done.stdout + done.stderr
        if words[:3] == ["oomlab", "nbgrader", "autograde"] and not cuda_available():
            assert done.returncode == 2 and "needs an NVIDIA GPU" in " ".join(out.split()), out
            assert not (cwd / "autograded").exists(), "nothing is recorded where nothing was measured"
            done = run(["nbgrader", "autograde", assignment], cwd)  # the guide's alternative refuses too
            assert done.returncode != 0 and "stopped before grading anyone" in done.stdout + done.stderr
            assert not (cwd / "autograded").exists()
            with Gradebook(f"sqlite:///{cwd / 'gradebook.db'}") as gb:
                assert gb.assignment_submissions(assignment) == [], "no grade entered the gradebook"
            done = run(["nbgrader", "autograde", assignment], cwd, **{CHECKED: "1"})  # the rest of the flow, untested else
            out = done.stdout + done.stderr
        assert done.returncode == 0 and "Traceback" not in out, out
        if words[:2] == ["nbgrader", "generate_assignment"]:
            assignment = words[2]
    me = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    assert list((cwd / "feedback").glob(f"*/{assignment}/*.html"))
    with open(cwd / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["student_id"] for r in rows] == [me]
