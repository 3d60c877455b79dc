"""The witness on CPU: a real supervisor watching real processes, with the driver's answers made up.

Each test writes a small child script and runs ``supervise`` in a process of its
own (it reaps every child and becomes a subreaper, which the test process must
not), with a fake NVML that lists the processes the test says are on the GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

RUNNER = """
import json, os, sys, time
from types import SimpleNamespace
from oomlab.measure.supervisor import supervise, spawn_fresh
from oomlab.measure.witness import Driver

child_script, gpu_file, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])


class FakeNVML:
    # The driver's list: "pid bytes" lines in gpu_file, as the test's processes write them.
    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        try:
            lines = open(gpu_file).read().split()
        except OSError:
            return []
        return [SimpleNamespace(pid=int(p), usedGpuMemory=int(b)) for p, b in zip(lines[::2], lines[1::2])]


config = {"command": [sys.executable, child_script], "cwd": os.getcwd(), "env": dict(os.environ),
          "stdout": os.devnull, "stderr": os.path.join(os.getcwd(), "child.err")}
print(json.dumps(supervise(spawn_fresh(config), limit, driver=Driver(FakeNVML()))))
"""

# Helpers the child scripts use: mark a moment, and say "this process holds N bytes on the GPU".
PRELUDE = """
import os, socket, sys, time
from oomlab.measure.witness import mark
marks = socket.socket(fileno=int(os.environ["OOMLAB_MARKS_FD"]))
GPU = sys.argv[0] + ".gpu"
def on_gpu(nbytes, pid=None):
    with open(GPU, "a") as f:
        f.write(f"{pid or os.getpid()} {nbytes}\\n")
def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
"""


def watch(tmp_path: Path, body: str, limit: float = 30) -> dict:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    runner = tmp_path / "runner.py"
    runner.write_text(textwrap.dedent(RUNNER))
    out = subprocess.run(
        [sys.executable, str(runner), str(child), f"{child}.gpu", str(limit)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        timeout=limit + 60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_driver_is_read_at_each_mark_and_its_peak_is_the_childs(tmp_path):
    report = watch(
        tmp_path,
        """
        on_gpu(500 << 20)  # the CUDA context
        mark(marks, b"R")
        time.sleep(0.2)
        on_gpu(300 << 20)  # the script's memory comes on top of it (the fake sums a pid's lines)
        time.sleep(0.2)
        assert mark(marks, b"F")  # answered once the driver was read
        """,
    )
    driver = report["driver"]
    assert driver["available"] and driver["samples"] > 10
    assert driver["at_ready_bytes"] == 500 << 20
    assert driver["peak_bytes"] == driver["at_figures_bytes"] == 800 << 20
    assert report["returncode"] == 0 and not report["timed_out"]
    assert report["marks"]["ready"]["cpu_s"] is not None and report["rss_at_ready_bytes"] > 0


def test_a_process_the_run_started_on_the_gpu_is_reported_and_a_stranger_is_not(tmp_path):
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        report = watch(
            tmp_path,
            f"""
            import subprocess
            on_gpu(500 << 20)
            on_gpu(123 << 20, pid={stranger.pid})  # another user's job on the same GPU
            mark(marks, b"R")
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
            on_gpu(1 << 30, pid=helper.pid)  # the unfixed job, moved into a process of its own
            helper.wait()
            """,
        )
    finally:
        stranger.kill()
        stranger.wait()
    others = report["other_gpu_processes"]
    assert [p["used_bytes"] for p in others] == [1 << 30]
    assert "time.sleep(0.5)" in others[0]["command"]


def test_cpu_time_counts_from_the_start_of_the_script_and_includes_what_it_started_even_orphaned(tmp_path):
    report = watch(
        tmp_path,
        """
        burn(0.5)  # before the script: the harness's own start, not counted
        mark(marks, b"R")
        done, holds = os.pipe()
        if os.fork() == 0:  # a grandchild, never waited for: it is orphaned when the child ends
            os.close(done)
            burn(0.6)
            os._exit(0)  # its end of the pipe closes as it exits
        os.close(holds)
        burn(0.3)
        os.read(done, 1)  # returns once the grandchild has exited, however long a loaded machine took to get there
        """,
    )
    assert report["cpu_s"] >= 1.3
    assert 0.85 <= report["script_cpu_s"] < 1.3
    assert report["left_running"] == []


def test_the_time_limit_stops_the_child_and_everything_it_started_even_in_a_session_of_its_own(tmp_path):
    report = watch(
        tmp_path,
        """
        import subprocess
        mark(marks, b"R")
        escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        open(GPU + ".pid", "w").write(str(escaped.pid))
        time.sleep(60)
        """,
        limit=2,
    )
    assert report["timed_out"] and report["returncode"] == -9
    escaped = int((tmp_path / "child.py.gpu.pid").read_text())
    assert not Path(f"/proc/{escaped}").exists() or "Z" in Path(f"/proc/{escaped}/stat").read_text().split(")")[1][:3]


def test_a_driver_that_never_lists_the_child_is_no_witness(tmp_path):
    report = watch(
        tmp_path,
        """
        on_gpu(500 << 20, pid=1)  # the driver names processes by ids this namespace does not have
        mark(marks, b"R")
        time.sleep(0.2)
        """,
    )
    assert not report["driver"]["available"]
    assert "container" in report["driver"]["reason"]


@pytest.mark.parametrize("marks", ["RR", "FRF"])
def test_a_mark_repeated_or_out_of_order_counts_once(tmp_path, marks):
    report = watch(
        tmp_path,
        f"""
        on_gpu(100 << 20)
        for m in {marks!r}:
            marks.sendall(m.encode())
            time.sleep(0.1)
        """,
    )
    assert set(report["marks"]) == {{"R": "ready", "F": "figures"}[m] for m in marks}
    assert all(m["driver"] == 100 << 20 for m in report["marks"].values())
