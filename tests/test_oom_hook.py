"""The OOM hook (oomlab.oom_hook): its folder, that the OOM always propagates, its excepthooks, several devices.

The CPU tests hand the hook a torch whose ``torch.cuda`` is :class:`FakeCuda`:
devices whose allocator statistics and snapshot are synthetic (the snapshot
tool's test builds them), and whose history recording is a list of calls. Its
``is_available()`` is False, so the holders' walk counts CPU tensors, as the
hunt's own tests do, and a real CPU training loop can be the leak. The GPU
tests run ``tests/oom_hook_example.py``, a training loop with a seeded leak,
under a memory cap in a fresh process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from oomlab.errors import OomLabError
from oomlab.oom_hook import hook as hook_module
from oomlab.oom_hook import install, oom_report, uninstall
from oomlab.oom_hook.report import device_snapshot, failed_device
from oomlab.tools.snapshot import analysis
from oomlab.units import MIB
from tests.test_tool_snapshot import TRAIN_PY, fragmented, healthy, live_heavy

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = Path(__file__).with_name("oom_hook_example.py")
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 32.00 MiB. GPU {gpu} has a total capacity of 139.81 GiB of which "
    "137.93 GiB is free. Of the allocated memory 1.02 GiB is allocated by PyTorch, and 96.00 MiB is reserved "
    "by PyTorch but unallocated. 1.25 GiB allowed."
)
DEVICE_FILES = {"snapshot.pickle", "fragmentation.json", "fragmentation.txt"}
REPORT_FILES = {"README.txt", "exception.txt", "finding.json", "finding.txt", "holders.json", "holders.txt"}


def oom(gpu: int = 0) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(OOM_MESSAGE.format(gpu=gpu))


def on_device(snapshot: dict, device: int, devices: int) -> dict:
    """A one-device synthetic snapshot moved to ``device`` of ``devices``, as _snapshot() lays several out."""
    for seg in snapshot["segments"]:
        seg["device"] = device
    traces = [[] for _ in range(devices)]
    traces[device] = snapshot["device_traces"][0]
    return {**snapshot, "device_traces": traces}


def merged(*snapshots: dict) -> dict:
    """One whole-process snapshot out of per-device ones (each from :func:`on_device`)."""
    traces = [max(column, key=len) for column in zip(*(s["device_traces"] for s in snapshots), strict=True)]
    return {**snapshots[0], "segments": [seg for s in snapshots for seg in s["segments"]], "device_traces": traces}


def used(reserved_peak: int, ooms: int = 0) -> dict:
    """memory_stats() of a device the allocator served."""
    return {
        "reserved_bytes.all.peak": reserved_peak,
        "reserved_bytes.all.current": reserved_peak,
        "allocated_bytes.all.current": reserved_peak // 2,
        "num_ooms": ooms,
    }


class FakeCuda:
    """``torch.cuda`` of a machine with ``count`` GPUs whose allocator state is given, and no real CUDA."""

    def __init__(self, snapshot, stats: dict[int, dict], count: int = 1, recording: bool = False, initialized: bool = True):
        self.snapshot, self.stats, self.count = snapshot, stats, count
        self.recording, self.initialized = recording, initialized
        self.asked_too_early = False  # real torch dies of a segfault when asked about history before CUDA starts
        self.calls: list[dict] = []  # each _record_memory_history call's arguments
        self.memory = types.SimpleNamespace(_record_memory_history=self._record, _snapshot=self._snapshot)

    def _record(self, enabled="all", context="all", stacks="all", max_entries=sys.maxsize):
        self.calls.append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries})
        self.recording = enabled is not None

    def _snapshot(self):
        if isinstance(self.snapshot, Exception):
            raise self.snapshot
        return self.snapshot

    def device_count(self):
        return self.count

    def is_initialized(self):
        return self.initialized

    def is_history_enabled(self):
        self.asked_too_early |= not self.initialized
        return self.recording

    def is_available(self):
        return False  # the holders' walk then counts CPU tensors

    def init(self):
        self.initialized = True

    def memory_stats(self, device=None):
        return self.stats.get(device, {})


class FakeTorch(types.ModuleType):
    """The real torch, but for ``torch.cuda`` (and whether history is on, which torch._C tells)."""

    def __init__(self, cuda: FakeCuda):
        super().__init__("torch")
        self.cuda = cuda
        self._C = types.SimpleNamespace(_cuda_isHistoryEnabled=cuda.is_history_enabled, _autograd=torch._C._autograd)

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture
def train_py(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN_PY)
    return path


@pytest.fixture
def fake(monkeypatch, train_py):
    """Install a fake GPU: ``fake(snapshot, stats, count)`` returns its FakeCuda."""

    def make(snapshot, stats=None, count=1, recording=False, initialized=True) -> FakeCuda:
        cuda = FakeCuda(snapshot, stats if stats is not None else {0: used(1 << 30, ooms=1)}, count, recording, initialized)
        monkeypatch.setattr(hook_module, "import_torch", lambda: FakeTorch(cuda))
        return cuda

    return make


def only_report(base: Path) -> Path:
    reports = sorted(base.iterdir())
    assert len(reports) == 1, reports
    return reports[0]


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def said(folder: Path) -> str:
    """What the report's error.txt says went wrong, for a failed assertion: empty where nothing did."""
    error = folder / "error.txt"
    return error.read_text(encoding="utf-8") if error.is_file() else ""


def step_hooks() -> int:
    from torch.optim.optimizer import _global_optimizer_post_hooks

    return len(_global_optimizer_post_hooks)


# --------------------------------------------------------------------------- the folder and the re-raise


def test_the_ranks_reports_are_read_side_by_side_the_first_to_fail_first(fake, train_py, tmp_path, monkeypatch):
    """Each rank's report is named by its rank (torchrun's RANK and WORLD_SIZE), so a job's reports in one folder can
    be told apart; ``oomlab diagnose FOLDER`` sets them side by side: which rank ran out of memory first, what differs."""
    from oomlab.cli import console
    from oomlab.cli.tools import show_oom_reports
    from oomlab.oom_hook.reports import find_reports, load_report, rank_rows

    base = tmp_path / "reports"
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank, reserved in (("3", 6 << 30), ("0", 1 << 30)):  # rank 3 fails first, with six times rank 0's memory
        fake(fragmented(train_py), {0: used(reserved, ooms=1)})
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(torch.OutOfMemoryError), oom_report(base, script=train_py):
            raise oom()
    folders = {re.sub(r"^\d{8}-\d{6}", "", folder.name): folder for folder in base.iterdir()}  # the second may turn
    assert sorted(folders) == [f"-rank0-pid{os.getpid()}", f"-rank3-pid{os.getpid()}"]
    assert "This process was rank 3 of 4" in (folders[f"-rank3-pid{os.getpid()}"] / "README.txt").read_text()
    finding = json.loads((folders[f"-rank3-pid{os.getpid()}"] / "finding.json").read_text())
    assert (finding["rank"], finding["world_size"]) == (3, 4) and finding["time"] > 0

    rows, notes = rank_rows([load_report(p) for p in find_reports(base)])
    assert [(r["rank"], r["status"]) for r in rows] == [(0, "oom"), (1, "unreported"), (2, "unreported"), (3, "oom")]
    assert rows[3]["ended_s"] == 0.0 and rows[0]["ended_s"] >= 0 and notes == []
    assert (rows[3]["peak_reserved"], rows[0]["peak_reserved"]) == (6 << 30, 1 << 30)

    with console.capture() as shown:
        assert show_oom_reports(base)
    said = " ".join(shown.get().split())
    assert "rank 3 ran out of memory" in said and "first; rank 0 ran out of memory" in said and " s after rank 3" in said
    assert "ranks 1, 2 wrote no OOM report" in said and "differs: peak reserved: rank 3 6,144.0 MiB, rank 0 1,024.0 MiB" in said
    assert f"Read rank 3 first: {base}" in said
    assert not show_oom_reports(tmp_path / "elsewhere")  # no report there: diagnose goes on to run a target

    monkeypatch.delenv("RANK")  # outside a launcher: no rank; its report shows its finding, and beside the ranks' it is left out
    with pytest.raises(torch.OutOfMemoryError), oom_report(base, script=train_py) as hook:
        raise oom()
    assert "rank" not in hook.last_report.name and "rank" not in (hook.last_report / "README.txt").read_text()
    assert rank_rows([load_report(p) for p in find_reports(base)])[1] == [
        "1 report(s) were not written under a launcher (no rank): left out"
    ]
    with console.capture() as shown:
        assert show_oom_reports(hook.last_report)
    assert (hook.last_report / "finding.txt").read_text().splitlines()[0] in shown.get()


def test_an_oom_inside_writes_every_file_then_propagates_unchanged(fake, train_py, tmp_path):
    snapshot = fragmented(train_py)
    cuda = fake(snapshot)
    hooks_before = step_hooks()
    err = oom()
    base = tmp_path / "reports"
    with pytest.raises(torch.OutOfMemoryError) as raised, oom_report(base, script=train_py) as hook:
        assert cuda.calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 100_000}]
        assert step_hooks() == hooks_before + 1  # the holders' step hook, while the hook is active
        raise err
    assert raised.value is err and str(raised.value) == OOM_MESSAGE.format(gpu=0)
    assert raised.traceback[-1].name == "test_an_oom_inside_writes_every_file_then_propagates_unchanged"
    assert cuda.calls[-1]["enabled"] is None and step_hooks() == hooks_before  # both stopped on the way out

    folder = only_report(base)
    assert folder.name.endswith(f"-pid{os.getpid()}") and hook.last_report == folder == err.oomlab_report
    assert files(folder) == REPORT_FILES | {f"cuda0/{name}" for name in DEVICE_FILES}, said(folder)
    # The device's report is the snapshot tool's analysis of that snapshot, and the pickle is for torch's viewer.
    report = json.loads((folder / "cuda0" / "fragmentation.json").read_text())
    expected = analysis.analyze(snapshot, script=str(train_py), budget_bytes=int(1.25 * 1024 * MIB), max_entries=100_000)
    assert (
        (report["kind"], report["headline"])
        == (expected["kind"], expected["headline"])
        == ("fragmentation", expected["headline"])
    )
    assert report["failed_here"] and report["oom"]["source"] == "trace" and report["allocator_stats"]["ooms"] == 1
    raw = (folder / "cuda0" / "snapshot.pickle").read_bytes()
    assert raw[:2] == b"\x80\x04"  # pickle protocol 4
    assert analysis.analyze(analysis.load_snapshot(folder / "cuda0" / "snapshot.pickle"))["totals"] == expected["totals"]
    assert str(tmp_path) not in raw.decode("latin-1")  # names relative to the script's folder: shareable
    assert "36 segments are pinned" in (folder / "cuda0" / "fragmentation.txt").read_text()

    finding = json.loads((folder / "finding.json").read_text())
    assert (finding["fix_first"], finding["found_by"], finding["failed_device"]) == ("fragmentation", "snapshot cuda0", 0)
    assert finding["headline"] == expected["headline"] and finding["history_recorded"]
    assert finding["exception"] == {"type": "OutOfMemoryError", "message": OOM_MESSAGE.format(gpu=0)}
    text = (folder / "finding.txt").read_text()
    assert "Fix first: fragmentation (found by snapshot cuda0)" in text and expected["headline"] in text
    readme = (folder / "README.txt").read_text()
    assert "https://pytorch.org/memory_viz" in readme and "cuda0/snapshot.pickle" in readme
    assert "error.txt" not in readme
    assert "OutOfMemoryError" in (folder / "exception.txt").read_text()


def test_no_report_without_an_oom_and_the_hook_is_removed_either_way(fake, tmp_path):
    cuda = fake(healthy(Path("train.py")))
    hooks_before = step_hooks()
    base = tmp_path / "reports"
    with oom_report(base):
        pass
    with pytest.raises(ValueError, match="not memory"), oom_report(base):
        raise ValueError("not memory")
    assert not base.exists()
    assert [c["enabled"] for c in cuda.calls] == ["all", None, "all", None] and step_hooks() == hooks_before


def test_an_error_raised_from_an_oom_is_reported_and_propagates_as_raised(fake, train_py, tmp_path):
    fake(live_heavy(train_py))
    base = tmp_path / "reports"
    with pytest.raises(RuntimeError, match="training failed") as raised, oom_report(base):
        try:
            raise oom()
        except torch.OutOfMemoryError as err:
            raise RuntimeError("training failed") from err
    assert type(raised.value) is RuntimeError
    finding = json.loads((only_report(base) / "finding.json").read_text())
    assert finding["exception"]["type"] == "OutOfMemoryError"


def test_a_decorator_and_nested_hooks_write_one_report(fake, train_py, tmp_path):
    fake(live_heavy(train_py))
    base = tmp_path / "reports"
    hook = oom_report(base)
    err = oom()

    @hook
    def train(depth):
        if depth:
            return train(depth - 1)  # the same hook, entered again while active
        raise err

    with pytest.raises(torch.OutOfMemoryError) as raised:
        train(2)
    assert raised.value is err
    assert only_report(base) == hook.last_report == err.oomlab_report


def test_a_failure_inside_the_report_is_written_down_and_the_oom_still_propagates(fake, tmp_path):
    fake(RuntimeError("the driver is gone"))
    base = tmp_path / "reports"
    err = oom()
    with pytest.raises(torch.OutOfMemoryError) as raised, oom_report(base):
        raise err
    assert raised.value is err
    folder = only_report(base)
    error = (folder / "error.txt").read_text()
    assert "taking the allocator snapshot: RuntimeError: the driver is gone" in error
    assert "error.txt" in (folder / "README.txt").read_text()
    finding = json.loads((folder / "finding.json").read_text())  # the holders still make a finding
    assert finding["devices"] == [] and list(finding["findings"]) == ["hunt"]


def test_even_an_interrupt_or_an_unwritable_folder_inside_the_hook_leaves_the_oom_to_propagate(
    fake, train_py, tmp_path, monkeypatch, capsys
):
    fake(fragmented(train_py))
    from oomlab.tools.hunt.probe import Probe

    def interrupted(self, exc, script_globals):
        raise KeyboardInterrupt

    monkeypatch.setattr(Probe, "analyse", interrupted)
    err = oom()
    with pytest.raises(torch.OutOfMemoryError) as raised, oom_report(tmp_path / "reports"):
        raise err
    assert raised.value is err
    assert "the OOM report failed: KeyboardInterrupt" in capsys.readouterr().err

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(torch.OutOfMemoryError), oom_report(blocker / "reports"):  # cannot be made: a file is in the way
        raise oom()
    assert "the OOM report could not be written under" in capsys.readouterr().err


# --------------------------------------------------------------------------- several devices


def test_one_folder_per_device_the_process_used_and_the_failed_device_first(fake, train_py, tmp_path):
    whole = merged(on_device(healthy(train_py), 0, 3), on_device(fragmented(train_py), 1, 3))
    stats = {0: used(300 * MIB), 1: used(1200 * MIB, ooms=1), 2: {}}  # cuda:2 never used
    fake(whole, stats, count=3)
    base = tmp_path / "reports"
    with pytest.raises(torch.OutOfMemoryError), oom_report(base, script=train_py):
        raise oom(gpu=1)
    folder = only_report(base)
    assert files(folder) == REPORT_FILES | {f"cuda{d}/{name}" for d in (0, 1) for name in DEVICE_FILES}, said(folder)
    r0 = json.loads((folder / "cuda0" / "fragmentation.json").read_text())
    r1 = json.loads((folder / "cuda1" / "fragmentation.json").read_text())
    assert (r0["device"], r0["failed_here"], r0["kind"], r0["oom"]["failed_request"]) == (0, False, "none", None)
    assert (r1["device"], r1["failed_here"], r1["kind"]) == (1, True, "fragmentation")
    assert r0["totals"]["segments"] == 7 and r1["totals"]["segments"] == 40  # each device's own segments
    finding = json.loads((folder / "finding.json").read_text())
    assert list(finding["findings"]) == ["snapshot cuda1", "snapshot cuda0", "hunt"]
    assert (finding["found_by"], finding["failed_device"], finding["devices"]) == ("snapshot cuda1", 1, [0, 1])

    with pytest.raises(torch.OutOfMemoryError), oom_report(tmp_path / "only", devices=[1]):
        raise oom(gpu=1)
    assert {p.name for p in only_report(tmp_path / "only").iterdir() if p.is_dir()} == {"cuda1"}
    with pytest.raises(OomLabError, match=r"devices \[5\] do not exist: torch sees 3"), oom_report(tmp_path, devices=[5]):
        pass


def test_a_device_snapshot_keeps_its_segments_and_its_history_at_its_index(train_py):
    whole = merged(on_device(healthy(train_py), 0, 2), on_device(fragmented(train_py), 1, 2))
    one = device_snapshot(whole, 1)
    assert {seg["device"] for seg in one["segments"]} == {1} and len(one["segments"]) == 40
    assert one["device_traces"][0] == [] and one["device_traces"][1] == whole["device_traces"][1]
    assert analysis.oom_events(one) and not analysis.oom_events(device_snapshot(whole, 0))


def test_the_failed_device_comes_from_the_history_else_the_message(train_py):
    with_history = {0: on_device(healthy(train_py), 0, 2), 1: on_device(fragmented(train_py), 1, 2)}
    assert failed_device(OOM_MESSAGE.format(gpu=0), with_history) == 1  # the history's "oom" entry wins
    no_history = {d: {**s, "device_traces": [[], []]} for d, s in with_history.items()}
    assert failed_device(OOM_MESSAGE.format(gpu=1), no_history) == 1
    assert failed_device("CUDA error: out of memory", no_history) is None
    assert failed_device("CUDA error: out of memory", {3: no_history[1]}) == 3


# --------------------------------------------------------------------------- history and options


def test_a_history_the_script_records_is_used_and_left_alone(fake, train_py, tmp_path):
    cuda = fake(fragmented(train_py), recording=True)
    with pytest.raises(torch.OutOfMemoryError), oom_report(tmp_path / "r"):
        raise oom()
    assert cuda.calls == [] and cuda.recording
    assert json.loads((only_report(tmp_path / "r") / "finding.json").read_text())["history_recorded"]


def test_a_hook_entered_before_cuda_starts_it_and_records_without_asking_torch_too_early(fake, train_py, tmp_path):
    cuda = fake(live_heavy(train_py), initialized=False)
    with pytest.raises(torch.OutOfMemoryError), oom_report(tmp_path / "r"):
        assert cuda.initialized and cuda.recording
        raise oom()
    assert not cuda.asked_too_early and [c["enabled"] for c in cuda.calls] == ["all", None]


def test_without_history_nothing_is_recorded_and_the_finding_says_so(fake, train_py, tmp_path):
    cuda = fake(live_heavy(train_py))
    with pytest.raises(torch.OutOfMemoryError), oom_report(tmp_path / "r", record_history=False, watch_steps=False):
        raise oom()
    assert cuda.calls == []
    folder = only_report(tmp_path / "r")
    assert not json.loads((folder / "finding.json").read_text())["history_recorded"]
    assert "Allocation history was not recorded" in (folder / "finding.txt").read_text()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"folder": 3}, "the folder must be a path"),
        ({"folder": ""}, "the folder must be a path"),
        ({"record_history": "yes"}, "record_history must be True or False"),
        ({"max_entries": 0}, "max_entries must be a positive whole number"),
        ({"max_entries": 1.5}, "max_entries must be a positive whole number"),
        ({"stacks": "cpp"}, "stacks must be one of 'python', 'all'"),
        ({"devices": []}, "devices must be CUDA device numbers"),
        ({"devices": ["cuda:0"]}, "devices must be CUDA device numbers"),
        ({"script": "no-such-train.py"}, "is not a file"),
    ],
)
def test_a_bad_option_is_one_clear_error_when_the_hook_is_made(options, says, tmp_path):
    folder = options.pop("folder", tmp_path / "r")
    with pytest.raises(OomLabError, match=says):
        oom_report(folder, **options)


def test_a_file_where_the_folder_should_be_is_refused_before_anything_is_installed(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    before = sys.excepthook
    with pytest.raises(OomLabError, match="is a file, not a folder"):
        install(blocker)
    assert sys.excepthook is before and not uninstall()


# --------------------------------------------------------------------------- the holders


def test_the_holders_name_a_graph_leak_from_the_failed_frames_and_it_is_fixed_first(fake, train_py, tmp_path):
    """A real (CPU) training loop that keeps every step's validation loss, graph and all: the hunt's graph-leak."""
    fake(live_heavy(train_py))  # the snapshot says "live memory": no structural finding of its own
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 64))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x_val = torch.randn(256, 64)
    base = tmp_path / "reports"

    def train(steps: int):
        monitored = []  # the leak: a forward pass per step that never runs backward
        for _ in range(steps):
            x = torch.randn(256, 64)
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitored.append(F.mse_loss(model(x_val), x_val))
        raise oom()

    with pytest.raises(torch.OutOfMemoryError), oom_report(base, script=__file__):
        train(6)
    folder = only_report(base)
    holders = json.loads((folder / "holders.json").read_text())
    assert holders["kind"] == "graph-leak" and "monitored" in holders["culprit"]
    assert holders["baseline_step"] == 1 and holders["optimizer_steps"] == 6  # watch_steps: the hunt's baseline
    assert "monitored" in (folder / "holders.txt").read_text()
    finding = json.loads((folder / "finding.json").read_text())
    assert (finding["fix_first"], finding["found_by"]) == ("graph-leak", "hunt")
    assert finding["findings"]["snapshot cuda0"]["kind"] == "live-memory"
    assert finding["failed_at"]["line"] == "raise oom()"


# --------------------------------------------------------------------------- install(): excepthooks


def test_install_reports_an_uncaught_oom_then_hands_it_to_the_previous_hooks(fake, train_py, tmp_path, monkeypatch):
    cuda = fake(live_heavy(train_py))
    seen_sys, seen_thread = [], []
    monkeypatch.setattr(sys, "excepthook", lambda *args: seen_sys.append(args))
    monkeypatch.setattr(threading, "excepthook", lambda args: seen_thread.append(args.exc_value))
    base = tmp_path / "reports"
    hook = install(base)
    try:
        assert cuda.calls[-1]["enabled"] == "all"
        err = oom()
        try:
            raise err
        except torch.OutOfMemoryError:
            sys.excepthook(*sys.exc_info())
        assert seen_sys == [(torch.OutOfMemoryError, err, err.__traceback__)]
        first = only_report(base)
        assert hook.last_report == first

        thread_err = oom()

        def worker():
            raise thread_err

        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert seen_thread == [thread_err] and thread_err.oomlab_report != first
        sys.excepthook(ValueError, ValueError("x"), None)  # not an OOM: handed on, nothing written
        assert len(list(base.iterdir())) == 2 and len(seen_sys) == 2
    finally:
        assert uninstall()
    assert cuda.calls[-1]["enabled"] is None and not uninstall()
    assert sys.excepthook.__name__ == "<lambda>" and threading.excepthook.__name__ == "<lambda>"


def test_uninstall_leaves_a_hook_that_wrapped_ours_and_ours_then_only_hands_on(fake, train_py, tmp_path, monkeypatch):
    fake(live_heavy(train_py))
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *args: seen.append(args[1]))
    install(tmp_path / "reports")
    ours = sys.excepthook

    def theirs(*args):
        ours(*args)

    sys.excepthook = theirs
    uninstall()
    assert sys.excepthook is theirs
    err = oom()
    sys.excepthook(type(err), err, None)
    assert seen == [err] and not (tmp_path / "reports").exists()


def test_an_uncaught_oom_in_a_script_that_installed_the_hook(tmp_path):
    """A real process, no fakes: the traceback prints as always, the exit status is 1, and the report is there."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """\
            import torch
            import oomlab.oom_hook

            oomlab.oom_hook.install("reports")
            kept = [torch.ones(1000) for _ in range(3)]
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.rstrip().endswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert 'File "' in done.stderr and 'train.py", line 6' in done.stderr
    assert "[oomlab] out of GPU memory: report in reports" in done.stderr
    folder = only_report(tmp_path / "reports")
    assert files(folder) == REPORT_FILES, said(folder)  # torch here has no CUDA device: no device folder
    assert "No CUDA device had allocator activity" in (folder / "README.txt").read_text()
    assert json.loads((folder / "finding.json").read_text())["failed_at"] == {
        "line_no": 6,
        "line": 'raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")',
    }


# --------------------------------------------------------------------------- on a GPU


def run_example(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    base = tmp_path / "reports"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), str(base), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "torch.OutOfMemoryError: CUDA out of memory" in done.stderr, done.stderr[-3000:]
    return done, only_report(base)


def assert_names_the_leak(folder: Path, devices: list[int]) -> dict:
    assert files(folder) == REPORT_FILES | {f"cuda{d}/{name}" for d in devices for name in DEVICE_FILES}, files(folder)
    finding = json.loads((folder / "finding.json").read_text())
    assert finding["fix_first"] == "graph-leak" and finding["found_by"] == "hunt", finding
    assert "`monitored`" in finding["headline"] and finding["history_recorded"]
    for d in devices:
        snapshot = analysis.load_snapshot(folder / f"cuda{d}" / "snapshot.pickle")
        assert {seg["device"] for seg in snapshot["segments"]} == {d}
        report = json.loads((folder / f"cuda{d}" / "fragmentation.json").read_text())
        # History was on: the live memory is named by the line of the example that keeps it.
        assert report["owners"][0]["site"].startswith("oom_hook_example.py:"), report["owners"][:3]
    return finding


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["with", "install"])
def test_on_a_gpu_the_example_reports_its_leak(tmp_path, how):
    _, folder = run_example(tmp_path, "--how", how)
    finding = assert_names_the_leak(folder, [0])
    assert finding["failed_device"] == 0 and not (folder / "error.txt").exists()
    report = json.loads((folder / "cuda0" / "fragmentation.json").read_text())
    assert report["failed_here"] and report["oom"]["source"] == "trace" and report["budget_bytes"]


@pytest.mark.gpu
def test_on_two_gpus_the_example_writes_one_report_per_device(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    _, folder = run_example(tmp_path, "--devices", "2")
    finding = assert_names_the_leak(folder, [0, 1])
    assert set(finding["findings"]) == {"snapshot cuda0", "snapshot cuda1", "hunt"}
    failed = json.loads((folder / f"cuda{finding['failed_device']}" / "fragmentation.json").read_text())
    assert failed["failed_here"] and failed["oom"]["failed_request"]


@pytest.mark.gpu
def test_on_a_gpu_the_step_hook_samples_memory_only_until_the_baseline(tmp_path):
    _, folder = run_example(tmp_path)
    holders = json.loads((folder / "holders.json").read_text())
    assert len(holders["steps"]) == 1 and holders["optimizer_steps"] > 10


def test_a_report_whose_finding_is_half_written_or_not_an_object_is_no_report(tmp_path):
    """The reader of reports (and of a rank's result while its job runs) takes a JSON object or nothing."""
    from oomlab.oom_hook.reports import load_report

    folder = tmp_path / "20261205-000000-rank0-pid1"
    folder.mkdir()
    for text in ('{"kind": "fragmen', "[1, 2]", ""):
        (folder / "finding.json").write_text(text, encoding="utf-8")
        assert load_report(folder) is None, text
    assert load_report(tmp_path / "missing") is None
