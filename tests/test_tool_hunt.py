"""The hunt for memory that outlives a step, on CPU tensors (``device_type="cpu"``).

Each test builds one way memory stays alive (a list of losses with their
graphs, a hook's closure, a stored exception, a reference cycle) and checks
that the walk finds it, counts it once, and names the right holder.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import inspect
import json
import re
import runpy
import sys
import textwrap
import types
import weakref

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from oomlab.tools.hunt import analysis, backsearch, inflight, present, probe  # noqa: E402
from oomlab.tools.hunt import holders as hunt_holders  # noqa: E402
from oomlab.tools.hunt import paths as hunt_paths  # noqa: E402
from oomlab.tools.hunt import roots as hunt_roots  # noqa: E402
from oomlab.tools.hunt import state as hunt_state  # noqa: E402
from oomlab.tools.hunt import walk as hunt_walk  # noqa: E402
from oomlab.units import MIB  # noqa: E402

B, D_IN, D_HIDDEN = 64, 32, 256
IN = inflight.IN_FLIGHT


def make_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.GELU(), nn.Linear(D_HIDDEN, D_HIDDEN), nn.GELU(), nn.Linear(D_HIDDEN, 4))


def storage_bytes(*tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def by_name(holders, name):
    return next(h for h in holders if h["name"] == name)


def walk(roots, **kwargs):
    kwargs.setdefault("exclude", hunt_state.model_state_ids(list(roots.values())))
    kwargs.setdefault("cycles", False)
    return hunt_holders.find_holders(roots, device_type="cpu", **kwargs)


LOSSES = "evaluate() local 'losses' (train.py:40)"


def test_losses_kept_without_no_grad_keep_their_graphs_saved_activations():
    model = make_model()
    losses = [model(torch.randn(B, D_IN)).logsumexp(dim=1).mean() for _ in range(3)]
    holders = walk({LOSSES: losses, "global 'model'": model})

    held = by_name(holders, LOSSES)
    # Each forward saved at least its two (B x D_HIDDEN) GELU inputs; the losses themselves are scalars.
    assert held["graph_bytes"] >= 3 * 2 * B * D_HIDDEN * 4
    assert held["graph_bytes"] > held["direct_bytes"] == storage_bytes(*losses)
    assert held["tensors"] == 3 and held["graphs"] == 3
    assert held["largest_path"].startswith("losses[") and "._saved_" in held["largest_path"]
    assert held["state_bytes"] == 0  # the weights the graphs saved belong to the model

    result = analysis.summarize(holders, min_bytes=1024)
    assert result["kind"] == "graph-leak"
    assert result["culprit"] == LOSSES
    assert result["culprit_bytes"] == held["bytes"]
    assert "list `losses` (local of evaluate() at train.py:40) holds 3 tensors" in result["headline"]


def test_losses_kept_after_backward_hold_no_graph_bytes():
    """backward() frees the saved tensors (field notes, section 4): the graph nodes remain, empty."""
    model = make_model()
    losses = []
    for _ in range(3):
        loss = model(torch.randn(B, D_IN)).logsumexp(dim=1).mean()
        loss.backward()
        losses.append(loss)
    held = by_name(walk({LOSSES: losses, "global 'model'": model}), LOSSES)
    assert held["graph_bytes"] == 0 and held["graphs"] == 0
    assert held["bytes"] == storage_bytes(*losses)


def test_item_floats_hold_nothing():
    model = make_model()
    losses = [model(torch.randn(B, D_IN)).mean().item() for _ in range(3)]
    holders = walk({LOSSES: losses})
    assert all(h["name"] != LOSSES for h in holders)


def test_forward_hook_appending_to_a_closure_list_is_found_through_the_module():
    model = make_model()
    kept = []

    def keep_output(module, args, output):
        kept.append(output.detach())

    model[2].register_forward_hook(keep_output)
    for _ in range(2):
        model(torch.randn(B, D_IN))
    held = by_name(walk({"global 'model'": model}), "global 'model'")
    assert held["bytes"] - held["state_bytes"] == storage_bytes(*kept)
    assert held["largest_path"].startswith("model.2._forward_hooks[")
    assert "__closure__['kept']" in held["largest_path"]


def test_global_module_hooks_are_roots():
    kept = []

    def keep_output(module, args, output):
        kept.append(output.detach())

    handle = torch.nn.modules.module.register_module_forward_hook(keep_output)
    try:
        nn.Linear(D_IN, D_HIDDEN)(torch.randn(B, D_IN))
        roots = hunt_roots.roots_from(None, {}, "train.py")
        holders = walk(roots)
    finally:
        handle.remove()
    name = "torch.nn global hooks '_global_forward_hooks'"
    assert by_name(holders, name)["direct_bytes"] == storage_bytes(*kept)
    assert "__closure__['kept']" in by_name(holders, name)["largest_path"]


def failing_step():
    batch = torch.ones(512, 256)  # noqa: F841 - kept alive by the traceback, which is the point
    raise RuntimeError("CUDA out of memory (simulated)")


def test_a_stored_exception_keeps_its_frames_locals_alive():
    stored = None
    try:
        failing_step()
    except RuntimeError as err:
        stored = err
    held = by_name(walk({"global 'last_error'": stored}), "global 'last_error'")
    assert held["bytes"] == 512 * 256 * 4
    assert held["largest_path"].startswith("last_error.__traceback__")
    assert "failing_step() frame" in held["largest_path"] and held["largest_path"].endswith("local 'batch'")
    result = analysis.summarize([held], min_bytes=1024)
    assert result["kind"] == "container-leak" and result["culprit"] == "global 'last_error'"
    assert "alive through an exception's traceback" in result["headline"] and "str(err)" in result["advice"]


def test_the_exception_being_handled_when_the_retry_failed_is_a_root():
    """An OOM-retry loop: the first failure's traceback keeps the failed attempt's activations."""
    model = make_model()

    def attempt(n):
        hidden = model[:2](torch.randn(n, D_IN)).repeat(1, 4)  # noqa: F841 - what the first failure keeps
        raise RuntimeError("CUDA out of memory (first attempt)")

    try:
        try:
            attempt(B)
        except RuntimeError:
            raise RuntimeError("CUDA out of memory (the retry)")  # noqa: B904 - the implicit context is the point
    except RuntimeError as exc:
        roots = hunt_roots.roots_from(exc, {}, __file__)
        holders = walk(roots)
    held = by_name(holders, hunt_roots.CONTEXT_ROOT)
    assert held["direct_bytes"] >= B * D_HIDDEN * 4 * 4  # `hidden` itself
    assert held["graph_bytes"] >= B * D_HIDDEN * 4  # and what its graph saved
    assert held["largest_path"].startswith("exc.__context__.__traceback__")
    assert "attempt() frame" in held["largest_path"] and held["largest_path"].endswith("local 'hidden'")
    assert "being handled" in analysis.describe(held["name"], held["type"])


class Pair:
    def __init__(self, payload=None):
        self.other = None
        self.payload = payload


def test_memory_held_only_by_a_reference_cycle_is_reported_as_cycle():
    gc.collect()  # earlier tests' garbage is not this test's cycle
    gc.disable()
    try:
        a, b = Pair(torch.ones(256, 256)), Pair()
        a.other, b.other = b, a
        expected = storage_bytes(a.payload)
        del a, b
        holders = hunt_holders.find_holders({"global 'x'": torch.ones(4)}, device_type="cpu", cycles=True)
    finally:
        gc.enable()
    cycle = next(h for h in holders if h["label"] == hunt_holders.CYCLE)
    assert cycle["bytes"] >= expected
    assert "Pair" in cycle["name"] and cycle["largest_path"].endswith(".payload")
    result = analysis.summarize(holders, min_bytes=1024)
    assert result["kind"] == "cycle"
    assert "held only by a reference cycle" in result["headline"] and "gc.collect() frees" in result["headline"]


def test_a_cycle_that_holds_a_dead_weak_proxy_is_still_reported():
    """A weakref.proxy whose object is gone raises ReferenceError on any look at it (isinstance included);
    selenium leaves such proxies in cycles. It holds nothing: the cycle's tensor is still found and named."""
    gc.collect()
    gc.disable()
    try:
        gone = Pair()
        a, b = Pair(torch.ones(256, 256)), Pair(weakref.proxy(gone))
        a.other, b.other = b, a
        expected = storage_bytes(a.payload)
        del a, b, gone
        holders = hunt_holders.find_holders({}, device_type="cpu", cycles=True)
    finally:
        gc.enable()
    cycle = next(h for h in holders if h["label"] == hunt_holders.CYCLE)
    assert cycle["bytes"] >= expected and "Pair" in cycle["name"]


def test_cycle_detection_leaves_gc_as_it_found_it():
    flags, garbage = gc.get_debug(), len(gc.garbage)
    hunt_holders.find_holders({}, device_type="cpu", cycles=True)
    assert gc.get_debug() == flags and len(gc.garbage) == garbage


def test_model_parameters_and_optimizer_state_are_state_not_culprits():
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(B, D_IN)).mean().backward()
    optimizer.step()
    roots = {"global 'model'": model, "global 'optimizer'": optimizer}
    holders = walk(roots)

    params = list(model.parameters())
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    expected = storage_bytes(*params, *[p.grad for p in params], *state)
    assert sum(h["state_bytes"] for h in holders) == sum(h["bytes"] for h in holders) == expected
    assert by_name(holders, "global 'model'")["largest_path"].startswith("model.")
    assert {h["label"] for h in holders} == {hunt_state.STATE}

    result = analysis.summarize(holders, min_bytes=1)
    assert result["kind"] == "none" and result["culprit_bytes"] == 0 and result["culprit"] is None
    assert result["state_bytes"] == expected


def test_an_optimizers_parameters_that_no_module_holds_any_more_are_not_state():
    """A head replaced by a new one, added as a param group: the old head and its moments stay in the optimizer."""
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters())
    old_heads = []
    for _ in range(3):
        old_heads.append(model[4])
        model[4] = nn.Linear(D_HIDDEN, 4)
        optimizer.add_param_group({"params": model[4].parameters()})
        model(torch.randn(B, D_IN)).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    orphans = [p for head in old_heads for p in head.parameters()]
    moments = [v for p in orphans for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]  # and "step"
    del old_heads
    ids = hunt_state.model_state_ids([model, optimizer])
    assert {id(p) for p in orphans} == set(ids.orphans) and not any(id(p) in ids for p in orphans)
    assert all(id(p) in ids for p in model.parameters())

    held = by_name(walk({"global 'model'": model, "global 'optimizer'": optimizer}), "global 'optimizer'")
    assert analysis.own_bytes(held) == storage_bytes(*orphans, *moments)
    assert held["largest_path"].startswith("optimizer.")


def test_an_optimizer_over_bare_tensors_or_with_no_module_in_sight_is_state():
    w = torch.randn(D_IN, D_HIDDEN, requires_grad=True)  # not an nn.Parameter: no module to belong to
    bare = torch.optim.Adam([w])
    w.sum().backward()
    bare.step()
    head = nn.Linear(D_HIDDEN, 4)
    alone = torch.optim.Adam(head.parameters())  # its module is not among the roots: nothing says it was replaced
    head(torch.randn(B, D_HIDDEN)).mean().backward()
    alone.step()
    model = make_model()
    for roots in ({"global 'model'": model, "global 'bare'": bare}, {"global 'alone'": alone}):
        holders = walk(roots)
        assert all(analysis.own_bytes(h) == 0 for h in holders), holders


def gradient_history(model):
    """A hook on the last weight that keeps every gradient in its closure, as a script recording them for a plot would."""
    history = []

    def keep(grad):
        history.append(grad)
        return grad

    model[4].weight.register_hook(keep)
    for _ in range(3):
        model(torch.randn(B, D_IN)).mean().backward()
        model.zero_grad(set_to_none=True)
    return history


def test_a_tensors_own_hooks_are_walked_into_their_closures():
    model = make_model()
    history = gradient_history(model)
    held = by_name(walk({"global 'model'": model}, back_search=False), "global 'model'")
    assert analysis.own_bytes(held) == storage_bytes(*history)
    # The hook's key is its handle's number, counted over the whole process.
    assert re.fullmatch(r"model\.4\.weight\._backward_hooks\[\d+\]\.__closure__\['history'\]\[0\]", held["largest_path"])


def test_the_back_search_names_a_hook_and_a_closures_cell_the_way_the_walk_does():
    model = make_model()
    history = gradient_history(model)
    search = backsearch.search(history[:1], reached={id(model[4].weight): model[4].weight}, ignore=set(), torch=torch)
    [(_, arrival, hops)] = search.explained
    assert arrival.reached is model[4].weight
    assert re.fullmatch(r"\._backward_hooks\[\d+\]\.__closure__\['history'\]\[0\]", "".join(label for _, label in hops))


def test_a_thread_locals_attributes_are_read_as_this_threads():
    import threading

    scratch = threading.local()
    scratch.recent = [torch.randn(1000) for _ in range(3)]
    held = by_name(walk({"global 'scratch'": scratch}), "global 'scratch'")
    assert held["bytes"] == storage_bytes(*scratch.recent) and held["largest_path"] == "scratch.recent[0]"


def test_of_equally_large_tensors_the_path_goes_down_the_branch_that_keeps_the_most():
    """A suspended generator yields this batch and keeps every earlier one: the path shows the ones it keeps."""

    def prefetch():
        window = []
        for _ in range(10):
            batch = torch.randn(1000)
            window.append(batch)
            yield batch

    batches = prefetch()
    current = [next(batches) for _ in range(4)][-1]
    held = by_name(walk({"main() local 'batches' (train.py:3)": batches}), "main() local 'batches' (train.py:3)")
    assert held["bytes"] == 4 * storage_bytes(current)
    assert held["largest_path"].startswith("batches -> suspended frame local 'window'[")


def test_a_tensor_referenced_twice_is_counted_once():
    t = torch.randn(1000)
    holders = walk({"global 'a'": [t, t], "global 'b'": {"view": t.view(10, 100)}})
    assert sum(h["bytes"] for h in holders) == storage_bytes(t)
    assert by_name(holders, "global 'a'")["tensors"] == 1


def test_a_saved_tensor_modified_in_place_is_still_counted():
    x = torch.randn(B, D_HIDDEN, requires_grad=True)
    y = x * 2
    out = y.sin()  # saves y
    y.add_(1)  # reading out.grad_fn._saved_self now raises; the tensor is alive all the same
    if getattr(out.grad_fn._raw_saved_self, "data", None) is None:
        pytest.skip("this torch cannot read a saved tensor without its version check")
    held = by_name(walk({"global 'out'": out}), "global 'out'")
    assert held["graph_bytes"] >= storage_bytes(y)


SCRIPT = """
import json
import torch

keep = torch.zeros(8)


def step(n):
    big = torch.ones(n, n)
    return json.loads("{not json")


step(64)
"""


def test_roots_from_names_frame_locals_with_their_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).lstrip(), encoding="utf-8")
    try:
        runpy.run_path(str(script), run_name="__main__")
    except ValueError as err:
        roots = hunt_roots.roots_from(err, None, script)
    assert "step() local 'big' (train.py:9)" in roots
    assert roots["step() local 'n' (train.py:9)"] == 64
    assert "global 'keep'" in roots and "global 'json'" not in roots  # modules are not roots
    assert roots.in_flight and all(name.endswith(")") and "train.py" not in name for name in roots.in_flight)
    assert list(roots).index("step() local 'big' (train.py:9)") < list(roots).index("global 'keep'")


def test_reading_a_running_frames_locals_leaves_no_reference_behind():
    def body():
        t = torch.ones(10)
        ref = weakref.ref(t)
        hunt_paths.frame_locals(sys._getframe())
        t = None  # noqa: F841 - rebinding must free the tensor
        return ref() is None

    assert body()


EVAL_SCRIPT = """
import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(64, 32)).logsumexp(dim=1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def evaluate():
    losses = []
    for _ in range(4):
        losses.append(model(torch.randn(64, 32)).logsumexp(dim=1).mean())
    raise RuntimeError("CUDA out of memory (simulated)")


evaluate()
"""

HISTORY_SCRIPT = """
import torch
import torch.nn as nn

model = nn.Linear(32, 256)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for step in range(6):
    out = model(torch.randn(64, 32))
    optimizer.zero_grad()
    out.mean().backward()
    optimizer.step()
    history.append(out.detach())
"""


def run_probe(tmp_path, source: str) -> dict:
    """Run ``source`` as the child would: start, the script, finish (inside the except block if it raised)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source).lstrip(), encoding="utf-8")
    out = tmp_path / "out"
    hunter = probe.Probe(torch, out, {"script": str(script), "device": "cpu", "min_bytes": 1024})
    hunter.start()
    handle = hunter.handle
    try:
        try:
            script_globals = runpy.run_path(str(script), run_name="__main__")
        except RuntimeError as exc:
            hunter.finish(exc, None)
        else:
            hunter.finish(None, script_globals)
        assert hunter.handle is None  # finish removed the optimizer hook
    finally:
        handle.remove()  # whatever happened, no other test sees this probe's hook
    return json.loads((out / "hunt.json").read_text(encoding="utf-8"))


def test_probe_names_the_list_of_losses_when_evaluation_fails(tmp_path):
    result = run_probe(tmp_path, EVAL_SCRIPT)
    assert {"tool", "kind", "headline", "culprit_bytes"} <= result.keys()
    assert result["tool"] == "hunt" and result["kind"] == "graph-leak"
    assert result["culprit"] == "evaluate() local 'losses' (train.py:17)"
    assert result["headline"].startswith("list `losses` (local of evaluate() at train.py:17) holds 4 tensors")
    assert result["culprit_bytes"] >= 4 * 2 * 64 * 256 * 4
    assert result["optimizer_steps"] == 3 and result["baseline_step"] == 1
    assert result["explained_bytes"] >= result["culprit_bytes"] + result["state_bytes"]


def test_probe_finds_a_global_list_that_grows_every_step(tmp_path):
    result = run_probe(tmp_path, HISTORY_SCRIPT)
    assert result["kind"] == "container-leak"
    culprit = by_name(result["holders"], "global 'history'")
    assert culprit["surviving"] and culprit["grew_bytes"] == 5 * 64 * 256 * 4  # 1 kept at step 1, 6 at the end
    assert "grew by" in result["headline"] and "`history`" in result["headline"]


def test_finish_never_raises(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise MemoryError("the walk itself ran out of memory")

    monkeypatch.setattr(probe, "find_holders", broken)
    probe.Probe(torch, tmp_path, {}).finish(RuntimeError("CUDA out of memory"), None)
    result = json.loads((tmp_path / "hunt.json").read_text(encoding="utf-8"))
    assert result["kind"] == "error" and result["culprit_bytes"] == 0 and result["error"]


def holder(name, type_, *, direct=0, graph=0, state=0, tensors=0, saved=0, graphs=0, tensor_root=False, label=""):
    return {
        "name": name,
        "type": type_,
        "bytes": direct + graph + state,
        "state_bytes": state,
        "direct_bytes": direct,
        "graph_bytes": graph,
        "tensors": tensors,
        "saved_tensors": saved,
        "graphs": graphs,
        "largest_path": name,
        "largest_bytes": direct,
        "tensor_root": tensor_root,
        "label": label,
    }


def test_a_big_container_that_did_not_grow_is_held_not_leaked():
    holders = [
        holder("global 'features'", "list", direct=600 * MIB, tensors=30),
        holder("global 'model'", "Sequential", state=300 * MIB, label=hunt_state.STATE),
        holder("global 'x'", "Tensor", direct=8 * MIB, tensors=1, tensor_root=True),
    ]
    result = analysis.summarize(holders, allocated=910 * MIB)
    assert result["kind"] == "held" and result["culprit"] == "global 'features'"
    assert "could not be checked" in result["headline"]
    grown = analysis.summarize(holders, baseline={"global 'features'": 20 * MIB})
    assert grown["kind"] == "container-leak" and "grew by 580.0 MiB since optimizer step 1" in grown["headline"]


def test_the_current_steps_forward_graph_is_not_a_leak():
    holders = [
        holder(
            "lm_loss() local 'logits' (train.py:30)",
            "Tensor",
            direct=64 * MIB,
            graph=200 * MIB,
            tensors=1,
            saved=4,
            graphs=1,
            tensor_root=True,
        ),
        holder(
            "Linear.forward() local 'input' (torch/nn/modules/linear.py:125)",
            "Tensor",
            graph=900 * MIB,
            saved=3,
            graphs=1,
            tensor_root=True,
        ),
    ]
    result = analysis.summarize(holders, in_flight={holders[1]["name"]}, allocated=1400 * MIB)
    assert result["kind"] == "none" and result["culprit_bytes"] == 0
    assert result["holders"][1]["label"] == analysis.IN_FLIGHT
    assert result["headline"].startswith("nothing outlives its step")


def test_render_and_draw(tmp_path):
    from rich.table import Table
    from rich.text import Text

    base = [
        holder(LOSSES, "list", direct=2048, graph=816 * MIB, tensors=3, saved=30, graphs=3),
        holder("global 'model'", "Sequential", state=300 * MIB, label=hunt_state.STATE),
    ]
    result = analysis.summarize(base, allocated=1200 * MIB, reserved=1300 * MIB, steps=[400 * MIB] * 10)
    shown = present.render(result)
    assert isinstance(shown[0], Table) and any(isinstance(x, Text) and "no_grad" in x.plain for x in shown)
    assert any(isinstance(x, Text) and "explain" in x.plain for x in shown)

    import matplotlib.image

    for steps in ([400 * MIB] * 10, []):
        result["steps"] = steps
        (path,) = present.draw(result, tmp_path / f"steps{len(steps)}")
        assert path.name == "hunt.png" and matplotlib.image.imread(path).shape[1] == 1200


HOOKED_SCRIPT = """
import torch

unpacked = []
model = torch.nn.Linear(32, 256)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: unpacked.append(1) or t):
    hooked = model(torch.randn(64, 32)).relu().sum()
plain = model(torch.randn(64, 32)).relu().sum()
"""


def hunt_hooked(tmp_path) -> tuple[dict, list]:
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(HOOKED_SCRIPT).lstrip(), encoding="utf-8")
    out = tmp_path / "out"
    hunter = probe.Probe(torch, out, {"script": str(script), "device": "cpu", "min_bytes": 1024})
    hunter.start()
    script_globals = runpy.run_path(str(script), run_name="__main__")
    hunter.finish(None, script_globals)
    return json.loads((out / "hunt.json").read_text(encoding="utf-8")), script_globals["unpacked"]


def test_hook_packed_values_are_not_unpacked_by_the_walk(tmp_path):
    result, unpacked = hunt_hooked(tmp_path)
    assert unpacked == []
    assert result["walk"]["packed_saved"] >= 1
    assert "were packed by saved_tensors_hooks" in " ".join(getattr(x, "plain", "") for x in present.render(result))


def test_on_torch_that_cannot_see_saved_tensor_hooks_the_walk_reads_no_saved_value(tmp_path, monkeypatch):
    # torch 2.4 has no SavedTensor.unpack_hook: a hook-packed value looks like any other, so after
    # the script entered saved_tensors_hooks the walk must not read any saved value.
    if not probe.saved_hooks_visible(torch):
        pytest.skip("this torch is the case itself: the test above runs on it for real")
    seen, _ = hunt_hooked(tmp_path / "visible")
    monkeypatch.setattr(probe, "saved_hooks_visible", lambda torch: False)
    hooks = torch.autograd.graph.saved_tensors_hooks
    entered = hooks.__enter__
    blind, unpacked = hunt_hooked(tmp_path / "blind")
    assert hooks.__enter__ is entered  # the probe put the class back as it found it
    assert unpacked == []
    assert blind["walk"]["packed_saved"] > seen["walk"]["packed_saved"]  # the plain graph's values too


# --------------------------------------------------------------------------- the back search


def test_an_lru_cache_keeps_its_entries_where_only_the_back_search_finds_them():
    @functools.lru_cache(maxsize=16)
    def table(n):
        return torch.ones(n, 100)

    for n in (10, 20, 30):
        table(n)
    expected = storage_bytes(*(table(n) for n in (10, 20, 30)))
    roots = {"global 'table'": table}
    assert all(h["name"] != "global 'table'" for h in walk(roots, back_search=False))  # the C cache is out of the walk's sight

    report = {}
    held = by_name(walk(roots, report=report), "global 'table'")
    assert held["bytes"] == held["direct_bytes"] == expected and held["tensors"] == 3
    assert held["largest_path"] == "table (functools.lru_cache)[30]"
    assert report["back_search"]["explained"] >= 3
    assert analysis.describe(held["name"], held["type"]) == "functools.lru_cache `table` (global)"


def test_an_unbounded_lru_cache_names_its_entry_by_the_call_arguments():
    @functools.cache
    def pair(n, mode="a"):
        return torch.ones(n, 10), torch.zeros(n, 1000)

    pair(5, mode="b")
    held = by_name(walk({"global 'pair'": pair}), "global 'pair'")
    assert held["bytes"] == storage_bytes(*pair(5, mode="b"))
    assert held["largest_path"] == "pair (functools.lru_cache)[(5, 'mode', 'b')][1]"


def test_a_library_modules_global_is_named_by_module_and_key(monkeypatch):
    module = types.ModuleType("heldout_registry")
    module.cache = {"features": [torch.ones(300, 300)]}
    monkeypatch.setitem(sys.modules, "heldout_registry", module)
    held = by_name(walk({}), "global 'cache' (module heldout_registry)")
    assert held["bytes"] == storage_bytes(module.cache["features"][0]) and held["back_searched"]
    assert held["largest_path"] == "heldout_registry.cache['features'][0]"
    assert analysis.describe(held["name"], held["type"]) == "dict `cache` (global in module heldout_registry)"


class Owner:
    pass


def test_a_class_attribute_of_the_standard_library_is_named_with_its_path():
    owner = Owner()
    finalizer = weakref.finalize(owner, print, {"w": torch.ones(200, 200)})
    try:
        holders = walk({"global 'owner'": owner})
        held = by_name(holders, "class attribute 'weakref.finalize._registry'")
        assert held["bytes"] == 200 * 200 * 4
        assert held["largest_path"] == "weakref.finalize._registry[<finalize>].args[0]['w']"
    finally:
        finalizer.detach()


def test_what_no_object_refers_to_stays_unexplained_with_its_reason():
    orphan = torch.ones(1234)
    listed = [[torch.ones(4321)]]
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(orphan))  # a reference no Python object holds, as C++ keeps one
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(listed))
    try:
        here = {id(sys._getframe())}  # before Python 3.11 a running frame shows its locals to the collector
        found = backsearch.search([orphan, listed[0][0]], reached={}, ignore=here, torch=torch)
        owners = {id(target): owner for target, owner in found.unexplained}
        assert not found.explained and found.levels >= 2
        assert owners[id(orphan)].startswith("nothing Python can see")
        assert owners[id(listed[0][0])] == "a list that no named object reaches (2 references up)"
    finally:
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(orphan))
        ctypes.pythonapi.Py_DecRef(ctypes.py_object(listed))


def test_a_storage_that_two_unnamed_owners_keep_is_unexplained_once(monkeypatch):
    """A tensor and a view of it, each kept by a container no name reaches (as C++ would keep them)."""

    def hide():
        base = torch.ones(1000)
        owners = ([base], {"view": base[:500]})
        for owner in owners:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(owner))
        return hunt_walk.storage_key(base)[0], [id(owner) for owner in owners]

    key, owner_ids = hide()
    every = backsearch.unreached
    monkeypatch.setattr(backsearch, "unreached", lambda walk: {k: g for k, g in every(walk).items() if k == key})
    try:
        report = {}
        hunt_holders.find_holders({}, device_type="cpu", cycles=False, report=report)
        assert report["back_search"]["targets"] == 1 and report["back_search"]["explained"] == 0
        assert [r["storages"] for r in report["unexplained"]] == [1] and report["unexplained"][0]["bytes"] == 4000
    finally:
        for oid in owner_ids:
            ctypes.pythonapi.Py_DecRef(ctypes.cast(oid, ctypes.py_object))


def test_the_back_search_stops_at_its_bounds():
    deep = torch.ones(10)
    for _ in range(6):
        deep = [deep]  # six lists up from the tensor, and nothing named above them
    target = deep
    while isinstance(target, list):
        target = target[0]
    found = backsearch.search([target], reached={}, ignore={id(sys._getframe())}, torch=torch, max_levels=3)
    assert found.truncated == "stopped 3 references back" and found.levels == 3
    assert found.unexplained[0][1].startswith("a list that no named object reaches")


def test_render_says_where_the_culprit_holds_it_and_what_stays_unexplained():
    holders = [
        holder("global 'table'", "_lru_cache_wrapper", direct=600 * MIB, tensors=6),
        holder(inflight.IN_FLIGHT_GRAPH.format(phase=inflight.BACKWARD), "graph", graph=300 * MIB, saved=9, graphs=1, label=IN),
        holder("global 'loss'", "Tensor", direct=4, tensors=1, tensor_root=True),
    ]
    holders[0]["largest_path"] = "table (functools.lru_cache)[30]"
    unexplained = [
        {"owner": "nothing Python can see (a C++ owner, or a local of code still running)", "bytes": 40 * MIB, "storages": 2}
    ]
    result = analysis.summarize(holders, allocated=1000 * MIB, baseline={"global 'table'": 100 * MIB}, unexplained=unexplained)
    assert result["kind"] == "container-leak" and result["culprit"] == "global 'table'"
    assert result["culprit_path"] == "table (functools.lru_cache)[30]" and result["in_flight_bytes"] == 300 * MIB
    text = "\n".join(getattr(part, "plain", "") for part in present.render(result))
    assert "Held at: table (functools.lru_cache)[30]" in text
    assert "In flight: 300.0 MiB belongs to the call that was running" in text
    assert "40.0 MiB in 2 storage(s) is held by nothing Python can see" in text
    assert "60.0 MiB is held by no Python object at all" in text  # 1000 - 600 - 300 - 40 MiB, and the 4 bytes


# --------------------------------------------------------------------------- the graph in flight


class FailsInBackward(torch.autograd.Function):
    """Identity forward; its backward raises as an OOM would, half-way through ``loss.backward()``."""

    @staticmethod
    def forward(ctx, t):
        return t.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("CUDA out of memory (simulated)")


def test_the_phase_is_read_from_the_failing_calls_frames():
    assert inflight.phase(["_engine_run_backward() local 't_outputs' (torch/autograd/graph.py:829)"]) == inflight.BACKWARD
    assert inflight.phase(["backward() local 'tensors' (torch/autograd/__init__.py:353)"]) == inflight.BACKWARD
    assert inflight.phase(["Linear.forward() local 'input' (torch/nn/modules/linear.py:125)"]) == inflight.FORWARD
    assert inflight.phase(["Net.backward() local 'x' (train.py:3)"]) == inflight.FORWARD  # the learner's, not autograd's


def test_graph_nodes_stop_at_what_an_earlier_step_made():
    x = torch.randn(8, 8, requires_grad=True)
    old = (x * 2).sin()
    since = inflight.next_sequence_nr(torch)
    new = (old * 3).exp()
    if since is None:
        pytest.skip("this torch does not number autograd nodes")
    names = [type(n).__name__ for n in inflight.graph_nodes([new], torch, since)]
    assert names == ["ExpBackward0", "MulBackward0"]
    assert len(inflight.graph_nodes([(new,)], torch, None)) == 4  # every node, the accumulator of x left out


def oom_in_backward(model, kept):
    """One training step whose backward fails; ``kept`` grows by a tensor every step, as a leak does."""
    x = torch.randn(B, D_IN)
    loss = FailsInBackward.apply(model(x)).logsumexp(dim=1).mean()
    kept.append(torch.ones(128, 1024))
    loss.backward()


def test_the_graph_backward_was_running_is_in_flight_and_the_grower_is_blamed():
    model, kept = make_model(), []
    since = inflight.next_sequence_nr(torch)
    try:
        oom_in_backward(model, kept)
    except RuntimeError as exc:
        roots = hunt_roots.roots_from(exc, {"model": model, "kept": kept}, __file__)
        report = {}
        holders = walk(roots, since_sequence=since, report=report, back_search=False)  # the point here is the walk's
        in_flight = set(roots.in_flight)
    assert report["in_flight"] == inflight.BACKWARD
    graph = by_name(holders, inflight.IN_FLIGHT_GRAPH.format(phase=inflight.BACKWARD))
    assert graph["label"] == inflight.IN_FLIGHT and graph["graph_bytes"] >= 2 * B * D_HIDDEN * 4
    loss = next(h for h in holders if h["name"].startswith("oom_in_backward() local 'loss'"))
    assert loss["graph_bytes"] == 0  # its graph is the one in flight, not something it kept
    grower = next(h for h in holders if h["name"].startswith("oom_in_backward() local 'kept'"))

    baseline = {"oom_in_backward() local 'kept'": 0, analysis.stable_name(loss["name"]): 4}
    result = analysis.summarize(holders, baseline=baseline, in_flight=in_flight, min_bytes=1024)
    assert result["kind"] == "container-leak" and result["culprit"] == grower["name"]
    assert result["in_flight_bytes"] >= graph["graph_bytes"]


def test_a_graph_kept_from_earlier_steps_stays_with_its_holder_in_backward():
    """A running loss summed without detach: its earlier steps' graphs are a leak, not the step in flight."""
    model = make_model()
    running = model(torch.randn(B, D_IN)).logsumexp(dim=1).mean()  # an earlier step's graph
    kept_bytes = by_name(walk({"global 'running'": running}), "global 'running'")["graph_bytes"]
    since = inflight.next_sequence_nr(torch)
    try:
        running = running + FailsInBackward.apply(model(torch.randn(B, D_IN))).logsumexp(dim=1).mean()
        running.backward()
    except RuntimeError as exc:
        roots = hunt_roots.roots_from(exc, {}, __file__)
        holders = walk(roots, since_sequence=since, back_search=False)
    held = next(
        h
        for h in holders
        if h["name"].startswith("test_a_graph_kept_from_earlier_steps_stays_with_its_holder_in_backward() local 'running'")
    )
    assert held["graph_bytes"] == kept_bytes and held["step_graph_bytes"] == 0
    assert by_name(holders, inflight.IN_FLIGHT_GRAPH.format(phase=inflight.BACKWARD))["graph_bytes"] > 0
    baseline = {analysis.stable_name(held["name"]): 0}  # after the last optimizer step, before it kept a graph
    result = analysis.summarize(holders, baseline=baseline, in_flight=set(roots.in_flight), min_bytes=1024)
    assert result["kind"] == "graph-leak" and result["culprit"] == held["name"]
    assert by_name(result["holders"], held["name"])["grew_bytes"] == analysis.own_bytes(held)  # all of it from before


def test_an_earlier_steps_outputs_kept_in_a_list_are_kept_across_steps_when_the_run_dies_before_a_second_optimizer_step():
    """A loop that appends ``(step, logits, loss)`` and dies in step 2's forward: step 1's logits are no current tensors.

    backward freed step 1's graph, so the list holds plain tensors; the baseline, taken after optimizer
    step 1, already held them, so nothing grew. What tells them apart is the node that made them: older
    than the last optimizer step.
    """
    model = nn.Sequential(nn.Linear(D_IN, 4096))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    logits = model(torch.randn(B, D_IN))
    loss = logits.logsumexp(dim=1).mean()
    loss.backward()
    history.append((1, logits, loss))
    optimizer.step()
    since = inflight.next_sequence_nr(torch)  # what the probe records after each optimizer step
    if since is None:
        pytest.skip("this torch does not number autograd nodes")
    current = model(torch.randn(B, D_IN))  # step 2's forward, where the run died: the current step's
    roots = {"global 'history'": history, "global 'current'": current, "global 'model'": model}
    holders = walk(roots, since_sequence=since, back_search=False)
    kept, now = by_name(holders, "global 'history'"), by_name(holders, "global 'current'")
    assert kept["earlier_step_bytes"] == storage_bytes(logits, loss) and now["earlier_step_bytes"] == 0
    baseline = {"global 'history'": analysis.own_bytes(kept)}  # the list held them already; `current` was not there
    result = analysis.summarize(holders, baseline=baseline, min_bytes=1024)
    assert result["kind"] == "container-leak" and result["culprit"] == "global 'history'"
    assert "an earlier step's forward pass made: kept across steps" in result["headline"]
    # The same list of detached values is what a training loop may mean to keep: no node, no sign.
    history[:] = [(1, logits.detach(), loss.item())]
    holders = walk(roots, since_sequence=since, back_search=False)
    assert by_name(holders, "global 'history'")["earlier_step_bytes"] == 0
    result = analysis.summarize(holders, baseline=baseline, min_bytes=1024)
    assert result["kind"] != "container-leak"


class KeepsEveryInput(nn.Module):
    """A module that registers a buffer per step: model state that gains tensors every step."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(D_IN, 4)
        self.seen = 0

    def forward(self, x):
        self.register_buffer(f"input_{self.seen}", x.detach().clone())
        self.seen += 1
        return self.layer(x)


def test_model_state_that_gains_tensors_every_step_is_a_leak_though_state_is_otherwise_no_culprit():
    model = KeepsEveryInput()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(B * 16, D_IN)  # 128 KiB a step

    def step():
        model(x).square().mean().backward()
        optimizer.step()

    def holders():
        roots = {"global 'model'": model, "global 'optimizer'": optimizer}
        return walk(roots, back_search=False)

    step()
    at_baseline = holders()  # what the probe keeps after optimizer step 1
    baseline = {h["name"]: analysis.own_bytes(h) for h in at_baseline}
    state_baseline = {h["name"]: h["state_bytes"] for h in at_baseline}
    for _ in range(3):
        step()
    now = holders()
    result = analysis.summarize(now, baseline=baseline, state_baseline=state_baseline, min_bytes=64 * 1024)
    assert result["kind"] == "container-leak" and result["culprit"] == "global 'model'"
    assert result["culprit_bytes"] == 3 * storage_bytes(x)
    assert "of model/optimizer state" in result["headline"] and "more than after optimizer step 1" in result["headline"]
    # Without the buffers it keeps, the same loop's state does not grow: nothing to blame.
    model.forward = lambda x: model.layer(x)
    step()
    for name in [n for n, _ in model.named_buffers()]:
        delattr(model, name)
    at_baseline = holders()
    state_baseline = {h["name"]: h["state_bytes"] for h in at_baseline}
    step()
    result = analysis.summarize(holders(), baseline=baseline, state_baseline=state_baseline, min_bytes=64 * 1024)
    assert result["kind"] == "none", result["headline"]


def test_a_name_bound_to_another_parameter_since_the_baseline_gained_no_state():
    """Seen on the H200, on a rank that kept nothing: after step 1 its loop's `p` was the last bias (a loop over the
    parameters that ended); at the failure, inside the loop, the first weight with its gradient, 32 MiB more."""
    model = nn.Sequential(nn.Linear(D_IN, 1024), nn.Linear(1024, 4))
    model(torch.randn(B, D_IN)).square().mean().backward()
    weight, bias = model[0].weight, model[1].bias

    def holders(p):
        return walk({"global 'model'": model, "global 'p'": p}, back_search=False)

    at_baseline = holders(bias)
    baseline = {h["name"]: analysis.own_bytes(h) for h in at_baseline}
    state_baseline = {h["name"]: h["state_bytes"] for h in at_baseline}
    now = holders(weight)
    assert by_name(now, "global 'p'")["state_bytes"] - state_baseline["global 'p'"] >= 64 * 1024
    result = analysis.summarize(now, baseline=baseline, state_baseline=state_baseline, min_bytes=64 * 1024)
    assert result["kind"] == "none", result["headline"]


def test_this_steps_graph_is_no_growth_across_steps():
    h = holder(
        "train() local 'out' (train.py:9)", "Tensor", direct=MIB, graph=50 * MIB, tensors=1, saved=3, graphs=1, tensor_root=True
    )
    h["step_graph_bytes"] = 50 * MIB
    result = analysis.summarize([h], baseline={"train() local 'out'": MIB})
    assert result["holders"][0]["grew_bytes"] == 0 and result["kind"] == "none"


# The script runs on its own in the measured process: it gets FailsInBackward's own source, not a copy.
LRU_SCRIPT = (
    """
import functools
import torch


@functools.lru_cache(maxsize=None)
def bias(n):
    return torch.randn(n, 256)


"""
    + inspect.getsource(FailsInBackward)
    + """

model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    out = model(torch.randn(512, 256) + bias(1000 + step).mean(0))
    loss = (FailsInBackward.apply(out) if step == 5 else out).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
"""
)


def test_probe_blames_the_cache_not_the_graph_in_flight_when_backward_fails(tmp_path):
    """The issue's sixth script on the CPU: tensors memoised by lru_cache grow; the OOM strikes in backward."""
    result = run_probe(tmp_path, LRU_SCRIPT)
    assert result["kind"] == "container-leak" and result["culprit"] == "global 'bias'"
    assert result["culprit_path"].startswith("bias (functools.lru_cache)[100")
    assert result["walk"]["in_flight"] == inflight.BACKWARD and result["in_flight_bytes"] >= 2 * 512 * 1024 * 4
    assert by_name(result["holders"], "global 'loss'")["graph_bytes"] == 0
    culprit = by_name(result["holders"], "global 'bias'")
    assert culprit["grew_bytes"] == 5 * 1000 * 256 * 4 + sum(range(1, 6)) * 256 * 4  # 5 entries since step 1


def test_a_name_only_the_back_search_finds_grew_from_nothing_when_the_baseline_named_everything():
    found = holder("class attribute 'weakref.finalize._registry'", "dict", direct=400 * MIB, tensors=4)
    found["back_searched"] = True
    other = holder("global 'x'", "Tensor", direct=8 * MIB, tensors=1, tensor_root=True)
    grown = analysis.summarize([found, other], baseline={"global 'x'": 8 * MIB})
    assert grown["kind"] == "container-leak" and grown["holders"][0]["grew_bytes"] == 400 * MIB
    unsure = analysis.summarize([found, other], baseline={"global 'x'": 8 * MIB}, baseline_named_all=False)
    assert unsure["holders"][0]["grew_bytes"] is None and unsure["kind"] == "held"
