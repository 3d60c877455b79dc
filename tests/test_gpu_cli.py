"""The learner's commands against real GPU runs (skipped without a GPU)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oomlab.course import Course
from oomlab.errors import OomLabError
from oomlab.grading.verdict import grade
from oomlab.measure.harness import measure

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu


@pytest.fixture
def course(tmp_path) -> Path:
    for part in ("exercises", "solutions"):
        shutil.copytree(ROOT / part, tmp_path / part)
    return tmp_path


def oomlab(course: Path, *args: str) -> subprocess.CompletedProcess:
    # PYTHONPATH: the graders under test, whether or not the course is installed.
    env = {**os.environ, "OOMLAB_ROOT": str(course), "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "oomlab", *args], cwd=course, env=env, capture_output=True, text=True, timeout=600
    )


def test_run_shows_where_the_oom_happened(course):
    done = oomlab(course, "run", "feature-cache")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "CUDA out of memory" in out and "features.append(encoder(x))" in out
    assert "non-releasable" in out and "Traceback" not in out


def test_a_real_fix_passes_and_unlocks_the_solution(course):
    oomlab(course, "list")  # first sight keeps the originals, as `make start` does
    shutil.copy(course / "solutions/eval-graphs/train.py", course / "exercises/eval-graphs/train.py")
    done = oomlab(course, "check", "eval-graphs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "eval-graphs passes" in done.stdout
    shown = oomlab(course, "solution", "eval-graphs")
    assert shown.returncode == 0 and "torch.no_grad" in shown.stdout


def test_a_failing_check_names_the_failed_checks(course):
    done = oomlab(course, "check", "one-hot-peak")
    assert done.returncode == 1
    assert "FAIL" in done.stdout and "no_oom" in done.stdout and "does not pass yet" in done.stdout


def test_a_gpu_smaller_than_the_budget_is_named(course):
    ex = Course(course).get("eval-graphs")
    m = measure(ex.learner_path, budget_bytes=1 << 50)
    assert m.status == "gpu_too_small"
    big = dataclasses.replace(ex, budget_bytes=1 << 50)
    with pytest.raises(OomLabError, match="smaller than"):
        grade(big, ex.learner_path)


def test_tools_name_a_script_that_stops_before_using_the_gpu(course):
    (course / "early.py").write_text("import sys\nimport torch\nsys.exit(0)\nx = torch.ones(1, device='cuda')\n")
    (course / "fails.py").write_text("import torch\nraise ValueError('no data found')\n")
    expected = {
        "early.py": "early.py finished without allocating any GPU memory",
        "fails.py": "fails.py stopped (ValueError at fails.py:2: no data found) without allocating any GPU memory",
    }
    for tool in ("snapshot", "hunt", "profile"):
        for script, message in expected.items():
            done = oomlab(course, tool, script)
            out = " ".join((done.stdout + done.stderr).split())
            assert done.returncode == 2 and message in out and "Traceback" not in out, (tool, script, out)


def test_diagnose_runs_the_three_tools_and_names_what_to_fix_first(course):
    done = oomlab(course, "diagnose", "eval-graphs")
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out
    fix_first = out[out.index("Fix first:") :]
    assert "losses" in fix_first and "autograd graph" in fix_first, fix_first
    assert all(
        (course / ".oomlab" / "runs" / "eval-graphs-diagnose" / name / f"{name}.json").is_file()
        for name in ("snapshot", "hunt", "profile")
    )


def test_a_course_made_by_init_is_graded_against_the_shipped_fix(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    env.pop("OOMLAB_ROOT", None)
    made = subprocess.run([sys.executable, "-m", "oomlab", "init", "mine"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stdout + made.stderr
    learner = tmp_path / "mine"
    shutil.copy(ROOT / "solutions/one-hot-peak/train.py", learner / "exercises/one-hot-peak/train.py")
    done = subprocess.run(
        [sys.executable, "-m", "oomlab", "check", "one-hot-peak"],
        cwd=learner,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and "one-hot-peak passes" in done.stdout, done.stdout + done.stderr
    assert not (learner / "solutions").exists()


def test_watch_rechecks_forked_from_its_warm_server_and_check_and_tools_use_it(course):
    import json
    import select
    import signal
    import time

    from oomlab.measure.warm import info_path

    env = {**os.environ, "OOMLAB_ROOT": str(course), "COLUMNS": "200", "PYTHONPATH": str(ROOT)}
    watch = subprocess.Popen(
        [sys.executable, "-m", "oomlab", "watch", "eval-graphs"],
        cwd=course,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: list[str] = []

    def until_verdict() -> str:
        start = len(seen)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and select.select([watch.stdout], [], [], deadline - time.monotonic())[0]:
            line = watch.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "passes." in line or "does not pass yet." in line:
                return "".join(seen[start:])
        raise AssertionError("no verdict from watch: " + "".join(seen[-30:]))

    try:
        assert "does not pass yet" in until_verdict()  # the shipped bug, measured while the server warms up
        info = info_path(course, "")
        deadline = time.monotonic() + 180
        while not info.is_file() and time.monotonic() < deadline:
            time.sleep(0.2)
        server = json.loads(info.read_text(encoding="utf-8"))["pid"]

        shutil.copy(course / "solutions/eval-graphs/train.py", course / "exercises/eval-graphs/train.py")  # a save
        recheck = until_verdict()
        assert "eval-graphs passes" in recheck and "forked from the warm server" in recheck, recheck

        checked = oomlab(course, "check", "eval-graphs")  # another terminal
        assert checked.returncode == 0 and "forked from the warm server" in checked.stdout, checked.stdout
        snap = oomlab(course, "snapshot", "eval-graphs")
        assert snap.returncode == 0, snap.stdout + snap.stderr
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(timeout=60)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{server}").exists() and not info.exists(), "the server outlived watch"
