"""The profiling probe on CPU: the peak's operator and line, top operators, timeline, fallback, drawing.

The probe runs in this process around a small training script written to a
temporary file and run with ``runpy`` (as the measuring child does), so the
profiler's Python frames point at that file. Its loss builds an explicit
one-hot of the targets, a (256 x 4096) int64 tensor copied to float: 12 MiB
on one line, the largest thing the step ever holds.

What CPU cannot show (the GPU run must confirm it): CUDA allocations and
``device_memory_usage`` per operator, allocations made on autograd's device
thread (found through the Python call covering them in time, ``site_via ==
"time"``), and a real ``torch.cuda.OutOfMemoryError`` raised by the allocator.
"""

from __future__ import annotations

import io
import json
import runpy
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from oomlab.oom import parse_message  # noqa: E402
from oomlab.tools.profile import analysis, categories, events, present, probe  # noqa: E402
from oomlab.units import GIB, MIB  # noqa: E402

VOCAB, BATCH = 4096, 256
ONE_HOT_BYTES = BATCH * VOCAB * 8 + BATCH * VOCAB * 4  # the int64 one-hot and its float copy

SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, BATCH = 4096, 256
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, VOCAB)).to(DEVICE)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)


def loss_fn(logits, targets, step):
    log_probs = F.log_softmax(logits, dim=-1)
    one_hot = F.one_hot(targets, VOCAB).float()
    if step == FAIL_AT:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 MiB")
    return -(one_hot * log_probs).sum(dim=-1).mean()


for step in range(3):
    inputs = torch.randint(VOCAB, (BATCH,), device=DEVICE)
    targets = torch.randint(VOCAB, (BATCH,), device=DEVICE)
    loss = loss_fn(model(inputs), targets, step)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
"""
ONE_HOT_LINE = 13  # the line of `one_hot = F.one_hot(targets, VOCAB).float()` in SCRIPT


def write_script(folder: Path, fail_at: int | None = None, device: str = "cpu") -> Path:
    path = folder / "train_small.py"
    source = textwrap.dedent(SCRIPT).lstrip("\n").replace("FAIL_AT", repr(fail_at)).replace("DEVICE", repr(device))
    path.write_text(source, encoding="utf-8")
    assert source.splitlines()[ONE_HOT_LINE - 1].strip() == "one_hot = F.one_hot(targets, VOCAB).float()"
    return path


def profiled(folder: Path, fail_at: int | None = None, device: str = "cpu", **options) -> dict:
    """Run the script between the probe's start and finish, as the measuring child does; return profile.json."""
    script = write_script(folder, fail_at, device)
    out = folder / "out"
    tool = probe.Probe(torch, out, {"script": str(script), **options})
    tool.start()
    try:
        globals_ = runpy.run_path(str(script), run_name="__main__")
    except BaseException as exc:
        tool.finish(exc, None)
    else:
        tool.finish(None, globals_)
    return json.loads((out / "profile.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    return profiled(tmp_path_factory.mktemp("profile"), budget_bytes=40 * MIB)


def test_peak_points_at_the_one_hot_line(result):
    assert "error" not in result, result.get("error_traceback")
    assert result["timing"]["script_s"] > 0 and result["timing"]["analysis_s"] > 0  # where the tool's time went
    peak = result["peak"]
    assert (peak["file"], peak["line"]) == ("train_small.py", ONE_HOT_LINE)
    assert peak["text"] == "one_hot = F.one_hot(targets, VOCAB).float()"
    assert peak["function"] == "loss_fn"
    assert peak["site_via"] == "stack"
    # The allocation that makes the peak is the float copy (.float() is aten::to) of the one-hot.
    assert peak["op"] in ("aten::to", "aten::one_hot")
    # Both copies of the one-hot are live at the peak, and are what the line costs.
    assert peak["line_bytes"] == ONE_HOT_BYTES
    assert result["culprit_bytes"] == ONE_HOT_BYTES
    assert peak["by_line"][0]["line"] == ONE_HOT_LINE


MODEL_FILE = """
import torch.nn.functional as F

VOCAB = 4096


def loss_fn(logits, targets):
    log_probs = F.log_softmax(logits, dim=-1)
    one_hot = F.one_hot(targets, VOCAB).float()
    return -(one_hot * log_probs).sum(dim=-1).mean()
"""
MODEL_ONE_HOT_LINE = 8


def test_a_peak_in_a_file_beside_the_script_is_named_there_with_the_scripts_line_that_called_it(tmp_path):
    """A model file beside the script is the user's code too: its line allocated, the script's line called it."""
    (tmp_path / "losses.py").write_text(textwrap.dedent(MODEL_FILE).lstrip("\n"), encoding="utf-8")
    assert MODEL_FILE.lstrip("\n").splitlines()[MODEL_ONE_HOT_LINE - 1].strip().startswith("one_hot = ")
    source = textwrap.dedent(SCRIPT).lstrip("\n").replace("FAIL_AT", "None").replace("DEVICE", "'cpu'")
    source = "import sys, os\nsys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\nimport losses\n" + source
    source = source.replace("loss = loss_fn(model(inputs), targets, step)", "loss = losses.loss_fn(model(inputs), targets)")
    script = tmp_path / "train_small.py"
    script.write_text(source, encoding="utf-8")
    caller_line = source.splitlines().index("    loss = losses.loss_fn(model(inputs), targets)") + 1
    out = tmp_path / "out"
    tool = probe.Probe(torch, out, {"script": str(script)})
    tool.start()
    try:
        tool.finish(None, runpy.run_path(str(script), run_name="__main__"))
    finally:
        sys.path[:] = [p for p in sys.path if p != str(tmp_path)]
        sys.modules.pop("losses", None)
    peak = json.loads((out / "profile.json").read_text(encoding="utf-8"))["peak"]
    assert (peak["file"], peak["line"], peak["function"]) == ("losses.py", MODEL_ONE_HOT_LINE, "loss_fn")
    assert (peak["caller"]["file"], peak["caller"]["line"]) == ("train_small.py", caller_line)
    sentence = analysis.headline({"peak": peak})
    assert (
        f"at losses.py:{MODEL_ONE_HOT_LINE} (one_hot = F.one_hot(targets, VOCAB).float()), called from train_small.py:{caller_line}"
        in sentence
    )


def test_peak_is_transient_and_the_headline_names_it(result):
    assert result["kind"] == "transient-peak"
    peak = result["peak"]
    assert peak["kind_basis"] == "level at the step end"
    assert peak["freed_after_peak_bytes"] >= ONE_HOT_BYTES
    assert f"train_small.py:{ONE_HOT_LINE}" in result["headline"]
    assert "12.0 MiB" in result["headline"]
    assert result["tool"] == "profile" and isinstance(result["culprit_bytes"], int)
    # The line's bytes are mostly aten::one_hot's (int64; .float() copies it to half the size): the advice fits it.
    assert peak["culprit"]["op"] == "aten::one_hot"
    assert result["advice"].startswith("The peak is a one-hot matrix of the targets: F.cross_entropy takes the class")


def peak_of(op: str) -> dict:
    line = {"file": "model.py", "line": 188, "text": "logits = self.lm_head(x)", "bytes": 1178 * MIB, "op": op}
    return {"kind": "transient-peak", "peak": {"op": "aten::layer_norm", "culprit": line}, "headline": "the peak"}


def test_the_advice_fits_the_operator_that_made_the_peaks_bytes_not_the_one_that_tipped_it():
    from oomlab.steps import advice as structural_advice
    from oomlab.steps import fix_first

    logits = analysis.advice(peak_of("aten::mm"))
    assert "logits" in logits and "chunks of the positions" in logits and "class indices" not in logits
    assert analysis.advice(peak_of("aten::native_layer_norm")) == structural_advice("transient-peak")  # none fits better
    assert analysis.advice({"kind": "steady"}) is None
    verdict = fix_first({"profile": {**peak_of("aten::mm"), "advice": logits}, "hunt": {"kind": "none", "headline": ""}})
    assert verdict["fix_first"] == "transient-peak" and verdict["advice"] == logits


def test_top_ops_contain_the_one_hot(result):
    ops = {row["op"]: row for row in result["top_ops"]}
    assert "aten::one_hot" in ops, list(ops)
    one_hot = ops["aten::one_hot"]
    assert one_hot["calls"] == 3
    assert one_hot["largest_call_bytes"] == BATCH * VOCAB * 8
    assert one_hot["input_shapes"][0] == [BATCH]
    # The one-hot's bytes are credited to aten::one_hot, not to the aten::empty it calls to allocate them.
    for allocator_op in ("aten::empty", "aten::empty_strided", "aten::zeros"):
        assert ops.get(allocator_op, {"bytes": 0})["bytes"] < BATCH * VOCAB * 8
    assert len(result["top_ops"]) <= events.TOP_OPS


def test_timeline_has_categories_and_holds_the_peak(result):
    timeline = result["timeline"]
    assert result["memory_model"]["available"] is True
    assert timeline["source"] == "categories"
    assert {"parameters", "optimizer_state"} <= set(timeline["bytes"])
    n = len(timeline["times_ms"])
    assert 0 < n <= analysis.MAX_POINTS
    assert all(len(values) == n for values in timeline["bytes"].values())
    assert max(timeline["total"]) == result["peak"]["total_bytes"]
    assert len(timeline["step_ends_ms"]) == result["steps_seen"] == 3
    by_category = result["peak"]["by_category"]
    assert sum(by_category.values()) == result["peak"]["total_bytes"]
    # One step has run: the first step's parameters, gradients and AdamW state are live.
    assert by_category["gradients"] == by_category["parameters"]
    assert by_category["optimizer_state"] >= 2 * by_category["parameters"]


def test_result_is_json_and_renders(result):
    json.dumps(result)
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    for item in present.render(result):
        console.print(item)
    text = console.file.getvalue()
    assert "aten::one_hot" in text
    assert f"train_small.py:{ONE_HOT_LINE}" in text
    assert "optimizer state" in text


def test_draw_writes_a_png(result, tmp_path):
    paths = present.draw(result, tmp_path)
    assert paths == [tmp_path / "profile.png"]
    data = paths[0].read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_without_the_memory_model_tensors_are_named_by_their_lifetime(tmp_path, monkeypatch):
    from torch.profiler import _memory_profiler

    def unavailable(*args, **kwargs):
        raise RuntimeError("memory model unavailable")

    monkeypatch.setattr(_memory_profiler, "MemoryProfile", unavailable)
    result = profiled(tmp_path)
    assert "error" not in result, result.get("error_traceback")
    assert result["memory_model"]["available"] is False
    assert result["memory_model"]["error"] == "RuntimeError: memory model unavailable"
    assert any("not told apart" in note for note in result["notes"])
    assert any("named by when they lived" in note for note in result["notes"])
    timeline = result["timeline"]
    assert timeline["source"] == "categories"
    assert {"activations", "temporaries", "autograd_detail"} <= set(timeline["bytes"])
    assert "aten::one_hot" in {row["op"] for row in result["top_ops"]}
    # The allocation events alone still find the line, and the peak's parts by lifetime:
    # the int64 one-hot is freed as soon as it is copied (a temporary), the float copy
    # is saved for backward (an activation).
    peak = result["peak"]
    assert peak["line"] == ONE_HOT_LINE
    assert peak["by_category"]["temporaries"] >= BATCH * VOCAB * 8
    assert peak["by_category"]["activations"] >= BATCH * VOCAB * 4
    assert sum(peak["by_category"].values()) == peak["total_bytes"]
    assert result["kind"] == "transient-peak"
    assert present.draw(result, tmp_path)[0].stat().st_size > 0


def test_in_a_failed_step_without_the_memory_model_tensors_are_named_as_in_the_steps_before(tmp_path, monkeypatch):
    # On CUDA the memory model names few forward tensors; a step that failed has no backward to tell by.
    monkeypatch.setattr(categories, "model_categories", lambda prof: lambda fields: None)
    result = profiled(tmp_path, fail_at=1)
    assert "error" not in result, result.get("error_traceback")
    assert result["memory_model"]["bytes_categorized_by"]["earlier_steps"] >= BATCH * VOCAB * 8
    peak = result["peak"]
    assert peak["in_failed_step"] and peak["line"] == ONE_HOT_LINE
    assert peak["by_category"]["temporaries"] >= BATCH * VOCAB * 8  # the int64 one-hot, as in step 1
    assert any("as in the steps before it" in note for note in result["notes"])


def test_a_failed_run_is_profiled_up_to_the_failure(tmp_path):
    result = profiled(tmp_path, fail_at=1)
    assert "error" not in result, result.get("error_traceback")
    assert result["failed"] and result["oom"]
    assert result["failed_at"]["line"] == ONE_HOT_LINE + 2
    peak = result["peak"]
    assert peak["in_failed_step"] is True
    assert peak["level_after_step_bytes"] is None
    assert peak["time_ms"] > result["timeline"]["step_ends_ms"][-1]  # in the step that failed
    assert peak["line"] == ONE_HOT_LINE
    assert peak["carried_from_earlier_forwards_bytes"] is None  # one forward pass in the failed step
    assert result["kind"] == "transient-peak"
    assert result["failure"]["request_bytes"] == 8 * MIB
    assert result["failure"]["live_bytes"] >= peak["total_bytes"] - 2 * MIB  # the one-hot copies still live
    assert result["headline"].startswith(
        f"the run ran out of memory at train_small.py:{ONE_HOT_LINE + 2} asking for 8.0 MiB more"
    )


EVAL_SCRIPT = """
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)


def get_batch():
    x = torch.randn(512, 256)
    return x, (x.sum(1) > 0).long()


def evaluate():
    losses = []
    for i in range(6):
        x, y = get_batch()
        if i == 5:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        losses.append(F.cross_entropy(model(x), y))
    return torch.stack(losses).mean().item()


for step in range(2):
    x, y = get_batch()
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
evaluate()
"""
APPEND_LINE = 21  # losses.append(F.cross_entropy(model(x), y))


def test_memory_kept_across_forward_passes_is_steady_and_blames_the_list(tmp_path):
    script = tmp_path / "evaluate_small.py"
    script.write_text(textwrap.dedent(EVAL_SCRIPT).lstrip("\n"), encoding="utf-8")
    assert "losses.append" in script.read_text().splitlines()[APPEND_LINE - 1]
    out = tmp_path / "out"
    tool = probe.Probe(torch, out, {"script": str(script)})
    tool.start()
    try:
        runpy.run_path(str(script), run_name="__main__")
    except torch.cuda.OutOfMemoryError as exc:
        tool.finish(exc, None)
    result = json.loads((out / "profile.json").read_text(encoding="utf-8"))
    assert "error" not in result, result.get("error_traceback")
    peak = result["peak"]
    assert peak["in_failed_step"] and peak["time_ms"] > result["timeline"]["step_ends_ms"][-1]
    # Five evaluation batches each keep a (512 x 1024) activation and more through their loss's graph.
    assert peak["carried_from_earlier_forwards_bytes"] >= 4 * 512 * 1024 * 4
    assert result["kind"] == "steady"
    assert "accumulates" in peak["kind_basis"]
    assert (peak["culprit"]["file"], peak["culprit"]["line"]) == ("evaluate_small.py", APPEND_LINE)
    assert result["culprit_bytes"] == peak["culprit"]["bytes"] >= 5 * 512 * 1024 * 4
    assert f"evaluate_small.py:{APPEND_LINE}" in result["headline"]


def test_max_steps_stops_profiling(tmp_path):
    result = profiled(tmp_path, max_steps=1)
    assert "error" not in result, result.get("error_traceback")
    assert result["profiled_steps"] == 1
    assert result["stopped_early"] is True
    assert result["steps_seen"] <= 1
    assert {row["op"]: row for row in result["top_ops"]}["aten::one_hot"]["calls"] == 1
    assert result["headline"].startswith("in the 1 profiled optimizer steps the peak")


def test_a_failure_after_the_profiled_steps_is_named_not_analysed_as_a_step(tmp_path):
    result = profiled(tmp_path, fail_at=2, max_steps=1)
    assert "error" not in result, result.get("error_traceback")
    assert result["stopped_early"] and result["oom"]
    assert result["unprofiled_failure"]["after_steps"] == 2  # two steps ended; the third failed, unprofiled
    assert "CUDA out of memory" in result["unprofiled_failure"]["message"]
    assert result["failed_at"]["line"] == ONE_HOT_LINE + 2
    assert result["peak"]["in_failed_step"] is False  # the peak is the profiled step's, which ended
    assert result["peak"]["line"] == ONE_HOT_LINE
    assert f"ran out of memory at train_small.py:{ONE_HOT_LINE + 2} after 2 steps" in result["headline"]
    assert "--all-steps" in result["headline"]


def test_finish_never_raises(tmp_path):
    probe.Probe(torch, tmp_path, {}).finish(None, None)
    result = json.loads((tmp_path / "profile.json").read_text(encoding="utf-8"))
    assert "start() was not called" in result["error"]
    assert result["timing"]["script_s"] is None and result["timing"]["analysis_s"] >= 0
    assert result["tool"] == "profile" and result["culprit_bytes"] == 0 and result["headline"]
    assert present.draw(result, tmp_path) == []


@pytest.mark.gpu
def test_on_the_gpu_the_peak_and_top_ops_are_device_memory(tmp_path):
    result = profiled(tmp_path, device="cuda", budget_bytes=GIB)
    assert "error" not in result, result.get("error_traceback")
    assert result["device"].startswith("cuda")
    assert result["memory_model"]["available"] is True
    peak = result["peak"]
    assert (peak["file"], peak["line"]) == ("train_small.py", ONE_HOT_LINE)
    assert peak["line_bytes"] >= ONE_HOT_BYTES
    # Not the kind: at this size the cuBLAS workspace, kept after the step, is as large as the peak.
    assert peak["freed_after_peak_bytes"] >= ONE_HOT_BYTES
    one_hot = {row["op"]: row for row in result["top_ops"]}["aten::one_hot"]
    assert one_hot["largest_call_bytes"] >= BATCH * VOCAB * 8  # device bytes, not host bytes
    # The memory model leaves most CUDA forward tensors unnamed; their lifetimes name them.
    by_category = peak["by_category"]
    assert by_category.get("unknown", 0) * 10 < peak["total_bytes"], by_category
    # The int64 one-hot, freed once copied: a temporary, or an input (it is made from the targets).
    assert by_category.get("temporaries", 0) + by_category.get("inputs", 0) >= BATCH * VOCAB * 8, by_category
    # cuBLAS's workspace for backward's thread, made in backward and never freed, is no gradient.
    assert by_category.get("gradients", 0) < 2 * by_category["parameters"], by_category
    assert present.draw(result, tmp_path)[0].stat().st_size > 0


# --------------------------------------------------------------------------- pure functions


def test_coalesce_applies_simultaneous_events_together():
    times, levels = analysis.coalesce(
        [(5, "activations", 10), (1, "parameters", 4), (5, "activations", -10), (5, "gradients", 3)]
    )
    assert times == [1, 5]
    assert levels["parameters"] == [4, 4]
    assert levels["activations"] == [0, 0]  # created and freed at the same instant: no spike
    assert analysis.total_levels(levels) == [4, 7]


def test_peak_index_within_the_failed_step():
    times, totals = [1, 2, 3, 4], [1, 9, 2, 5]
    assert analysis.peak_index(times, totals) == 1
    assert analysis.peak_index(times, totals, after=2) == 3


def test_level_after_and_classify():
    times, totals = [10, 20, 30, 40], [4, 20, 5, 6]
    assert analysis.level_after(times, totals, [35], 20, failed=False) == 5
    assert analysis.level_after(times, totals, [], 20, failed=False) == 6
    assert analysis.level_after(times, totals, [15], 20, failed=True) is None
    assert analysis.classify(20, after=5) == ("transient-peak", "level at the step end")
    assert analysis.classify(20, after=15)[0] == "steady"
    assert analysis.classify(20, before=4)[0] == "transient-peak"
    first_step = {"parameters": 12, "gradients": 0, "activations": 8}
    assert analysis.classify(20, by_category=first_step, categorized=True)[0] == "steady"
    # The failed step added 16; earlier forward passes of it left 4 live (a quarter): accumulating.
    assert analysis.classify(20, before=4, carried=4)[0] == "steady"
    assert analysis.classify(20, before=4, carried=3)[0] == "transient-peak"
    assert analysis.classify(20)[0] == "steady"


def test_carried_bytes_counts_what_finished_forward_passes_left_live():
    forwards = [(10, 20), (30, 40), (50, 60)]
    live = {0: 100, 1: 7, 2: 50, 3: 1000}
    allocated_at = {0: 15, 1: 25, 2: 35, 3: 55}  # in pass 1, between passes, in pass 2, in the current pass
    assert analysis.carried_bytes(forwards, live, allocated_at, None, 58) == 150
    assert analysis.carried_bytes(forwards, live, allocated_at, 28, 58) == 50  # the window starts after pass 1
    assert analysis.carried_bytes(forwards, live, allocated_at, 45, 58) is None  # one pass: nothing to compare


def test_covering_call_finds_the_innermost_script_call_running_at_a_time():
    script = {"script": True, "line": 44}
    library = {"script": False, "line": 7}
    calls = [(0, 100, {"script": True, "line": 1}), (10, 50, script), (20, 30, library), (60, 70, {"script": True, "line": 60})]
    assert analysis.covering_call(calls, 25) is script  # the library call is innermost, the script's call is preferred
    assert analysis.covering_call(calls, 40) is script
    assert analysis.covering_call(calls, 55)["line"] == 1
    assert analysis.covering_call(calls, 200) is None
    assert analysis.covering_call([(20, 30, library)], 25) is library


def test_failure_point_is_the_last_allocation_not_the_unwound_level():
    # 10 live, +100 (the last allocation before the OOM), then the exception frees it while unwinding.
    allocs = [(1, 10, 0xA, "cuda:0", 10), (2, 100, 0xB, "cuda:0", 110), (3, -100, 0xB, "cuda:0", 10)]
    times, totals = [1, 2, 3], [10, 110, 10]
    assert analysis.failure_point(allocs, times, totals) == (2, 110)
    no_total = [(t, size, ptr, dev, 0) for t, size, ptr, dev, _ in allocs]
    assert analysis.failure_point(no_total, times, totals) == (2, 110)
    assert analysis.failure_point([], times, totals) == (3, 10)


def test_the_failed_request_is_read_from_the_oom_message():
    message = "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 139.81 GiB"
    assert parse_message(message)["request"] == 512 * MIB
    assert parse_message("Tried to allocate 1.50 GiB")["request"] == 3 * GIB // 2
    assert parse_message("something else")["request"] is None


def test_choose_culprit_prefers_the_peak_line_unless_another_holds_far_more():
    site = {"file": "t.py", "line": 5, "text": "a", "line_bytes": 60}
    rows = [{"file": "t.py", "line": 9, "text": "b", "bytes": 100}, {"file": "t.py", "line": 5, "text": "a", "bytes": 60}]
    assert analysis.choose_culprit(site, rows)["line"] == 5
    assert analysis.choose_culprit({**site, "line_bytes": 40}, rows)["line"] == 9
    assert analysis.choose_culprit({**site, "line": None, "line_bytes": 0}, rows)["line"] == 9


def test_headline_of_an_oom_that_fits_the_budget_points_at_the_cache():
    result = {
        "oom": True,
        "budget_bytes": 1152 * MIB,
        "failed_at": {"file": "train.py", "line": 31, "text": "features.append(encoder(x))"},
        "failure": {"live_bytes": 792 * MIB, "request_bytes": 20 * MIB},
        "peak": {
            "total_bytes": 792 * MIB,
            "op": "aten::gelu",
            "file": "train.py",
            "line": 31,
            "text": "features.append(encoder(x))",
            "culprit": {"file": "train.py", "line": 31, "text": "features.append(encoder(x))", "bytes": 717 * MIB},
            "by_category": {"parameters": 56 * MIB, "unknown": 700 * MIB},
        },
    }
    text = analysis.headline(result)
    assert text.startswith("the run ran out of memory at train.py:31 asking for 20.0 MiB more with 792.0 MiB live")
    assert "717.0 MiB" in text and "fragmentation" in text and "unknown" not in text


def test_live_allocations_match_frees_by_address():
    allocs = [(1, 100, 0xA), (2, 50, 0xB), (3, -100, 0xA), (4, 30, 0xA), (5, -7, 0xC)]
    assert analysis.live_allocations(allocs, 2) == {0: 100, 1: 50}
    assert analysis.live_allocations(allocs, 5) == {1: 50, 3: 30}


def test_downsample_keeps_the_peak_and_the_troughs():
    n = 10_001
    times = list(range(0, n * 1000, 1000))
    totals = [(i % 7) * 10 for i in range(n)]
    totals[6_543] = 1_000
    levels = {c: [0] * n for c in analysis.CATEGORIES}
    levels["activations"] = totals
    small = analysis.downsample(times, levels, times[0], 2000)
    assert len(small["times_ms"]) <= 2000
    assert max(small["total"]) == 1_000
    assert small["times_ms"][small["total"].index(1_000)] == 6_543 * 1000 / 1e6
    assert min(small["total"]) == 0
    assert set(small["bytes"]) == {"activations"}


def test_lifetime_category():
    backward, step_end = [100], [150]
    cases = {
        ("backward", 120, 130): "autograd_detail",
        ("backward", 120, None): "kept",  # a .grad or a cuBLAS workspace outlives the step
        ("optimizer", 140, 145): "temporaries",
        ("optimizer", 140, 200): "optimizer_state",
        ("forward", 10, 20): "temporaries",  # freed before backward starts
        ("forward", 10, 120): "activations",  # freed by backward, within its step
        ("forward", 10, None): "kept",  # outlives its step
        ("forward", 10, 400): "kept",
        ("forward", 200, 250): "temporaries",  # no backward after it, freed before the end
        ("forward", 200, None): None,  # no backward after it, still live at the end: its fate is unknown
    }
    for (phase, t, freed), expected in cases.items():
        assert analysis.lifetime_category(phase, t, freed, backward, step_end, t_end=300) == expected, (phase, t, freed)


def test_free_times_pair_frees_with_allocations_by_address():
    allocs = [(1, 10, 0xA), (2, 5, 0xB), (3, -10, 0xA), (4, 7, 0xA), (5, -3, 0xC)]
    assert analysis.free_times(allocs) == {0: 3}


def test_peak_window_enlarges_a_short_step_only():
    result = {
        "timeline": {"times_ms": [0.0, 300.0, 310.0, 320.0], "step_ends_ms": [300.0]},
        "peak": {"time_ms": 315.0},
        "failure": {"time_ms": 320.0},
    }
    start, end = present.peak_window(result)
    assert start < 300.0 < 320.0 < end < 330.0
    result["timeline"]["step_ends_ms"] = [10.0]
    assert present.peak_window(result) is None  # the step is most of the run


def test_code_run_while_profiling_stays_alive_until_the_events_are_parsed(tmp_path):
    """The profiler names Python calls from their code objects only when its events are parsed, after the script;
    code that exec() ran and dropped (the script's, an imported module's) must still be there, or a name comes back
    as freed memory and the operator table is lost."""
    import gc
    import weakref

    tool = probe.Probe(torch, tmp_path / "out", {"script": str(write_script(tmp_path))})
    tool.start()
    code = compile("x = 1", str(tmp_path / "imported_while_profiling.py"), "exec")
    exec(code, {})  # as runpy runs a script and importlib a module's body
    alive = weakref.ref(code)
    del code
    gc.collect()
    assert alive() is not None, "the code was dropped while the profiler still names its calls"
    tool.finish(None, {})
    gc.collect()
    assert alive() is None, "the probe keeps code alive after it is done"


def test_the_whole_run_panel_starts_where_memory_does_not_at_a_lone_early_allocation():
    """A first small allocation seconds before the run gets going would start the axis with a long, empty stretch."""
    from oomlab.tools.profile.present import _first_memory_ms

    times = [0.0, 2600.0, 2700.0, 2800.0, 3600.0]
    series = [[1, 1, 50, 100, 100], [0, 0, 10, 20, 0]]  # bytes per category at each time
    start = _first_memory_ms(times, series)
    assert 2600.0 - 0.02 * 3600 <= start < 2700.0
    assert _first_memory_ms(times, [[0] * 5]) == 0.0  # nothing drawn: the axis starts where the timeline does
    assert _first_memory_ms([5.0, 6.0], [[10, 10]]) == 5.0
