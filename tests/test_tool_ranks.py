"""A tool on every rank of a torchrun job: launching it, stopping the ranks left waiting, and the view across ranks.

The view is pure (synthetic rows); the launch runs a real job of two gloo ranks on the CPU,
each rank under the hunt's probe, as ``oomlab hunt torchrun --nproc-per-node 2`` would on a GPU.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from oomlab.errors import OomLabError
from oomlab.tools.ranks.analysis import SPREAD_FLOOR, across, where_waiting
from oomlab.tools.run import launcher_ranks
from oomlab.units import GIB, MIB

SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
ALL_REDUCE_STACKS = f"""\
Thread 0x00007f02a0ffd640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "{SITE}/elastic/timer/local_timer.py", line 80 in run

Current thread 0x00007f02ad4a0b80 (most recent call first):
  File "{SITE}/distributed_c10d.py", line 3252 in all_reduce
  File "{SITE}/c10d_logger.py", line 83 in wrapper
  File "/work/job/train.py", line 31 in step
  File "/work/job/train.py", line 40 in <module>
  File "<frozen runpy>", line 88 in _run_code
"""


def test_the_stacks_say_which_collective_a_rank_waits_in_and_the_learners_line():
    waiting = where_waiting(ALL_REDUCE_STACKS, "/work/job/train.py")
    assert waiting == {
        "at": "train.py:31",
        "in": "step",
        "call": "all_reduce",  # not c10d_logger's wrapper around it
        "call_at": "torch/distributed/distributed_c10d.py:3252",
        "collective": True,
    }


def test_outside_torch_distributed_the_call_is_what_the_learners_line_called():
    stacks = """\
Current thread 0x1 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 629 in wait
  File "/work/job/helpers.py", line 7 in wait_for_checkpoint
  File "/work/job/train.py", line 12 in <module>
"""
    waiting = where_waiting(stacks, "/work/job/train.py")
    # A file beside the script is the learner's too.
    assert (waiting["at"], waiting["call"], waiting["collective"]) == ("helpers.py:7", "wait", False)
    only_python = 'Current thread 0x1 (most recent call first):\n  File "<frozen runpy>", line 88 in _run_code\n'
    assert where_waiting(only_python, "/w/train.py") is None


def row(rank, status="ok", **extra):
    return {"rank": rank, "status": status, "where": "", "error_type": "", "message": "", "ended_s": 5.0, **extra}


def test_the_first_rank_to_fail_is_named_and_a_collective_error_after_it_is_its_consequence():
    rows = [
        row(
            0,
            "error",
            where="train.py:31",
            error_type="RuntimeError",
            ended_s=3.3,
            message="[gloo/pair.cc:553] Connection closed by peer",
        ),
        row(
            1,
            "oom",
            where="train.py:25",
            error_type="OutOfMemoryError",
            ended_s=3.1,
            culprit="global 'history'",
            culprit_bytes=3 * GIB,
        ),
        row(2, ended_s=9.0),
    ]
    result = across(rows, "hunt")
    assert result["first_failure"] == 1 and result["kind"] == "failed"
    assert result["headline"].startswith(
        "rank 1 ran out of memory at train.py:25 first, after 3.1 s; rank 0 failed (RuntimeError)"
    )
    assert [r["why"] for r in result["ranks"]] == [
        "failed (RuntimeError) at train.py:31 in a collective, 0.2 s after rank 1: its peer was gone",
        "failed first",
        "finished",
    ]
    assert [d["text"] for d in result["differences"]] == ["only rank 1: global 'history' (3,072.0 MiB)"]


def test_an_error_of_its_own_after_the_first_failure_is_not_called_a_consequence():
    rows = [
        row(0, "oom", where="train.py:9", ended_s=1.0),
        row(1, "error", where="train.py:12", error_type="KeyError", ended_s=2.0),
    ]
    assert across(rows)["ranks"][1]["why"] == "failed (KeyError) at train.py:12, 1.0 s after rank 0"


def test_ranks_left_waiting_at_different_collectives_are_a_desynchronised_job():
    waiting = where_waiting(ALL_REDUCE_STACKS, "/work/job/train.py")
    barrier = {**waiting, "call": "barrier", "at": "train.py:52"}
    rows = [
        row(0, "error", ended_s=None, stopped=True, stopped_s=600.0, waiting=waiting),
        row(1, "error", ended_s=None, stopped=True, stopped_s=600.0, waiting=barrier),
    ]
    result = across(rows)
    assert result["kind"] == "hung" and result["first_failure"] is None and result["desynchronised"]
    assert (
        "rank 0 waiting in all_reduce (torch/distributed/distributed_c10d.py:3252), called at train.py:31" in result["headline"]
    )
    assert "rank 1 waiting in barrier" in result["headline"] and "different calls" in result["headline"]
    assert not across([rows[0], {**rows[1], "waiting": waiting}])["desynchronised"]


def test_a_rank_that_skipped_a_collective_desynchronises_the_job_though_it_finished():
    """An OOM caught and skipped on rank 1: it makes one all_reduce fewer, ends first, and rank 0's last one fails."""
    rows = [
        row(0, "error", where="train.py:30", ended_s=9.5, message="Connection closed by peer", collectives={"all_reduce": 10}),
        row(1, ended_s=9.4, collectives={"all_reduce": 9, "barrier": 1}),
    ]
    result = across(rows)
    assert result["desynchronised"]
    assert result["collective_mismatch"]["by_name"] == {"all_reduce": {0: 10, 1: 9}, "barrier": {0: 0, 1: 1}}
    assert (
        "the ranks made different collective calls (all_reduce: rank 0 10, rank 1 9; barrier: rank 0 0, rank 1 1)"
        in result["headline"]
    )
    rows[1]["collectives"] = {"all_reduce": 10}
    rows[0]["collectives"] = {"all_reduce": 10}
    assert not across(rows)["desynchronised"]
    rows[1]["collectives"] = None  # a rank that never said: nothing to compare it with
    assert across(rows)["collective_mismatch"] is None


def test_the_call_a_peer_had_in_flight_when_the_first_rank_died_does_not_desynchronise_the_job():
    """Seen on the H200: rank 0 ran out of memory in its forward after 60 all_reduces; rank 1 entered its 61st and failed
    there. That one call is the death's consequence; a rank with fewer calls than the dead one, or two more, is not."""
    rows = [
        row(0, "oom", where="train.py:27", ended_s=16.7, collectives={"all_reduce": 60}),
        row(1, "error", where="train.py:29", ended_s=17.3, message="Connection closed by peer", collectives={"all_reduce": 61}),
    ]
    result = across(rows)
    assert not result["desynchronised"] and result["collective_mismatch"] is None
    assert "different collective calls" not in result["headline"]
    assert result["ranks"][1]["why"].endswith("its peer was gone")
    for calls in ({"all_reduce": 62}, {"all_reduce": 59}, {"all_reduce": 61, "barrier": 1}):
        rows[1]["collectives"] = calls
        assert across(rows)["desynchronised"], calls
    rows[1]["collectives"] = {"all_reduce": 61}
    rows[0]["message"] = "Connection closed by peer"  # the first failed in a collective itself: no death to explain it
    rows[0]["status"] = "error"
    assert across(rows)["desynchronised"]


def test_the_ranks_still_running_are_stopped_a_short_grace_after_a_failure_and_a_long_one_after_a_rank_finished():
    from oomlab.measure.ranks import stop_at

    assert stop_at({}, grace_s=10, ended_grace_s=60) is None
    assert stop_at({1: (3.0, "oom")}, grace_s=10, ended_grace_s=60) == 13.0
    assert stop_at({1: (3.0, "ok")}, grace_s=10, ended_grace_s=60) == 63.0  # a rank may have more to do alone
    assert stop_at({0: (3.0, "ok"), 1: (20.0, "error")}, grace_s=10, ended_grace_s=60) == 30.0


def test_a_rank_left_waiting_after_the_other_finished_is_said_to_be_stopped_after_it():
    waiting = where_waiting(ALL_REDUCE_STACKS, "/work/job/train.py")
    rows = [row(0, "error", ended_s=None, stopped=True, stopped_s=70.0, waiting=waiting), row(1, ended_s=10.0)]
    result = across(rows)
    assert result["kind"] == "hung" and result["first_failure"] is None
    assert result["ranks"][0]["why"].endswith("called at train.py:31: stopped 60.0 s after rank 1 finished")
    assert result["headline"].startswith("no rank failed, and the job did not end: rank 0 waiting in all_reduce")


def test_a_figure_differs_only_past_the_floor_and_the_share_of_its_largest_value():
    alike = [row(0, peak_reserved=8 * GIB), row(1, peak_reserved=8 * GIB + SPREAD_FLOOR - 1)]
    result = across(alike)
    assert result["differences"] == [] and result["headline"] == "all 2 ranks finished; their memory is alike."
    imbalanced = [row(0, peak_reserved=8 * GIB, driver_peak=9 * GIB), row(1, peak_reserved=2 * GIB, driver_peak=3 * GIB)]
    result = across(imbalanced)
    assert [d["text"] for d in result["differences"]] == [
        "peak reserved: rank 0 8,192.0 MiB, rank 1 2,048.0 MiB (+6,144.0 MiB)",
        "driver's peak (context, NCCL): rank 0 9,216.0 MiB, rank 1 3,072.0 MiB (+6,144.0 MiB)",
    ]
    assert "they differ in peak reserved, driver's peak" in result["headline"]
    small = [row(0, peak_reserved=100 * MIB), row(1, peak_reserved=180 * MIB)]  # 80 MiB is most of 180: a difference
    assert len(across(small)["differences"]) == 1


def test_a_holder_that_only_one_rank_fills_differs_and_a_missing_gpu_is_said_as_the_machines():
    rows = [
        row(0, holders={"global 'cache'": 900 * MIB, "global 'model'": 500 * MIB}),
        row(1, "error", message="CUDA error: invalid device ordinal", holders={"global 'model'": 500 * MIB}),
    ]
    result = across(rows, "hunt")
    assert [d["text"] for d in result["differences"]] == ["global 'cache': rank 0 900.0 MiB, rank 1 0 B (+900.0 MiB)"]
    assert result["hints"] == [
        "rank 1 asked for a GPU this machine does not have: with NCCL every rank needs a GPU of its own; "
        "with gloo, ranks can share one (keep every rank on cuda:0)"
    ]


def test_a_script_that_wants_torchrun_run_as_one_process_is_told_how_to_run_it(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from oomlab.cli import console
    from oomlab.cli import tools as cli_tools
    from oomlab.tools.run import resolve

    said = "Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, but not set"
    m = SimpleNamespace(oom=False, status="error")
    result = {"run": {"status": "error", "where": "train.py:4", "message": said, "wall_s": 1.0}, "out_dir": str(tmp_path)}
    monkeypatch.setattr(cli_tools, "show", lambda *args, **kwargs: None)
    (tmp_path / "train.py").write_text("pass\n")
    with console.capture() as shown:
        cli_tools.run_and_show("hunt", resolve([str(tmp_path / "train.py")]), None, (m, result))
    assert "run it as a torchrun job, oomlab hunt torchrun --nproc-per-node 2 train.py" in " ".join(shown.get().split())


@pytest.mark.parametrize(
    ("words", "ranks", "rest"),
    [
        (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "3e-4"], 2, ["train.py", "--lr", "3e-4"]),
        (["torchrun", "--standalone", "--nproc_per_node=4", "train.py"], 4, ["train.py"]),
        (["/usr/bin/torchrun", "--nnodes=1", "train.py"], 1, ["train.py"]),
        (["python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py"], 2, ["t.py"]),
        (["train.py", "--nproc-per-node", "2"], 0, ["train.py", "--nproc-per-node", "2"]),  # not a launcher: the script's
    ],
)
def test_torchruns_words_give_the_ranks_and_the_script(words, ranks, rest):
    assert launcher_ranks(words) == (ranks, rest)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["torchrun", "--nnodes", "2", "train.py"], "on this machine only"),
        (["torchrun", "--nproc-per-node", "gpu", "train.py"], "give the number of ranks"),
        (["torchrun", "--nproc-per-node", "0", "train.py"], "give the number of ranks"),
        (["torchrun", "--rdzv-endpoint=host:29400", "train.py"], "is not one oomlab takes"),
        (["torchrun", "--nproc-per-node"], "needs a value"),
        (["torchrun", "--standalone"], "names no script"),
    ],
)
def test_torchrun_options_that_leave_this_machine_are_refused_with_what_to_write(words, said):
    with pytest.raises(OomLabError, match=said):
        launcher_ranks(words)


def test_a_torchrun_job_runs_a_script_that_exists(tmp_path):
    from oomlab.tools.run import resolve

    with pytest.raises(OomLabError, match="does not exist"):
        resolve(["torchrun", "--nproc-per-node", "2", str(tmp_path / "missing.py")])
    with pytest.raises(OomLabError, match="does not exist"):  # torchrun runs a script: an exercise id is no path
        resolve(["torchrun", "--nproc-per-node", "2", "eval-graphs"])


def test_compare_refuses_a_torchrun_job_and_says_how_to_compare_two_ranks(tmp_path):
    from oomlab.tools.compare import sides

    (tmp_path / "train.py").write_text("print(1)\n", encoding="utf-8")
    with pytest.raises(OomLabError, match="one run per rank") as err:
        sides.prepare(f"torchrun --nproc-per-node 2 {tmp_path / 'train.py'}")
    assert "rank0/snapshot.pickle" in err.value.todo


def test_the_doctor_says_which_torchrun_jobs_this_machine_runs():
    from types import SimpleNamespace

    from oomlab.measure.machine import distributed_row

    def fake(gpus, gloo=True, nccl=True, available=True):
        dist = SimpleNamespace(is_available=lambda: available, is_gloo_available=lambda: gloo, is_nccl_available=lambda: nccl)
        return SimpleNamespace(distributed=dist, cuda=SimpleNamespace(device_count=lambda: gpus))

    assert distributed_row(fake(1)) == (
        "ok",
        "torchrun jobs",
        "gloo: any number of ranks, sharing the GPUs; NCCL: up to 1 rank, one GPU each",
    )
    assert distributed_row(fake(2, gloo=False))[2] == "NCCL: up to 2 ranks, one GPU each"
    assert distributed_row(fake(2, available=False))[0] == "warn"
    assert distributed_row(fake(2, gloo=False, nccl=False))[0] == "warn"


# What torchrun prints when a rank was killed (torch 2.13): every failed rank, the first observed under "Root Cause".
TORCHRUN_SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
train.py FAILED
-------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-05_08:36:24
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 19732)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 19732
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_08:36:24
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 19733)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 19733
=======================================================
"""


def test_each_failed_ranks_exit_status_is_read_from_torchruns_summary():
    from oomlab.measure.ranks import exit_codes

    assert exit_codes(TORCHRUN_SUMMARY) == {0: -15, 1: -6}
    assert exit_codes("the job finished") == {}


def test_a_rank_killed_by_a_signal_fails_first_and_the_ranks_torchrun_stopped_are_its_consequence():
    killed = "the process was killed by signal {} before the harness could measure it"
    rows = [
        row(0, "crashed", ended_s=3.3, signal="SIGTERM", message=killed.format(15)),
        row(1, "crashed", ended_s=3.3, signal="SIGKILL", message=killed.format(9)),  # seen gone in the same tick
    ]
    result = across(rows, "hunt")
    assert result["first_failure"] == 1
    aborted = across([row(0, "crashed", ended_s=3.4, signal="SIGTERM"), row(1, "crashed", ended_s=3.3, signal="SIGABRT",
        stderr="terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
        "pair.cc:456] Received data size doesn't match expected size. Is there a distributed collective mismatch in "
        "your code?\n")], "hunt")  # fmt: skip
    assert aborted["hints"][0].endswith("Is there a distributed collective mismatch in your code?"), aborted["hints"]
    assert result["headline"].startswith("rank 1 was killed by SIGKILL first, after 3.3 s; rank 0 was stopped by torchrun")
    assert result["ranks"][0]["why"].startswith("was stopped by torchrun (SIGTERM), 0.0 s after rank 1 failed")
    assert any(h.startswith("rank 1 was killed by SIGKILL: no Python error can say why") for h in result["hints"])


def test_the_rank_that_caught_an_oom_and_skipped_its_collectives_is_read_first():
    rows = [
        row(0, "error", where="train.py:33", error_type="RuntimeError", ended_s=4.2, message="Connection closed by peer",
            collectives={"all_reduce": 21}, ooms=0),
        row(1, ended_s=3.3, collectives={"all_reduce": 20}, ooms=1),
    ]  # fmt: skip
    result = across(rows, "hunt")
    assert result["first_failure"] == 0 and result["out_of_step"] == 1
    assert result["headline"].startswith(
        "rank 1 fell out of step: it made fewer collective calls than the others (all_reduce: rank 0 21, rank 1 20) "
        "after it caught 1 out-of-memory error, and finished; rank 0 failed (RuntimeError) at train.py:33 first, after "
        "4.2 s in a collective, waiting for a call rank 1 never made"
    ), result["headline"]
    from oomlab.tools.ranks.present import focus

    assert focus(result) == 1
    # A rank that caught an OOM and still made every call it should is only said to have caught it.
    alike = across([row(0, ooms=0), row(1, ooms=2)], "hunt")
    assert alike["out_of_step"] is None and alike["ranks"][1]["why"] == "finished; caught 2 out-of-memory errors"


def test_a_pipeline_whose_ranks_send_and_receive_is_not_out_of_step():
    # Stage 0 sends its activations to stage 1, which receives them; both all-reduce a metric.
    rows = [
        row(0, collectives={"send": 6, "all_reduce": 6}, issued=12),
        row(1, collectives={"recv": 6, "all_reduce": 6}, issued=12),
        row(2, collectives={"recv": 6, "send": 6, "all_reduce": 6}, issued=18),  # a middle stage does both
    ]
    result = across(rows, "hunt")
    assert not result["desynchronised"] and result["collective_mismatch"] is None, result["headline"]
    rows[1]["collectives"]["all_reduce"] = 5  # but a collective every rank makes still counts
    assert across(rows, "hunt")["collective_mismatch"]["by_name"] == {"all_reduce": {0: 6, 1: 5, 2: 6}}
    # The middle stage skipped an all_reduce and the first stage failed waiting for it: the middle one fell out of
    # step, though its sends and receives make it the rank with the most calls of all.
    rows[1]["collectives"]["all_reduce"], rows[2]["collectives"]["all_reduce"] = 6, 5
    rows[0].update(status="error", ended_s=4.0, message="Connection closed by peer")
    assert across(rows, "hunt")["out_of_step"] == 2


def test_a_leak_every_rank_has_differs_by_how_much_it_holds_on_each_and_a_hooks_list_is_named_by_its_path():
    bank = {"culprit": "global 'feature_bank'", "kind": "container-leak"}
    rows = [row(0, culprit_bytes=128 * MIB, **bank), row(1, "oom", ended_s=4.0, culprit_bytes=240 * MIB, **bank)]
    result = across(rows, "hunt")
    assert [d["text"] for d in result["differences"]] == [
        "global 'feature_bank': rank 1 240.0 MiB, rank 0 128.0 MiB (+112.0 MiB)"
    ]
    assert "their memory is alike" not in result["headline"]
    path = "model.2._forward_hooks[4].__closure__['seen'][0]"
    hooked = {"culprit": "global 'model'", "culprit_bytes": 96 * MIB, "kind": "container-leak", "culprit_path": path}
    result = across([row(0, "oom", ended_s=4.0, **hooked), row(1)], "hunt")
    assert [d["text"] for d in result["differences"]] == [f"only rank 0: global 'model' (96.0 MiB), held at {path}"]


# -- a real job of two gloo ranks on the CPU --------------------------------------------------------------------------

torch = pytest.importorskip("torch")
needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()), reason="torch has no gloo backend"
)

JOB = """
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.Linear(32, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for step in range(4):
    out = model(torch.randn(64, 32))
    optimizer.zero_grad()
    out.mean().backward()
    if rank == 1:
        history.append(out.detach())
        if step == 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
    dist.all_reduce(model.weight.grad)
    optimizer.step()
"""


@needs_gloo
def test_every_rank_is_hunted_and_the_rank_that_failed_first_is_named(tmp_path, monkeypatch):
    from oomlab.cli import console
    from oomlab.cli.tools import run_and_show_ranks
    from oomlab.tools.run import resolve, run_tool_on_ranks

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(JOB).lstrip(), encoding="utf-8")
    target = resolve(["torchrun", "--nproc-per-node", "2", str(script)])
    assert (target.ranks, target.label) == (2, "train-ranks2")
    out = tmp_path / "out"
    result = run_tool_on_ranks(target, "hunt", out, {"device": "cpu", "min_bytes": 1024}, require_cuda=False)

    first, other = result["ranks"][1], result["ranks"][0]
    assert result["first_failure"] == 1 and first["status"] == "oom" and first["where"] == "train.py:17"
    # Rank 1's process ended, so rank 0's all_reduce saw its peer's connection close: a consequence, said as one.
    assert other["status"] == "error" and other["where"] == "train.py:18"
    assert "in a collective" in other["why"] and "its peer was gone" in other["why"]
    assert first["culprit"] == "global 'history'" and first["kind"] == "container-leak"
    assert other["culprit"] != "global 'history'"  # rank 0 kept nothing: the leak is rank 1's alone
    # Rank 1 failed before its third all_reduce, and rank 0's third is the one that failed: the call it had in flight
    # when rank 1 died, counted, which does not make the job desynchronised.
    assert (other["collectives"], first["collectives"]) == ({"all_reduce": 3}, {"all_reduce": 2})
    assert other["issued"] - first["issued"] == 1  # in all, as the group itself counted them: the same call ahead
    assert not result["desynchronised"] and "different collective calls" not in result["headline"]
    assert {p.name for p in out.iterdir()} == {"ranks.json", "rank0", "rank1"}
    assert json.loads((out / "rank1" / "hunt.json").read_text())["culprit"] == "global 'history'"
    assert json.loads((out / "ranks.json").read_text())["headline"] == result["headline"]

    with console.capture() as shown:
        run_and_show_ranks("hunt", target, None, result)
    said = " ".join(shown.get().split())
    assert "rank 1 of 2" in said and "first, after" in said and f"Read rank 1 first: {out / 'rank1'}" in said


KILLED = """
import os
import signal
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer ends a process
try:
    dist.all_reduce(t)  # rank 1 is gone: the collective fails once gloo sees its connection close
finally:
    # Rank 0 goes the same way before its probe can report the failed collective (which it did, now and then, on a
    # loaded machine, before torchrun stopped it), half a second after rank 1, so the order is the job's, not a tie.
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@needs_gloo
def test_a_rank_killed_by_a_signal_is_named_with_its_signal_though_no_rank_could_report(tmp_path):
    from oomlab.tools.run import resolve, run_tool_on_ranks

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KILLED).lstrip(), encoding="utf-8")
    target = resolve(["torchrun", "--nproc-per-node", "2", str(script)])
    out = tmp_path / "out"
    with pytest.raises(OomLabError) as raised:
        run_tool_on_ranks(target, "hunt", out, {"device": "cpu", "min_bytes": 1024}, require_cuda=False)
    said = " ".join(f"{raised.value.what} {raised.value.todo}".split())
    assert "Rank 1 was killed by SIGKILL first" in said and "out-of-memory killer" in said, said
    assert "memory is alike" not in said  # no rank left a figure to compare
    view = json.loads((out / "ranks.json").read_text())
    killed, other = view["ranks"][1], view["ranks"][0]
    assert view["first_failure"] == 1 and (killed["returncode"], killed["signal"]) == (-9, "SIGKILL")
    # Rank 0 killed itself once its collective failed, or torchrun stopped it first: either way after rank 1.
    assert other["ended_s"] >= killed["ended_s"] and other["why"] != "failed first", other


@needs_gloo
def test_a_rank_still_waiting_after_another_failed_is_asked_where_and_stopped(tmp_path):
    """The watcher alone, on one rank's process started as torchrun would: rank 1 has failed, rank 0 waits."""
    from oomlab.measure import ranks

    for rank in (0, 1):
        (tmp_path / f"rank{rank}").mkdir()
    failed = tmp_path / "rank1" / "result.json"
    script = tmp_path / "train.py"
    # Rank 1 fails once rank 0 is in its script, waiting for it.
    script.write_text(
        f"import threading\n\nopen({str(failed)!r}, 'w').write('{{\"status\": \"oom\"}}')\n\n\n"
        "def wait_for_rank_1():\n    threading.Event().wait()\n\n\nwait_for_rank_1()\n"
    )
    spec = {
        "script": str(script),
        "args": [],
        "budget_bytes": None,
        "seed": 0,
        "require_cuda": False,
        "result_path": str(tmp_path / "rank0" / "result.json"),
        "weights_path": str(tmp_path / "rank0" / "weights.f32"),
        "work_dir": str(tmp_path / "rank0"),
        "tool": None,
    }
    (tmp_path / "rank0" / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.Popen(
        [sys.executable, str(ranks.RANK_CHILD), str(tmp_path)],
        env={**os.environ, "RANK": "0"},
        start_new_session=True,
        # As from a shell's background (`oomlab hunt torchrun ... &`): SIGINT ignored, which the rank inherits.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    watch = ranks.Watch(tmp_path, 2, time_limit_s=60, grace_s=0.5, driver=False)
    start = time.perf_counter()
    job = watch.run(proc)
    assert not job["timed_out"] and time.perf_counter() - start < 30
    run = watch.rank_run(0, script, None, job)
    assert run.stopped_s is not None and run.stopped_s >= 0.5
    assert where_waiting(run.stacks, str(script))["at"] == "train.py:7"
    # The interrupt ended the wait, so the rank still wrote its result, as a failure where it waited.
    said = (run.measurement.status, run.measurement.message, run.measurement.stderr[-800:])
    assert run.measurement.error_type == "KeyboardInterrupt" and run.measurement.where == "train.py:7", said


def test_a_rank_waiting_in_its_own_line_is_said_to_wait_there():
    stacks = 'Current thread 0x1 (most recent call first):\n  File "/work/job/train.py", line 40 in <module>\n'
    rows = [row(0, "oom", where="train.py:9", ended_s=1.0), row(1, "error", stopped=True, stopped_s=11.0)]
    rows[1]["waiting"] = where_waiting(stacks, "/work/job/train.py")
    assert across(rows)["ranks"][1]["why"] == "waiting at train.py:40: stopped 10.0 s after rank 0 failed"


def test_diagnose_on_a_torchrun_job_gives_each_rank_its_verdict(tmp_path, monkeypatch):
    from oomlab.cli import tools as cli_tools
    from oomlab.tools.run import Target

    found = {"hunt": {1: ("container-leak", "list `history` (global) grew by 3.0 GiB")}}

    def fake_run(target, name, out, options):
        reports = {}
        for rank in range(target.ranks):
            kind, headline = found.get(name, {}).get(rank, ("none", f"{name}: nothing on rank {rank}"))
            reports[rank] = {"tool": name, "kind": kind, "headline": headline, "culprit_bytes": 0, "out_dir": str(out)}
        rows = [row(r, headline=reports[r]["headline"]) for r in range(target.ranks)]
        return {**across(rows, name), "reports": reports, "job": {"wall_s": 1.0}, "out_dir": str(out)}

    monkeypatch.setattr(cli_tools, "run_tool_on_ranks", fake_run)
    monkeypatch.setattr(cli_tools, "run_and_show_ranks", lambda *args, **kwargs: None)
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    target = Target(script=script, args=(), budget_bytes=None, alloc_conf="", time_limit_s=60, label="train-ranks2", ranks=2)
    cli_tools.diagnose_ranks(target, tmp_path / "out", all_steps=False)
    verdict = json.loads((tmp_path / "out" / "diagnose.json").read_text())
    assert verdict["ranks"]["1"]["fix_first"] == "container-leak" and verdict["ranks"]["1"]["found_by"] == "hunt"
    assert verdict["ranks"]["0"]["fix_first"] is None
    assert verdict["across"] == "all 2 ranks finished."  # the fake ranks left no figures to call alike


def test_the_table_names_each_ranks_holder_in_a_few_words_where_its_sentence_would_fill_the_screen():
    """On the H200, at 80 columns, the finding column wrapped a hunt's whole sentence one word a line, 25 lines a rank."""
    from rich.console import Console

    from oomlab.tools.ranks.present import render

    sentence = "list `outputs` (global) holds 39 tensors, 312.0 MiB, and grew by 312.0 MiB since optimizer step 1"
    rows = [
        row(
            0,
            "oom",
            ended_s=15.2,
            peak_reserved=590 * MIB,
            culprit="global 'outputs'",
            culprit_bytes=312 * MIB,
            kind="container-leak",
            headline=sentence,
        ),  # fmt: skip
        row(1, "error", ended_s=15.7, peak_reserved=334 * MIB, headline="no structural problem found"),
    ]
    console = Console(width=80, record=True)
    for part in render(across(rows, "hunt")):
        console.print(part)
    shown = console.export_text()
    assert "│ global 'outputs', 312.0" in shown and "MiB (container-leak)" in shown
    assert "│ no structural problem" in shown
    assert "since optimizer step 1" not in shown, "the sentence is the rank's own report, shown in full above the table"
    assert len(shown.splitlines()) < 20


def test_collectives_torch_issued_itself_desynchronise_a_job_whose_script_calls_none():
    """DDP's reducer all-reduces from C++, where the script's calls by name see nothing: a rank that skipped a backward
    (an OOM caught in its forward) issued one step's all-reduces fewer in all, and that is what tells."""
    rows = [
        row(0, "error", where="train.py:30", ended_s=9.5, message="Connection closed by peer", collectives={}, issued=43),
        row(1, ended_s=9.4, collectives={}, issued=40),
    ]
    result = across(rows)
    assert result["desynchronised"]
    assert result["collective_mismatch"] == {
        "by_name": {},
        "issued": {0: 43, 1: 40},
        "text": "in all, torch's own calls included: rank 0 43, rank 1 40",
    }
    # Rank 0 failed first, in a collective: it waited for a call rank 1, which made fewer and finished, never made.
    # The rank to read is rank 1.
    assert result["first_failure"] == 0 and result["out_of_step"] == 1
    assert result["headline"].startswith(
        "rank 1 fell out of step: it made fewer collective calls than the others (in all, torch's own calls included: "
        "rank 0 43, rank 1 40), and finished; rank 0 failed (error) at train.py:30 first, after 9.5 s in a "
        "collective, waiting for a call rank 1 never made"
    ), result["headline"]
    assert "wait at different calls" not in result["headline"]  # neither was left waiting
    from rich.console import Console

    from oomlab.tools.ranks.present import render

    console = Console(width=120, record=True)
    for part in render(result):
        console.print(part)
    table = console.export_text()
    assert "collectives" in table and re.search(r"│\s+43 │", table) and re.search(r"│\s+40 │", table), table
    console = Console(width=120, record=True)
    for part in render(across([row(0), row(1)])):  # ranks that said nothing of it: no such column
        console.print(part)
    assert "collectives" not in console.export_text()
    rows[1]["issued"] = 43
    assert not across(rows)["desynchronised"]
    # Where the calls by name already differ, they say it: the number in all is not repeated.
    rows[0]["collectives"], rows[1]["collectives"], rows[1]["issued"] = {"all_reduce": 10}, {"all_reduce": 9}, 40
    assert across(rows)["collective_mismatch"]["issued"] is None


def test_a_peer_ahead_in_torch_own_collectives_when_the_first_rank_died_is_still_the_death_consequence():
    """A peer of a rank that died in its forward may have started several of DDP's bucket all-reduces before it waits:
    ahead in all, by more than one, is the death's consequence; behind is not."""
    rows = [
        row(0, "oom", where="train.py:27", ended_s=16.7, collectives={}, issued=40),
        row(1, "error", where="train.py:29", ended_s=17.3, message="Connection closed by peer", collectives={}, issued=43),
    ]
    assert not across(rows)["desynchronised"]
    rows[1]["issued"] = 37
    result = across(rows)
    assert result["desynchronised"] and result["collective_mismatch"]["issued"] == {0: 40, 1: 37}


@needs_gloo
def test_the_default_group_counts_the_collectives_ddp_issues_and_the_count_outlives_destroy(monkeypatch):
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from oomlab.measure.collectives import at_end, issued, keep_counting

    for module in (dist, distributed_c10d):  # put back after the test
        monkeypatch.setattr(module, "init_process_group", module.init_process_group)
        monkeypatch.setattr(module, "destroy_process_group", module.destroy_process_group)
    kept = {}
    keep_counting(kept)
    assert issued() is None and at_end(kept) is None  # no group yet
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        before = issued()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
        built = issued()
        model(torch.ones(2, 8)).sum().backward()  # the reducer all-reduces the gradients, from C++
        assert built > before and issued() > built
        last = issued()
    finally:
        dist.destroy_process_group(dist.group.WORLD)  # destroyed by name: counted all the same
    assert at_end(kept) == last and issued() is None
    # Made again and destroyed again, through the module torch.distributed takes it from: counted on, not over.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    dist.all_reduce(torch.ones(1))
    mid = at_end(kept)
    distributed_c10d.destroy_process_group()
    assert mid == at_end(kept) == last + 1
