"""Every way a measured run can end, on CPU: ``require_cuda=False`` runs the child without a GPU.

Each test that starts a process costs a few seconds (the child imports torch),
so the successful run is measured once and shared by the tests that read it, and
a test about what a run records rather than how it is started runs forked from the
module's warm server (a fraction of a second); ``runner`` tests each way.
"""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import pytest

from oomlab.measure import harness, weights
from oomlab.measure.harness import child_env, measure
from oomlab.measure.warm import WarmServer

pytestmark = pytest.mark.long  # tens of seconds of processes: make test starts it first

BUDGET = 1 << 30


def write(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")
    return path


def run(script: Path, **kwargs):
    kwargs.setdefault("time_limit_s", 60)
    return measure(script, budget_bytes=BUDGET, require_cuda=kwargs.pop("require_cuda", False), **kwargs)


@pytest.fixture(scope="module")
def warm_server(tmp_path_factory):
    """One warm server for the module's forked runs (it imports torch once: a few seconds)."""
    server = WarmServer.start(tmp_path_factory.mktemp("course"), "", child_env(""))
    assert server.wait_ready(), server.why_not_ready()
    yield server
    server.stop()


@pytest.fixture(params=["fresh", "forked"])
def runner(request):
    """Each way a run is measured: ``run(script, **runner)`` measures in that way, and checks it was."""
    if request.param == "fresh":
        return {}
    return {"server": request.getfixturevalue("warm_server")}


def ran(m, runner: dict):
    """``m``, after checking it was measured the way ``runner`` asked (a refusal would test the wrong thing)."""
    assert m.runner == ("forked" if runner else "fresh"), m.runner_note
    return m


@pytest.fixture
def no_process(monkeypatch):
    """Fail the test if the harness starts a process."""

    def refuse(*args, **kwargs):
        raise AssertionError("the harness started a process")

    monkeypatch.setattr(harness.subprocess, "Popen", refuse)


OK_SCRIPT = """
import json, os, sys

import torch
from torch import nn

import helper  # a module next to the script

print(json.dumps({"cwd": os.getcwd(), "argv0": sys.argv[0], "path0": sys.path[0], "helper": helper.VALUE}))

model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
losses = []
for step in range(3):
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    loss = ((model(x) - y) ** 2).mean()
    optimizer.zero_grad()
    loss.backward()
    losses.append(loss.item())
    optimizer.step()
    with torch.no_grad():  # autograd off: an inference forward, even in training mode
        model(torch.randn(5, 4))

weights = [p.detach().double() for p in model.parameters()]
print(json.dumps({
    "losses": losses,
    "sum": float(sum(w.sum() for w in weights)),
    "norm": float(sum((w * w).sum() for w in weights)) ** 0.5,
}))
"""


@pytest.fixture(scope="module", params=["fresh", "forked"])
def ok_run(tmp_path_factory, request):
    folder = tmp_path_factory.mktemp("ok")
    write(folder, "helper.py", "VALUE = 'sibling import works'\n")
    script = write(folder, "train.py", OK_SCRIPT)
    via = {"server": request.getfixturevalue("warm_server")} if request.param == "forked" else {}
    m = ran(run(script, **via), via)
    assert m.status == "ok", (m.status, m.message, m.stderr)
    env, figures = (json.loads(line) for line in m.stdout.splitlines()[-2:])
    return script, m, env, figures


def test_ok_run_records_the_workload(ok_run):
    script, m, _, figures = ok_run
    w = m.workload
    assert w["optimizer_steps"] == 3
    assert w["samples_per_step"] == [16, 16, 16]
    assert (w["train_forwards"], w["train_samples"], w["train_elements"]) == (3, 48, 48 * 4)
    assert (w["inference_forwards"], w["inference_samples"], w["inference_elements"]) == (3, 15, 15 * 4)
    assert w["devices"] == ["cpu"]
    assert w["backward_calls"] == 3
    assert w["param_count"] == 4 * 8 + 8 + 8 * 1 + 1
    # Losses are recorded at backward(), and they are the script's own losses.
    assert w["losses"] == pytest.approx(figures["losses"], rel=1e-6)
    # The final weights are the ones the script ends with: the parent's digest of what the child wrote.
    tensors = m.weights_digest["tensors"]
    assert [t["shape"] for t in tensors] == [[8, 4], [8], [1, 8], [1]]
    assert sum(t["sum"] for t in tensors) == pytest.approx(figures["sum"], rel=1e-6)
    assert sum(t["norm"] ** 2 for t in tensors) ** 0.5 == pytest.approx(figures["norm"], rel=1e-6)
    # Without CUDA there are no allocator figures, and nothing was tampered with.
    assert m.stats is None
    assert m.tamper == [] and m.alloc_conf_changed == []
    assert m.script == str(script.resolve())
    assert m.budget_bytes == BUDGET
    assert m.wall_s is not None and m.process_s >= m.wall_s


def test_child_runs_like_python_script(ok_run):
    script, _, env, _ = ok_run
    folder = script.resolve().parent
    assert Path(env["cwd"]).resolve() == folder
    assert Path(env["argv0"]).resolve() == script.resolve()
    assert Path(env["path0"]).resolve() == folder
    assert env["helper"] == "sibling import works"


def test_error_points_at_the_learners_line(tmp_path, runner):
    write(tmp_path, "helper.py", "def check(n):\n    raise ValueError(f'bad value {n}')\n")
    script = write(
        tmp_path,
        "train.py",
        """
        import helper

        def step():
            helper.check(-1)

        step()
        """,
    )
    m = ran(run(script, **runner), runner)
    assert m.status == "error"
    assert m.error_type == "ValueError"
    assert m.message == "bad value -1"
    # The last frame in the learner's file, not the helper's line where it was raised.
    assert m.line_no == 4
    assert m.line == "helper.check(-1)"
    assert m.where == "train.py:4"
    assert "ValueError: bad value -1" in m.traceback
    assert m.workload is not None  # the figures are still written after an error


def test_syntax_error_is_reported_without_a_process(tmp_path, no_process):
    script = write(tmp_path, "train.py", "x = 1\ny = (2,\nprint(x y)\n")
    start = time.perf_counter()
    m = run(script)
    assert time.perf_counter() - start < 1.0
    assert m.status == "syntax"
    assert m.error_type == "SyntaxError"
    assert m.line_no in (2, 3)
    assert m.line in ("y = (2,", "print(x y)")
    assert m.message
    assert m.budget_bytes == BUDGET


def test_missing_script(tmp_path, no_process):
    m = run(tmp_path / "nope.py")
    assert m.status == "missing"
    assert "nope.py does not exist" in m.message


def process_state(pid: int) -> str | None:
    """'Z' for a zombie, None once gone, else the state letter from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def test_timeout_stops_the_script_and_what_it_started(tmp_path, runner):
    pid_file = tmp_path / "grandchild.pid"
    script = write(
        tmp_path,
        "train.py",
        f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open({str(pid_file)!r}, "w").write(str(child.pid))
        while True:
            time.sleep(0.05)
        """,
    )
    # The limit includes importing torch (2 s on an idle machine, over 15 s seen on a loaded one): the script must
    # have started its child for the test to mean anything, so a run that timed out first is tried once more
    # under a limit no load reaches, rather than failing for what the machine was doing. The first limit is
    # short, since the whole of it is spent waiting.
    for limit in (6, 90) if not runner else (2, 60):  # forked: torch is imported already
        m = ran(run(script, time_limit_s=limit, **runner), runner)
        assert m.status == "timeout"
        assert f"limit of {limit} s" in m.message
        assert limit <= m.process_s < limit + 30
        if pid_file.exists():
            break
    # The whole process group is killed, not just the measuring process.
    assert pid_file.exists(), "the script did not get to start its own child within 90 s"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while process_state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    state = process_state(pid)
    if state not in (None, "Z"):
        os.kill(pid, 9)
    assert state in (None, "Z"), f"the script's own child {pid} survived the timeout"


def test_sys_exit_with_a_code(tmp_path, runner):
    m = ran(run(write(tmp_path, "train.py", "import sys\nprint('leaving')\nsys.exit(3)\n"), **runner), runner)
    assert m.status == "exit"
    assert "sys.exit(3)" in m.message
    assert "leaving" in m.stdout


def test_os_exit_is_a_crash(tmp_path, runner):
    m = ran(run(write(tmp_path, "train.py", "import os\nprint('bye', flush=True)\nos._exit(0)\n"), **runner), runner)
    assert m.status == "crashed"
    assert "exited with code 0" in m.message
    assert "bye" in m.stdout
    assert m.workload is None  # nothing could be measured


def test_no_cuda_when_required(tmp_path, monkeypatch):
    # No GPU visible, even on a machine that has one: the status is the same everywhere.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    marker = tmp_path / "ran"
    script = write(tmp_path, "train.py", f"open({str(marker)!r}, 'w').write('ran')\n")
    m = run(script, require_cuda=True)
    assert m.status == "no_cuda"
    assert "sees no CUDA device" in m.message
    assert m.status in harness.MACHINE_PROBLEMS
    assert not marker.exists(), "the script ran although the machine cannot measure it"


MICRO_BATCHES = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
with torch.no_grad():  # the whole batch's loss, for comparison: an inference forward
    whole = ((model(x) - y) ** 2).mean().item()
optimizer.zero_grad()
for half in (slice(0, 8), slice(8, 16)):
    loss = ((model(x[half]) - y[half]) ** 2).mean() / 2  # each half's loss, halved: the whole batch's mean
    loss.backward()
optimizer.step()
print(whole)
"""


def test_the_loss_of_an_optimizer_step_is_the_sum_of_its_micro_batches(tmp_path, warm_server):
    m = run(write(tmp_path, "train.py", MICRO_BATCHES), server=warm_server)
    assert m.status == "ok", (m.message, m.stderr)
    w = m.workload
    whole = float(m.stdout.splitlines()[-1])
    assert w["optimizer_steps"] == 1 and w["samples_per_step"] == [16]
    assert w["losses"] == [pytest.approx(whole, rel=1e-6)]  # what the optimizer saw: the whole batch's loss
    assert w["backward_calls"] == 2 and w["backward_per_step"] == [2]


FAILED_FORWARD = """
import torch
from torch import nn


class Picky(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 1)

    def forward(self, x):
        out = self.inner(x)
        if x.shape[0] > 8:  # as an OOM inside the model would, halfway through its forward
            raise RuntimeError("too big")
        return out


model = Picky()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 4), torch.randn(16, 1)
optimizer.zero_grad()
try:
    model(x)
except RuntimeError:  # recovery: the batch in halves, outside the except block
    pass
for half in (slice(0, 8), slice(8, 16)):
    (((model(x[half]) - y[half]) ** 2).mean() / 2).backward()
optimizer.step()
"""


def test_a_forward_that_raises_is_not_counted_and_leaves_later_forwards_counted(tmp_path, warm_server):
    m = run(write(tmp_path, "train.py", FAILED_FORWARD), server=warm_server)
    assert m.status == "ok", (m.message, m.stderr)
    w = m.workload
    assert (w["train_forwards"], w["train_samples"]) == (2, 16)  # the two halves; not the attempt that raised
    assert w["samples_per_step"] == [16]


CHECKPOINTED = """
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(4)])

    def forward(self, x):
        if sys.argv[1] in ("per-block", "reentrant"):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=sys.argv[1] == "reentrant")
            return x
        return checkpoint_sequential(self.blocks, 2, x, use_reentrant=False)


torch.manual_seed(0)
model = Deep()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4, requires_grad=True)  # reentrant checkpointing computes no gradients without it
for step in range(2):
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
"""


def test_blocks_recomputed_in_backward_are_not_new_samples(tmp_path, warm_server):
    script = write(tmp_path, "train.py", CHECKPOINTED)
    for way in ("per-block", "reentrant", "sequential"):
        m = run(script, args=(way,), server=warm_server)
        assert m.status == "ok", (m.message, m.stderr)
        # Backward recomputes checkpointed blocks; the step still trained the batch's 16 samples, once.
        assert m.workload["samples_per_step"] == [16, 16], way
        assert m.workload["train_forwards"] == 2, way
        assert m.workload["backward_per_step"] == [1, 1], way  # reentrant checkpointing's inner backward is not another


def test_the_script_starts_with_the_collector_in_the_same_state_fresh_or_forked(tmp_path, runner):
    script = write(tmp_path, "train.py", "import gc\nprint(gc.get_count(), gc.get_freeze_count() > 0)\n")
    m = ran(run(script, **runner), runner)
    assert m.status == "ok", (m.message, m.stderr)
    counts, frozen = m.stdout.strip().rsplit(" ", 1)
    # Everything imported before the script is frozen, and the counts start near zero, whichever the runner.
    assert frozen == "True"
    assert sum(int(n) for n in counts.strip("()").split(",")) < 100, counts


TWO_LOSSES = """
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(16, 4)
out = model(x)
first, second = out[:, 0].pow(2).mean(), out[:, 1].abs().mean()
optimizer.zero_grad()
if sys.argv[1] == "sum":
    (first + second).backward()
elif sys.argv[1] == "list":
    torch.autograd.backward([first, second])
elif sys.argv[1] == "engine":  # around torch.autograd.backward, straight into the engine
    from torch.autograd.graph import _engine_run_backward

    total = first + second
    _engine_run_backward((total,), (torch.ones_like(total),), False, False, (), allow_unreachable=True, accumulate_grad=True)
else:
    grads = torch.autograd.grad(first + second, list(model.parameters()))
    for p, g in zip(model.parameters(), grads):
        p.grad = g
optimizer.step()
"""


def test_every_way_to_backpropagate_two_losses_gives_the_step_their_sum(tmp_path, warm_server):
    script = write(tmp_path, "train.py", TWO_LOSSES)
    runs = {way: run(script, args=(way,), server=warm_server) for way in ("sum", "list", "grad", "engine")}
    for way, m in runs.items():
        assert m.status == "ok", (way, m.message, m.stderr)
        # The engine counts every backward, however the script reached it.
        assert m.workload["backward_per_step"] == [1], way
    losses = {way: m.workload["losses"] for way, m in runs.items()}
    for way in ("list", "grad", "engine"):
        assert losses[way] == pytest.approx(losses["sum"], rel=1e-6), way
    assert losses["sum"][0] > 0
    for way in ("list", "grad", "engine"):
        distance, why = weights.compare(runs[way].weights_digest, runs["sum"].weights_digest)
        assert distance is not None and distance < 1e-6, (way, why)


RETRIED_IN_HALVES = """
import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
batch = torch.randn(8, 4)


class TooBig(torch.autograd.Function):
    \"\"\"Fails in backward for a batch over four samples, as an OOM would.\"\"\"

    @staticmethod
    def forward(ctx, x):
        ctx.samples = x.shape[0]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if ctx.samples > 4:
            raise RuntimeError("out of memory (simulated)")
        return grad


def step(x, scale=1.0):
    (TooBig.apply(model(x)).pow(2).mean() * scale).backward()


optimizer.zero_grad()
if sys.argv[1] == "retry":  # the whole batch first, then its halves when its backward fails
    try:
        step(batch)
    except RuntimeError:
        optimizer.zero_grad()
        step(batch[:4], 0.5)
        step(batch[4:], 0.5)
elif sys.argv[1] == "loss-fails":  # the whole batch's forward, then its loss fails before any backward
    try:
        out = model(batch)
        raise RuntimeError("out of memory (simulated, in the loss)")
    except RuntimeError:
        step(batch[:4], 0.5)
        step(batch[4:], 0.5)
else:  # split before the first attempt
    step(batch[:4], 0.5)
    step(batch[4:], 0.5)
optimizer.step()
"""


def test_a_batch_whose_backward_failed_is_not_counted_so_a_split_batch_counts_once(tmp_path, warm_server):
    script = write(tmp_path, "train.py", RETRIED_IN_HALVES)
    retry, loss_fails, split = (run(script, args=(way,), server=warm_server) for way in ("retry", "loss-fails", "split"))
    for m in (retry, loss_fails, split):
        assert m.status == "ok", (m.message, m.stderr)
        assert m.workload["samples_per_step"] == [8]
        assert m.workload["backward_per_step"] == [2]
        assert (m.workload["train_samples"], m.workload["train_elements"]) == (8, 32)
    assert retry.workload["failed_backwards"] == 1 and split.workload["failed_backwards"] == 0
    assert retry.workload["losses"] == pytest.approx(split.workload["losses"], rel=1e-6)
    assert loss_fails.workload["losses"] == pytest.approx(split.workload["losses"], rel=1e-6)


def test_an_exercise_file_is_measured_with_all_its_settings_and_only_the_budget_replaced(monkeypatch, tmp_path):
    from types import SimpleNamespace

    calls = []
    monkeypatch.setattr(harness, "measure", lambda script, **kwargs: calls.append(kwargs))
    ex = SimpleNamespace(
        budget_bytes=BUDGET,
        alloc_conf="expandable_segments:True",
        time_limit_s=90,
        root=tmp_path,
        checks={"plateau": {}},
        learner_settings=True,
    )
    harness.measure_exercise_file(ex, tmp_path / "train.py")
    harness.measure_exercise_file(ex, tmp_path / "train.py", budget_bytes=12 * BUDGET)
    graded, capped = calls
    assert graded["budget_bytes"] == BUDGET and capped["budget_bytes"] == 12 * BUDGET
    assert {**graded, "budget_bytes": None} == {**capped, "budget_bytes": None}
    assert graded["serving"] and graded["settings_free"] and graded["course_root"] == tmp_path


# The script shares its process with the code that writes the result: a result it writes itself must fail as forged
# when its form is not the harness's, and never take the place of what the parent measures.
FORGE = """
import json, os
for fd in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{{fd}}")
    except OSError:
        continue
    if target.endswith("result.json"):
        os.write(int(fd), json.dumps({result}).encode())
os._exit(0)
"""


@pytest.mark.parametrize(
    "forged, why",
    [
        ({"status": "ok", "stats": {"peak_reserved": "0"}}, "its figures are not the allocator's"),
        ({"status": "ok", "workload": {"optimizer_steps": 3}}, "the workload has no"),
        ({"status": "ok", "tamper": "none"}, "tamper is str"),
        ({"message": "no status"}, "it has no status"),
    ],
)
def test_a_result_the_script_wrote_in_another_form_fails_as_forged(tmp_path, forged, why, warm_server):
    m = run(write(tmp_path, "train.py", FORGE.format(result=repr(forged))), server=warm_server)
    assert m.status == "forged" and why in m.message, (m.status, m.message)
    assert m.status in harness.SCRIPT_FAILURES and m.workload is None and m.stats is None


def test_what_the_parent_measures_is_never_taken_from_the_result_file(ok_run, tmp_path):
    ok = ok_run[1]
    honest = {k: v for k, v in ok.to_json().items() if k not in harness.PARENT_SAYS}
    assert harness.malformed(honest) == "", "a result the child wrote is in the harness's form"
    forged = {**honest, "runner": "forked", "budget_bytes": 1 << 40, "witness": {"driver": {"available": True}}}
    m = run(write(tmp_path, "train.py", FORGE.format(result=repr(forged))))
    assert m.status == "ok" and m.budget_bytes == BUDGET and m.runner == "fresh" and m.witness != forged["witness"]


def test_the_form_check_names_what_is_wrong_with_a_workload(ok_run):
    work = dict(ok_run[1].workload)
    base = {"status": "ok", "workload": work}
    assert harness.malformed(base) == ""
    assert "do not add up" in harness.malformed({**base, "workload": {**work, "optimizer_steps": work["optimizer_steps"] + 1}})
    assert "not a whole number" in harness.malformed({**base, "workload": {**work, "train_samples": 1.5}})
    assert "lists of numbers" in harness.malformed({**base, "workload": {**work, "losses": ["0.1"]}})
    assert "serving" in harness.malformed({**base, "workload": {**work, "serving": {"reserved": "x"}}})
    assert harness.malformed([]) == "it is not a JSON object"
