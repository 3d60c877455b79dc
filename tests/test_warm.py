"""The warm measuring server: what it measures equals a fresh process, and what it refuses or outlives.

These run on CPU (``require_cuda=False``); ``tests/test_harness.py`` runs every
way a run can end both fresh and forked, and the GPU equivalence of every
exercise's figures is ``course/measurements/equivalence.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oomlab.measure import warm
from oomlab.measure.harness import child_env, measure
from oomlab.measure.warm import WarmServer, for_run, info_path, serving

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

BUDGET = 1 << 30

TRAIN = """
import random
import torch
from torch import nn

model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(4):
    x = torch.randn(32, 8)
    loss = (model(x) ** 2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(random.random(), torch.rand(1).item())
"""


def write(folder: Path, source: str, name: str = "train.py") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
    return path


def run(script: Path, **kwargs):
    return measure(script, budget_bytes=BUDGET, require_cuda=False, time_limit_s=kwargs.pop("time_limit_s", 60), **kwargs)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return tmp_path_factory.mktemp("course").resolve()


@pytest.fixture(scope="module")
def server(course):
    server = WarmServer.start(course, "", child_env(""))
    assert server.wait_ready(), server.why_not_ready()
    yield server
    server.stop()


def test_a_forked_run_measures_what_a_fresh_one_does(server, course):
    script = write(course, TRAIN)
    fresh, forked = run(script), run(script, server=server)
    assert (fresh.runner, forked.runner) == ("fresh", "forked"), forked.runner_note
    assert fresh.status == forked.status == "ok"
    # The same seeds, the same workload, the same weights to the last bit, the same output.
    assert forked.workload == fresh.workload
    assert forked.stdout == fresh.stdout
    assert forked.stderr == fresh.stderr == ""
    assert forked.tamper == fresh.tamper == []


def test_the_server_says_where_it_is(server, course):
    info = json.loads(info_path(course, "").read_text(encoding="utf-8"))
    assert info["pid"] == server.process.pid
    assert info["root"] == str(course) and info["alloc_conf"] == ""
    assert info["code"] == warm.code_digest() and info["python"] == sys.executable
    assert "torch._dynamo" in info["preloaded"]  # what the first optimizer step would import
    from oomlab.measure import machine

    assert machine.watch_servers(course) == [""], "`oomlab doctor` finds it"


def test_another_course_is_refused_and_measured_fresh(server, course, tmp_path):
    other = WarmServer(tmp_path, "", server.socket, info_path(tmp_path, ""), _ready=True)
    m = run(write(tmp_path, TRAIN), server=other)
    assert m.status == "ok" and m.runner == "fresh"
    assert f"measures the course in {course}" in m.runner_note


def test_an_environment_torch_reads_at_start_is_refused(server, course, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    m = run(write(course, TRAIN), server=server)
    assert m.status == "ok" and m.runner == "fresh"
    assert "CUDA_LAUNCH_BLOCKING" in m.runner_note


def test_allocator_variables_of_the_callers_never_reach_a_run_so_the_server_still_serves_it(server, course, monkeypatch):
    for var in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_HIP_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG", "CUDA_MODULE_LOADING"):
        monkeypatch.setenv(var, "1")
    env = child_env("expandable_segments:True")
    assert not {
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "PYTORCH_HIP_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDA_MODULE_LOADING",
    } & set(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    m = run(write(course, TRAIN), server=server)
    assert m.status == "ok" and m.runner == "forked", m.runner_note
    assert m.settings_at_start == {}  # what the run's allocator started with: none of them


def test_a_server_older_than_the_measuring_code_is_refused(server, course, monkeypatch):
    monkeypatch.setattr(warm, "code_digest", lambda: "edited since")
    m = run(write(course, TRAIN), server=server)
    assert m.runner == "fresh" and "measuring code changed" in m.runner_note


def test_another_process_finds_the_server_of_its_course_only(server, course, tmp_path):
    found = WarmServer.find(course, "")
    assert found is not None and found.socket == server.socket and found.process is None
    assert WarmServer.find(tmp_path, "") is None  # another course folder
    assert WarmServer.find(course, "expandable_segments:True") is None  # other allocator settings
    found.stop()  # a found server belongs to its owner: stop() leaves it running
    assert server.process.poll() is None


def test_a_stale_file_of_a_dead_server_is_ignored(tmp_path):
    path = info_path(tmp_path, "")
    path.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    info = {"pid": dead.pid, "root": str(tmp_path.resolve()), "alloc_conf": "", "code": warm.code_digest()}
    path.write_text(json.dumps({**info, "python": sys.executable, "socket": str(tmp_path / "x.sock")}))
    assert WarmServer.find(tmp_path, "") is None
    assert for_run(tmp_path, "")[0] is None


def test_runs_use_the_server_once_it_is_ready_and_say_why_not_otherwise(tmp_path):
    root = tmp_path.resolve()
    assert for_run(root, "") == (None, "")  # no server for this course: fresh, nothing to say
    with serving(root, [""], child_env) as started:
        server, note = for_run(root, "")
        assert server is None or server is started[0]
        if server is None:
            assert "still importing torch" in note
        assert started[0].wait_ready()
        assert for_run(root, "")[0] is started[0]
        server, note = for_run(root, "max_split_size_mb:64")
        assert server is None and "other allocator settings" in note
    assert started[0].process.poll() is not None, "the server outlived the block that started it"
    assert not info_path(root, "").exists()
    assert for_run(root, "") == (None, "")


OWNER = """
import sys, time
from oomlab.measure.harness import child_env
from oomlab.measure.warm import WarmServer
server = WarmServer.start(sys.argv[1], "", child_env(""))
assert server.wait_ready()
print(server.process.pid, flush=True)
time.sleep(600)
"""


def test_a_server_does_not_outlive_its_owner(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(owner.stdout.readline())
        info = json.loads(info_path(tmp_path, "").read_text(encoding="utf-8"))
    finally:
        owner.kill()  # no chance to clean up: the server must notice alone
        owner.wait()
    assert wait_until(lambda: gone(pid), 10), "the server kept running after its owner was killed"
    assert not Path(info["socket"]).exists()
    assert not info_path(tmp_path, "").exists()


CALLER = """
import sys
from oomlab.measure.harness import measure
from oomlab.measure.warm import WarmServer
server = WarmServer.find(sys.argv[1], "")
assert server is not None, "the caller did not find the warm server"
m = measure(sys.argv[2], budget_bytes=1 << 30, require_cuda=False, time_limit_s=60, server=server)
print(m.runner, m.status, m.runner_note)
"""


def test_a_run_stops_when_its_caller_goes_away(server, course, tmp_path):
    started, finished, release = tmp_path / "started", tmp_path / "finished", tmp_path / "release"
    # The run waits for the test to release it, not for a clock: on a loaded machine the caller may take
    # seconds to go, and a run that finished meanwhile would prove nothing either way.
    script = write(
        tmp_path,
        f"""
        import os, time
        open({str(started)!r}, "w").write(str(os.getpid()))
        while not os.path.exists({str(release)!r}):
            time.sleep(0.05)
        open({str(finished)!r}, "w").write("the run went on without its caller")
        """,
    )
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(course), str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert wait_until(started.exists, 30), "the forked run did not start"
        caller.kill()  # gone at once, as a killed `oomlab check` or a closed terminal: the server must notice alone
        caller.wait(timeout=30)
    finally:
        caller.kill()
    assert wait_until(lambda: started.read_text() != "" and gone(int(started.read_text())), 60), "the run outlived its caller"
    release.write_text("")
    time.sleep(1)
    assert not finished.exists()
    assert server.process.poll() is None, "one caller going away stopped the server"


def test_runs_at_once_each_get_their_own_child(server, course, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    # Each run waits until all four have started: one after another, the first would wait in vain.
    script = write(
        tmp_path,
        f"""
        import os, pathlib, time
        here = pathlib.Path({str(tmp_path)!r})
        (here / f"started-{{os.getpid()}}").touch()
        deadline = time.monotonic() + 20
        while len(list(here.glob("started-*"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        print(os.getpid(), len(list(here.glob("started-*"))))
        """,
    )
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: run(script, server=server), range(4)))
    assert all(m.runner == "forked" and m.status == "ok" for m in runs), [m.runner_note for m in runs]
    seen = [m.stdout.split() for m in runs]
    assert [count for _, count in seen] == ["4"] * 4
    assert len({pid for pid, _ in seen}) == 4 and str(os.getpid()) not in {pid for pid, _ in seen}


def keeper_pid(root: Path) -> int:
    from oomlab.measure import keeper

    lock, _ = keeper._files(root, "")
    return int(lock.read_text(encoding="ascii"))


def keeper_pid_or_none(root: Path) -> int | None:
    try:
        return keeper_pid(root)
    except (OSError, ValueError):
        return None


def test_a_check_leaves_a_keeper_whose_server_forks_the_next_run_one_keeper_per_course_until_oomlab_stop(tmp_path, monkeypatch):
    from oomlab.measure import keeper

    script = write(tmp_path, TRAIN)
    assert keeper.keep_warm(tmp_path, ""), "no keeper ran: the first check starts one"
    deadline = time.monotonic() + warm.READY_TIMEOUT_S
    while (server := WarmServer.find(tmp_path, "")) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server is not None, "the keeper's server never said it was ready"
    pid = keeper_pid(tmp_path)
    try:
        assert run(script, course_root=tmp_path).runner == "forked", "the next check forks from the kept server"
        (seen,) = keeper.kept(tmp_path)  # what `oomlab doctor` says of it
        assert seen["alloc_conf"] == "" and 0 <= seen["idle_s"] < 60
        assert not keeper.keep_warm(tmp_path, ""), "a second check starts no second keeper"
        second = subprocess.run([sys.executable, "-m", "oomlab.measure.keeper", str(tmp_path), ""], timeout=30)
        assert second.returncode == 0 and keeper_pid(tmp_path) == pid, "a keeper started beside it leaves at once"
        # The measuring code changed since its server started: that server cannot serve, so the keeper is replaced.
        monkeypatch.setattr(warm, "code_digest", lambda: "edited since")
        assert keeper.keep_warm(tmp_path, ""), "a keeper whose server cannot serve is replaced"
        deadline = time.monotonic() + 15
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(pid), "the keeper of the old code stopped"
        deadline = time.monotonic() + 15
        while keeper_pid_or_none(tmp_path) in (None, pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = keeper_pid_or_none(tmp_path)
        assert pid is not None and not gone(pid)
    finally:
        stopped = keeper.stop_keepers(tmp_path)
        deadline = time.monotonic() + 15
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not gone(pid):  # never leave a keeper behind a failed test: its server stops with it
            os.kill(pid, signal.SIGKILL)
    assert stopped == 1 and WarmServer.find(tmp_path, "") is None, "oomlab stop ends the keeper and its server"
    assert keeper.stop_keepers(tmp_path) == 0


def test_a_keeper_stops_with_its_server_once_no_check_has_used_it_for_its_idle_time(tmp_path):
    from oomlab.measure import keeper

    _, used = keeper._files(tmp_path, "")
    used.parent.mkdir(parents=True)
    used.touch()
    proc = subprocess.Popen([sys.executable, "-m", "oomlab.measure.keeper", str(tmp_path), "", "1"])
    assert proc.wait(timeout=30) == 0
    assert WarmServer.find(tmp_path, "") is None and not keeper._locked(keeper._files(tmp_path, "")[0])


def test_doctor_says_which_warm_server_a_check_or_run_keeps_and_how_long_it_has_been_idle(tmp_path, monkeypatch):
    import fcntl

    from oomlab.measure import keeper, machine
    from oomlab.measure.warm import info_path

    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: True)
    assert machine.kept_row(tmp_path)[2].startswith("none: the next check or run starts a fresh Python")
    info = info_path(tmp_path.resolve(), "")
    info.parent.mkdir(parents=True)
    lock = info.with_suffix(".keeper")
    lock.write_text("4242\n")
    assert keeper.kept(tmp_path) == [], "a lock nobody holds is a keeper that ended"
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # held, as a live keeper holds it
    try:
        assert keeper.kept(tmp_path) == [{"alloc_conf": None, "idle_s": None}]
        assert "starting (importing torch)" in machine.kept_row(tmp_path)[2]
        info.write_text(json.dumps({"alloc_conf": ""}))
        used = info.with_suffix(".used")
        used.touch()
        os.utime(used, (time.time() - 125, time.time() - 125))
        (found,) = keeper.kept(tmp_path)
        assert found["alloc_conf"] == "" and 120 < found["idle_s"] < 200
        level, item, said = machine.kept_row(tmp_path)
        assert (level, item) == ("ok", "warm server")
        assert "allocator settings default, idle 2 of 10 minutes" in said and "`oomlab stop` ends it" in said
    finally:
        os.close(fd)
    monkeypatch.setattr(machine, "has_nvidia_driver", lambda: False)
    assert machine.kept_row(tmp_path) is None, "no GPU: no server runs, and none would start"
    # No keeper, but a server that serves the course: `oomlab watch`'s.
    monkeypatch.setattr(WarmServer, "find", lambda root, conf: object() if conf == "" else None)
    assert "`oomlab watch`'s (allocator settings default)" in machine.kept_row(tmp_path)[2]
