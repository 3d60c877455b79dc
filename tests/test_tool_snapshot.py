"""The snapshot tool on synthetic snapshots shaped like the real ones (torch 2.11 on an H200).

The fragmented case mirrors the feature-cache OOM: 32 MiB segments, each with a
20 MiB cached feature block (allocated at train.py:31) and 12 MiB left free,
and an "oom" history entry of 32 MiB. Keys and frame order follow
``torch.cuda.memory._snapshot()``: frames innermost first, runpy and the
harness outermost.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from oomlab.errors import OomLabError
from oomlab.measure.harness import CHILD
from oomlab.oom import parse_message
from oomlab.tools.snapshot import analysis, present, probe
from oomlab.units import MIB
from tests.test_nvml import fake_pynvml

TORCH_LIB = "/opt/torch/.venv/lib/python3.12/site-packages/torch"
TRAIN_PY = textwrap.dedent(
    """\
    import torch
    import torch.nn as nn

    device = "cuda"
    encoder = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 2560)).to(device)
    features = []
    with torch.no_grad():
        for _ in range(40):
            x = torch.randn(2048, 1024, device=device)
            features.append(encoder(x))
    """
)
FEATURE_LINE = 10  # features.append(encoder(x))
ENCODER_LINE = 5
X_LINE = 9


@pytest.fixture
def train_py(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN_PY)
    return path


def frames(script: Path, line: int, inner: list[tuple[str, int, str]] = ()) -> list[dict]:
    """A Python stack as the allocator records it: innermost first, harness outermost."""
    stack = [{"name": name, "filename": f"{TORCH_LIB}/{file}", "line": ln} for file, ln, name in inner]
    stack.append({"name": "<module>", "filename": str(script), "line": line})
    stack += [
        {"name": "_run_code", "filename": "<frozen runpy>", "line": 88},
        {"name": "run_path", "filename": "<frozen runpy>", "line": 286},
        {"name": "run", "filename": str(CHILD), "line": 98},
    ]
    return stack


LINEAR = [
    ("nn/modules/linear.py", 134, "forward"),
    ("nn/modules/module.py", 1790, "_call_impl"),
    ("nn/modules/container.py", 253, "forward"),
]


def block(size, state="active_allocated", stack=None, requested=None):
    return {"size": size, "requested_size": size if requested is None else requested, "state": state, "frames": stack or []}


class Builder:
    """Segments and a matching history: each segment allocated, each live block allocated, then extra events."""

    def __init__(self):
        self.segments: list[dict] = []
        self.trace: list[dict] = []
        self.next_address = 0x7F0000000000
        self.clock = 1_796_019_987_000_000

    def event(self, action, size, addr=0, stack=None, **extra):
        self.clock += 7
        entry = {
            "action": action,
            "size": size,
            "stream": 0,
            "time_us": self.clock,
            "compile_context": "N/A",
            "user_metadata": "",
            "frames": stack or [],
        }
        entry["device_free" if action == "oom" else "addr"] = extra.get("device_free", addr)
        self.trace.append(entry)

    def segment(self, blocks: list[dict], pool="large", pool_id=(0, 0)):
        address = self.next_address
        total = sum(b["size"] for b in blocks)
        self.next_address += total + 64 * MIB
        self.event("segment_alloc", total, address)
        offset = address
        for b in blocks:
            b["address"] = offset
            if b["state"] != "inactive":
                self.event("alloc", b["requested_size"], offset, b["frames"])
            if b["state"] == "active_pending_free":  # freed, still in use by another stream
                self.event("free_requested", b["requested_size"], offset, b["frames"])
            offset += b["size"]
        live = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        active = sum(b["size"] for b in blocks if b["state"] != "inactive")
        self.segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "allocated_size": live,
                "active_size": active,
                "requested_size": sum(b["requested_size"] for b in blocks if b["state"] != "inactive"),
                "stream": 0,
                "segment_type": pool,
                "segment_pool_id": pool_id,
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )

    def transient(self, size, times=1):
        """Alloc and free pairs that leave nothing behind (activations)."""
        for _ in range(times):
            self.event("alloc", size, 0x1000)
            self.event("free_requested", size, 0x1000)
            self.event("free_completed", size, 0x1000)

    def snapshot(self) -> dict:
        return {"segments": self.segments, "device_traces": [self.trace], "allocator_settings": {}, "external_annotations": []}


def fragmented(script: Path, pinned=36) -> dict:
    """The feature-cache OOM: `pinned` 32 MiB segments, each a 20 MiB feature + 12 MiB free; OOM on 32 MiB."""
    b = Builder()
    b.segment([block(16 * MIB, stack=frames(script, ENCODER_LINE))])  # encoder weights
    b.segment([block(40 * MIB, stack=frames(script, ENCODER_LINE))])
    labels = [block(16 * 1024, stack=frames(script, 11)) for _ in range(8)]
    b.segment(labels + [block(2 * MIB - 8 * 16 * 1024, "inactive")], pool="small")
    for _ in range(pinned):
        b.transient(32 * MIB, times=2)
        b.segment([block(20 * MIB, stack=frames(script, FEATURE_LINE, LINEAR)), block(12 * MIB, "inactive")])
    b.segment([block(32 * MIB, stack=frames(script, FEATURE_LINE, LINEAR))])  # the live hidden activation
    b.event("oom", 32 * MIB, device_free=148_190_134_272, stack=frames(script, FEATURE_LINE, LINEAR))
    return b.snapshot()


def healthy(script: Path) -> dict:
    b = Builder()
    for _ in range(4):
        b.segment([block(64 * MIB, stack=frames(script, ENCODER_LINE))])
    b.segment([block(20 * MIB, "inactive")])  # a wholly free segment: releasable
    b.segment([block(4 * MIB, "active_pending_free"), block(16 * MIB, "inactive")])  # waits on another stream
    b.segment([block(512 * 1024, stack=frames(script, X_LINE)), block(1536 * 1024, "inactive")], pool="small")
    b.transient(8 * MIB, times=5)
    return b.snapshot()


def live_heavy(script: Path) -> dict:
    """An OOM where nearly everything reserved is live: a leak, not fragmentation."""
    b = Builder()
    for _ in range(10):
        b.segment([block(100 * MIB, stack=frames(script, FEATURE_LINE, LINEAR))])
    b.segment([block(60 * MIB, stack=frames(script, ENCODER_LINE)), block(4 * MIB, "inactive")])
    b.event("oom", 64 * MIB, device_free=10 * MIB)
    return b.snapshot()


# --------------------------------------------------------------------------- analysis


def test_fragmented_totals_and_verdict(train_py):
    r = analysis.analyze(fragmented(train_py), script=str(train_py))
    t = r["totals"]
    assert t["reserved"] == 16 * MIB + 40 * MIB + 2 * MIB + 36 * 32 * MIB + 32 * MIB
    assert t["allocated"] == 16 * MIB + 40 * MIB + 8 * 16 * 1024 + 36 * 20 * MIB + 32 * MIB
    assert t["non_releasable"] == 36 * 12 * MIB + (2 * MIB - 8 * 16 * 1024)
    assert t["releasable"] == 0
    assert t["largest_free_block_large_pool"] == 12 * MIB
    assert t["segments"] == 40 and t["segments_pinned"] == 37
    oom = r["oom"]
    assert oom["failed_request"] == 32 * MIB and oom["source"] == "trace"
    assert oom["pool"] == "large" and not oom["fits_in_a_free_block"] and oom["free_would_cover"]
    assert oom["failed_at"]["label"] == f"train.py:{FEATURE_LINE}"
    assert r["kind"] == "fragmentation"
    assert r["culprit_bytes"] == t["non_releasable"]
    assert r["headline"] == (
        "OOM asking for 32.0 MiB with 432.0 MiB free but split (largest free block 12.0 MiB): "
        f"36 segments are pinned by 20.0 MiB blocks from train.py:{FEATURE_LINE} (features.append(encoder(x)))."
    )
    json.dumps(r)  # the probe writes it as JSON


def test_pinned_groups_name_the_script_line_not_torch(train_py):
    r = analysis.analyze(fragmented(train_py), script=str(train_py))
    top = r["pinned_groups"][0]
    assert (top["count"], top["segment_size"], top["pinner_size"], top["free_bytes"]) == (36, 32 * MIB, 20 * MIB, 432 * MIB)
    assert top["site"]["file"] == str(train_py) and top["site"]["function"] == "<module>"
    assert top["site"]["code"] == "features.append(encoder(x))"
    assert top["summary"].startswith(
        f"36 segments of 32.0 MiB are each pinned by a 20.0 MiB block allocated at train.py:{FEATURE_LINE} "
        "(features.append(encoder(x)))"
    )
    # the small-pool segment of labels: many live blocks, sizes below 1 MiB shown in KiB
    small = next(g for g in r["pinned_groups"] if g["segment_size"] == 2 * MIB)
    assert small["live_blocks"] == 8 and "16.0 KiB" in small["summary"]
    pinned = r["pinned"][0]
    assert pinned["free"] == 12 * MIB and pinned["pinners"][0]["site"]["label"] == f"train.py:{FEATURE_LINE}"
    # segments are listed most free first, each with its block layout
    assert [s["free"] for s in r["segments"]] == sorted((s["free"] for s in r["segments"]), reverse=True)
    assert r["segments"][0]["layout"] == [[0, 20 * MIB, "live"], [20 * MIB, 12 * MIB, "free"]]


def test_site_without_script_skips_torch_runpy_and_harness(train_py):
    stack = frames(train_py, FEATURE_LINE, LINEAR)
    assert analysis.allocation_site(stack)["label"] == f"train.py:{FEATURE_LINE}"
    only_library = [f for f in stack if f["filename"] != str(train_py)]
    assert analysis.allocation_site(only_library)["label"] == "inside torch or a library"
    assert analysis.allocation_site([])["label"].startswith("no Python stack")
    # with a script named, a frame in another user file deeper in the stack loses to the script's frame
    helper = [{"name": "encode", "filename": "/home/me/helpers.py", "line": 3}] + stack
    assert analysis.allocation_site(helper)["label"] == "helpers.py:3"
    assert analysis.allocation_site(helper, script=str(train_py))["label"] == f"train.py:{FEATURE_LINE}"


def test_owners_group_live_bytes_by_site(train_py):
    r = analysis.analyze(fragmented(train_py), script=str(train_py))
    owners = [(o["site"], o["bytes"], o["blocks"]) for o in r["owners"]]
    assert owners[0] == (f"train.py:{FEATURE_LINE}", 36 * 20 * MIB + 32 * MIB, 37)
    assert owners[1] == (f"train.py:{ENCODER_LINE}", 56 * MIB, 2)
    assert owners[2] == ("train.py:11", 8 * 16 * 1024, 8)


def test_healthy_snapshot_is_none(train_py):
    r = analysis.analyze(healthy(train_py), script=str(train_py))
    assert r["kind"] == "none" and r["culprit_bytes"] == 0
    t = r["totals"]
    assert t["releasable"] == 20 * MIB
    assert t["pending_free"] == 4 * MIB
    # free space next to a pending-free block cannot be released yet, but no live block pins it
    assert t["non_releasable"] == 1536 * 1024 + 16 * MIB and t["pinned_free"] == 1536 * 1024
    assert r["oom"]["failed_request"] is None
    assert r["headline"].startswith("No fragmentation: 256.5 MiB live in 298.0 MiB reserved")
    assert r["timeline"]["allocated"][-1] == t["requested"] and not r["timeline"]["starts_mid_run"]


def test_live_memory_oom_names_the_biggest_owner(train_py):
    r = analysis.analyze(live_heavy(train_py), script=str(train_py))
    assert r["kind"] == "live-memory"
    assert r["culprit_bytes"] == 1000 * MIB
    assert r["headline"] == (
        "OOM asking for 64.0 MiB with only 4.0 MiB free in the allocator's cache: 1,060.0 MiB of 1,064.0 MiB "
        f"reserved is live, the most (1,000.0 MiB in 10 blocks) allocated at train.py:{FEATURE_LINE} "
        "(features.append(encoder(x)))."
    )


def test_stranded_memory_is_fragmentation_even_when_the_request_exceeds_all_free(train_py):
    # The field notes' H200 case: half of every segment free but pinned, then a 600 MiB request.
    b = Builder()
    for _ in range(8):
        b.segment([block(32 * MIB, stack=frames(train_py, X_LINE)), block(32 * MIB, "inactive")])
    snap = b.snapshot()
    r = analysis.analyze(snap, failed_request=600 * MIB, script=str(train_py))
    assert r["oom"]["source"] == "argument" and not r["oom"]["free_would_cover"]
    assert r["kind"] == "fragmentation"
    assert r["headline"].startswith("OOM asking for 600.0 MiB while 256.0 MiB of reserved memory sat free but stranded")
    # the same memory without an OOM, under a budget it barely uses, is not worth a verdict
    assert analysis.analyze(snap, budget_bytes=8 << 30)["kind"] == "none"
    assert analysis.analyze(snap)["kind"] == "fragmentation"


def graph_pools(script: Path) -> dict:
    """A compiled model's CUDA graphs, one per input length, in their private pool: most of reserved, much of it free.

    Each recording kept its outputs (live) and the room its intermediates took (free, but the graph's); the
    allocator's own pool holds the weights and a segment with a free 96 MiB block.
    """
    b = Builder()
    b.segment([block(256 * MIB, stack=frames(script, ENCODER_LINE))])  # weights and optimizer state
    b.segment([block(32 * MIB, stack=frames(script, X_LINE)), block(96 * MIB, "inactive")])
    for length in range(1, 9):  # a larger recording for every new length
        b.segment([block(8 * MIB * length), block(40 * MIB * length, "inactive")], pool_id=(1, 0))
    b.event("oom", 120 * MIB, device_free=10 * MIB)
    return b.snapshot()


def test_memory_of_cuda_graphs_is_named_as_the_graphs_pool_not_as_fragmentation(train_py):
    r = analysis.analyze(graph_pools(train_py), script=str(train_py))
    t = r["totals"]
    assert t["private_pools"] == 1 and t["in_private_pools"] == 48 * MIB * 36 and t["free_in_private_pools"] == 40 * MIB * 36
    assert r["kind"] == "graph-pools" and r["culprit_bytes"] == t["in_private_pools"]
    assert r["headline"].startswith(
        "OOM asking for 120.0 MiB while 1,728.0 MiB of 2,112.0 MiB reserved belongs to 1 private pool (1,440.0 MiB of it free)"
    )
    assert "empty_cache() does not release them" in r["headline"]
    # The graphs' free blocks are no room for a request made outside them: only the allocator's own 96 MiB counts.
    assert r["oom"]["free_in_pool"] == 96 * MIB and not r["oom"]["fits_in_a_free_block"]
    assert any("not counted as free for the failed request" in note for note in r["notes"])
    assert {tuple(s["private_pool"] or ()) for s in r["segments"]} == {(1, 0), ()}
    # The same segments in the allocator's own pool are free space that live blocks strand: fragmentation.
    for seg in (own := graph_pools(train_py))["segments"]:
        seg["segment_pool_id"] = (0, 0)
    assert analysis.analyze(own, script=str(train_py))["kind"] == "fragmentation"


def test_request_sizes_from_the_oom_message():
    msg = (
        "CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
        "138.01 GiB is free. 1.12 GiB allowed; Of the allocated memory 780.31 MiB is allocated by PyTorch"
    )
    parsed = parse_message(msg)
    assert parsed["request"] == 32 * MIB
    assert parsed["allowed"] == round(1.12 * (1 << 30))
    assert parse_message("Tried to allocate 512.00 KiB.")["request"] == 512 * 1024
    assert parse_message("something else") == {"request": None, "allowed": None}


def test_explicit_request_wins_over_the_trace(train_py):
    r = analysis.analyze(fragmented(train_py), failed_request=8 * MIB)
    assert r["oom"]["failed_request"] == 8 * MIB and r["oom"]["source"] == "argument"
    assert r["oom"]["fits_in_a_free_block"]  # 8 MiB fits in a 12 MiB hole
    assert any("free block large enough for the failed request" in n for n in r["notes"])


# --------------------------------------------------------------------------- timeline


def test_timeline_is_anchored_on_the_end_state(train_py):
    snap = fragmented(train_py)
    r = analysis.analyze(snap, max_entries=200_000)
    tl = r["timeline"]
    assert tl["events"] == len(snap["device_traces"][0])
    assert tl["allocated"][0] == 0 and tl["reserved"][0] == 0 and not tl["starts_mid_run"]
    assert tl["allocated"][-1] == r["totals"]["requested"] and tl["reserved"][-1] == r["totals"]["reserved"]
    assert tl["oom_indices"] == [tl["events"]]
    # the transient 32 MiB activations come and go on top of the cached features
    assert any(later < earlier for earlier, later in zip(tl["allocated"], tl["allocated"][1:], strict=False))
    assert len(tl["time_us"]) == len(tl["index"])


def test_truncated_history_is_reconstructed_and_flagged(train_py):
    snap = fragmented(train_py)
    full = analysis.analyze(snap)["timeline"]
    snap["device_traces"][0] = snap["device_traces"][0][-50:]  # what a small ring buffer keeps
    r = analysis.analyze(snap, max_entries=50)
    tl = r["timeline"]
    assert tl["starts_mid_run"] and "starts mid-run" in tl["note"] and tl["note"] in r["notes"]
    assert tl["allocated"][-1] == full["allocated"][-1] and tl["reserved"][-1] == full["reserved"][-1]
    assert tl["allocated"][0] == full["allocated"][-51] and tl["allocated"][0] > 0


def test_long_history_is_downsampled_without_losing_the_peak(train_py):
    b = Builder()
    b.segment([block(64 * MIB, stack=frames(train_py, X_LINE))])
    b.transient(1 * MIB, times=3000)
    b.event("alloc", 500 * MIB, 0x2000)  # one spike in the middle of the noise
    b.event("free_requested", 500 * MIB, 0x2000)
    b.transient(1 * MIB, times=3000)
    tl = analysis.analyze(b.snapshot())["timeline"]
    assert tl["events"] > 18_000
    assert len(tl["index"]) <= analysis.MAX_TIMELINE_POINTS
    assert tl["peak_allocated"] == max(tl["allocated"]) == 564 * MIB
    assert tl["index"] == sorted(tl["index"])


# --------------------------------------------------------------------------- loading


def dump(path: Path, obj, protocol=4) -> Path:
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    return path


def test_load_snapshot_round_trip(tmp_path, train_py):
    path = probe.write_snapshot_pickle(fragmented(train_py), tmp_path / "snapshot.pickle")
    snap = analysis.load_snapshot(path)
    assert analysis.analyze(snap, script=str(train_py))["kind"] == "fragmentation"


def test_load_snapshot_fills_in_older_formats(tmp_path):
    old = {
        "segments": [
            {
                "address": 0,
                "total_size": 2 * MIB,
                "blocks": [
                    {
                        "size": 1 * MIB,
                        "state": "active_allocated",
                        "history": [{"real_size": 1000, "frames": [{"filename": "/u/t.py", "line": 3, "name": "<module>"}]}],
                    },
                    {"size": 1 * MIB, "state": "inactive"},
                ],
            }
        ]
    }
    snap = analysis.load_snapshot(dump(tmp_path / "old.pickle", old))
    seg = snap["segments"][0]
    assert seg["segment_type"] == "small" and seg["stream"] == 0 and snap["device_traces"] == []
    assert seg["blocks"][0]["frames"][0]["line"] == 3 and seg["blocks"][0]["requested_size"] == MIB


def error_from(path) -> str:
    with pytest.raises(OomLabError) as info:
        analysis.load_snapshot(path)
    assert info.value.todo, "every error says what to do"
    return str(info.value)


def test_load_snapshot_missing_file(tmp_path):
    assert "No snapshot at" in error_from(tmp_path / "nope.pickle")
    assert "folder" in error_from(tmp_path)


def test_load_snapshot_corrupt_and_truncated(tmp_path, train_py):
    (tmp_path / "empty.pickle").write_bytes(b"")
    assert "empty" in error_from(tmp_path / "empty.pickle")
    (tmp_path / "junk.pickle").write_bytes(b"this is not a pickle at all")
    assert "not a readable pickle" in error_from(tmp_path / "junk.pickle")
    whole = pickle.dumps(fragmented(train_py), protocol=4)
    (tmp_path / "cut.pickle").write_bytes(whole[: len(whole) // 2])
    assert "corrupt or truncated" in error_from(tmp_path / "cut.pickle")


def test_load_snapshot_rejects_other_pickles(tmp_path):
    assert "no 'segments'" in error_from(dump(tmp_path / "d.pickle", {"model": [1, 2, 3]}))
    assert "int" in error_from(dump(tmp_path / "n.pickle", 42))
    # a pickle that would build Python objects is refused without running anything
    import datetime

    assert "not an allocator snapshot" in error_from(dump(tmp_path / "o.pickle", {"when": datetime.date(2025, 1, 1)}))


def test_load_snapshot_names_missing_keys_of_a_foreign_format(tmp_path):
    foreign = {"segments": [{"address": 0, "size": 2 * MIB, "chunks": []}]}
    message = error_from(dump(tmp_path / "f.pickle", foreign))
    assert "segment 'total_size'" in message and "segment 'blocks'" in message and "another torch version" in message
    no_state = {"segments": [{"address": 0, "total_size": 2 * MIB, "blocks": [{"size": 2 * MIB}]}]}
    assert "block 'state'" in error_from(dump(tmp_path / "s.pickle", no_state))
    odd = {"segments": [{"address": 0, "total_size": 2 * MIB, "blocks": [{"size": 2 * MIB, "state": "reserved"}]}]}
    assert "reserved" in error_from(dump(tmp_path / "o.pickle", odd))


# --------------------------------------------------------------------------- probe


class FakeOutOfMemoryError(RuntimeError):
    pass


def fake_torch(snap: dict, calls: list, available=True, snapshot_error=None):
    """The few torch.cuda calls the probe makes, recorded. Nothing is reserved until the script has run."""
    reserved = {"now": 0}

    def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None):
        calls.append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries})

    def _snapshot(device=None):
        reserved["now"] = 7  # the script ran
        if snapshot_error:
            raise snapshot_error
        return snap

    def memory_stats(device=None):
        return {"reserved_bytes.all.current": reserved["now"], "inactive_split_bytes.all.current": 3, "num_ooms": 1}

    memory = types.SimpleNamespace(_record_memory_history=_record_memory_history, _snapshot=_snapshot)
    cuda = types.SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: 1,
        memory=memory,
        OutOfMemoryError=FakeOutOfMemoryError,
        memory_stats=memory_stats,
    )
    return types.SimpleNamespace(cuda=cuda, __version__="2.11.0+cu130")


@pytest.fixture(autouse=True)
def no_driver(monkeypatch):
    """No NVML unless a test brings a fake one: the probe's figures must not depend on the machine running the tests."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


def test_probe_writes_protocol_4_pickle_and_json(tmp_path, train_py):
    calls: list = []
    torch = fake_torch(fragmented(train_py), calls)
    tool = probe.Probe(torch, tmp_path, {"max_entries": 5000, "budget_bytes": 1_207_959_552})
    tool.start()
    assert calls == [{"enabled": "all", "context": "all", "stacks": "python", "max_entries": 5000}]
    try:
        raise FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 MiB. 1.12 GiB allowed;")
    except FakeOutOfMemoryError as exc:
        tool.finish(exc, None)
    assert calls[-1]["enabled"] is None, "recording is stopped"
    raw = (tmp_path / "snapshot.pickle").read_bytes()
    assert raw[:2] == b"\x80\x04"
    assert pickle.loads(raw)["segments"][0]["total_size"] == 16 * MIB
    result = json.loads((tmp_path / "snapshot.json").read_text())
    for key in ("tool", "kind", "headline", "culprit_bytes"):
        assert key in result
    assert result["tool"] == "snapshot" and result["kind"] == "fragmentation"
    assert result["oom"]["source"] == "trace" and result["budget_bytes"] == 1_207_959_552
    assert result["allocator_stats"] == {"reserved": 7, "inactive_split": 3, "ooms": 1}
    assert result["run_failed"] and result["error_type"] == "FakeOutOfMemoryError"
    assert result["snapshot_file"] == "snapshot.pickle"


def test_probe_falls_back_to_the_message_and_script_globals(tmp_path, train_py):
    snap = fragmented(train_py)
    snap["device_traces"][0] = [e for e in snap["device_traces"][0] if e["action"] != "oom"]
    calls: list = []
    torch = fake_torch(snap, calls)
    tool = probe.Probe(torch, tmp_path, {})
    tool.start()
    assert calls[0]["max_entries"] == probe.DEFAULT_MAX_ENTRIES
    try:
        raise FakeOutOfMemoryError("CUDA out of memory. Tried to allocate 32.00 MiB. GPU 0 ... 1.12 GiB allowed;")
    except FakeOutOfMemoryError as exc:
        tool.finish(exc, {"__file__": str(train_py)})
    result = json.loads((tmp_path / "snapshot.json").read_text())
    assert result["oom"]["failed_request"] == 32 * MIB and result["oom"]["source"] == "message"
    assert result["budget_source"] == "message" and result["budget_bytes"] == round(1.12 * (1 << 30))
    assert result["kind"] == "fragmentation"


def test_probe_never_raises(tmp_path, train_py):
    calls: list = []
    torch = fake_torch(fragmented(train_py), calls, snapshot_error=RuntimeError("driver gone"))
    tool = probe.Probe(torch, tmp_path, {})
    tool.start()
    tool.finish(None, {})
    result = json.loads((tmp_path / "snapshot.json").read_text())
    assert result["kind"] == "error" and "driver gone" in result["error"] and result["culprit_bytes"] == 0
    assert calls[-1]["enabled"] is None, "recording is stopped even when the snapshot fails"


def test_probe_on_cpu_torch_reports_no_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this test is about a machine without CUDA")
    tool = probe.Probe(torch, tmp_path, {})
    tool.start()
    tool.finish(None, {})
    result = json.loads((tmp_path / "snapshot.json").read_text())
    assert result["kind"] == "error" and "no CUDA device" in result["headline"]
    assert present.render(result) and present.draw(result, tmp_path / "pictures") == []


def filenames(obj) -> list[str]:
    """Every frame's file name in a snapshot (or part of one), in order."""
    if isinstance(obj, dict):
        own = [obj["filename"]] if "filename" in obj else []
        return own + [name for value in obj.values() for name in filenames(value)]
    if isinstance(obj, list):
        return [name for value in obj for name in filenames(value)]
    return []


def test_shared_pickle_names_no_path_of_this_machine(tmp_path):
    root = tmp_path / "course"
    variant = root / ".oomlab" / "variants" / "feature-cache" / "train.py"  # run in place of the exercise's file
    helper = root / "exercises" / "feature-cache" / "data.py"
    stack = [
        {"name": "forward", "filename": f"{TORCH_LIB}/nn/modules/linear.py", "line": 134},
        {"name": "load", "filename": str(helper), "line": 7},
        {"name": "<module>", "filename": str(variant), "line": FEATURE_LINE},
        {"name": "main", "filename": "/home/me/launch.py", "line": 3},
        {"name": "_run_code", "filename": "<frozen runpy>", "line": 88},
        {"name": "run", "filename": str(CHILD), "line": 98},
    ]
    shown = [
        "site-packages/torch/nn/modules/linear.py",
        "exercises/feature-cache/data.py",
        "exercises/feature-cache/train.py",
        "launch.py",
        "<frozen runpy>",
        "oomlab/measure/child.py",
    ]
    b = Builder()
    b.segment([block(20 * MIB, stack=stack), block(12 * MIB, "inactive")])
    b.event("oom", 32 * MIB, device_free=0, stack=stack)
    snap = b.snapshot()
    snap["segments"][0]["frames"] = stack  # where the segment itself was allocated
    labels = {str(variant): "exercises/feature-cache/train.py"}

    path = probe.write_snapshot_pickle(snap, tmp_path / "snapshot.pickle", str(root), labels)
    shared = analysis.load_snapshot(path)
    names = filenames(shared)
    assert names and not [n for n in names if os.path.isabs(n)]
    assert filenames(shared["segments"]) == shown * 2  # the segment's frames, then its live block's
    assert filenames(shared["device_traces"]) == shown * 2  # the alloc entry's, then the oom entry's
    # the run's own snapshot keeps its absolute paths: the analysis reads source lines through them
    assert filenames(snap["segments"])[:3] == [f"{TORCH_LIB}/nn/modules/linear.py", str(helper), str(variant)]

    # the probe names files with the root and labels it is given
    torch = fake_torch(snap, [])
    tool = probe.Probe(torch, tmp_path / "run", {"root": str(root), "labels": labels})
    tool.start()
    tool.finish(None, {})
    dumped = pickle.loads((tmp_path / "run" / "snapshot.pickle").read_bytes())
    assert filenames(dumped["device_traces"]) == shown * 2


def test_torch_memory_viz_reads_our_pickle(tmp_path, train_py):
    path = probe.write_snapshot_pickle(fragmented(train_py), tmp_path / "snapshot.pickle")
    done = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "segments: 40" in done.stdout
    assert "total_reserved: 1.2GiB" in done.stdout


# --------------------------------------------------------------------------- terminal and pictures


def test_render_shows_figures_groups_and_owners(train_py):
    from rich.console import Console

    r = analysis.analyze(fragmented(train_py), script=str(train_py))
    console = Console(record=True, width=200)
    for item in present.render(r):
        console.print(item)
    text = console.export_text()
    for expected in (
        "non-releasable",
        "432.0 MiB",
        "largest free block",
        "12.0 MiB",
        "no free block could hold it",
        f"train.py:{FEATURE_LINE} (features.append(encoder(x)))",
        "752.0",
        "failed at",
    ):
        assert expected in text, expected


def test_draw_writes_pictures(tmp_path, train_py):
    r = analysis.analyze(fragmented(train_py, pinned=80), script=str(train_py), budget_bytes=1_207_959_552)
    paths = present.draw(r, tmp_path)
    assert [p.name for p in paths] == ["segments.png", "timeline.png"]
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        width = int.from_bytes(data[16:20], "big")
        assert width >= 1200


def test_draw_an_empty_snapshot(tmp_path):
    r = analysis.analyze({"segments": [], "device_traces": []})
    assert r["kind"] == "none"
    assert all(p.stat().st_size > 0 for p in present.draw(r, tmp_path))


# --------------------------------------------------------------------------- memory outside the allocator


def probe_with_driver(tmp_path, snap, monkeypatch, at_start: int, at_snapshot: int) -> dict:
    """Run the probe on ``snap`` with a fake driver that counts ``at_start``, then ``at_snapshot``, for this process."""
    devices = [[(os.getpid(), at_start)]]
    module, _ = fake_pynvml(devices)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    torch = fake_torch(snap, [])
    taken = torch.cuda.memory._snapshot

    def snapshot_as_the_driver_moves(device=None):
        devices[0] = [(os.getpid(), at_snapshot)]
        return taken(device)

    torch.cuda.memory._snapshot = snapshot_as_the_driver_moves
    tool = probe.Probe(torch, tmp_path, {})
    tool.start()
    tool.finish(None, {})
    return json.loads((tmp_path / "snapshot.json").read_text())


def test_probe_reports_what_the_driver_counts_beside_reserved(tmp_path, train_py, monkeypatch):
    reserved = (16 + 40 + 2 + 36 * 32 + 32) * MIB  # the fragmented snapshot's segments
    result = probe_with_driver(tmp_path, fragmented(train_py), monkeypatch, 520 * MIB, reserved + 742 * MIB)
    driver = result["driver"]
    assert driver["available"] and driver["used"] == reserved + 742 * MIB and driver["reserved"] == reserved
    assert driver["outside"] == 742 * MIB
    assert (driver["context"], driver["context_source"], driver["rest"]) == (520 * MIB, "start", 222 * MIB)
    assert driver["summary"].startswith(
        "The driver says this process uses 1,984.0 MiB; the allocator reserved 1,242.0 MiB; outside the allocator 742.0 MiB "
        "(the CUDA context about 520.0 MiB, measured in this process when the script began; the rest, 222.0 MiB:"
    )
    from rich.console import Console

    console = Console(record=True, width=300)
    for item in present.render(result):
        console.print(item)
    text = console.export_text()
    assert "driver (NVML)" in text and "1,984.0 MiB" in text and "outside the allocator" in text
    assert driver["summary"][:80] in text


def test_probe_without_nvml_says_the_figure_is_unavailable(tmp_path, train_py, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    tool = probe.Probe(fake_torch(fragmented(train_py), []), tmp_path, {})
    tool.start()
    tool.finish(None, {})
    result = json.loads((tmp_path / "snapshot.json").read_text())
    assert result["kind"] == "fragmentation", "the analysis stands without the driver's figure"
    assert result["driver"] == {
        "available": False,
        "reason": "NVML's Python bindings are not installed (pip install nvidia-ml-py)",
        "summary": "The driver's figure for this process (NVML) is unavailable: NVML's Python bindings are not installed "
        "(pip install nvidia-ml-py).",
    }


def test_a_snapshot_from_a_file_has_no_driver_figure(train_py):
    from rich.console import Console

    r = analysis.analyze(fragmented(train_py))
    assert r["driver"] is None
    console = Console(record=True, width=200)
    for item in present.render(r):
        console.print(item)
    assert "driver" not in console.export_text()


# --------------------------------------------------------------------------- big snapshots


def test_a_big_snapshot_gives_a_bounded_result():
    from oomlab.bench.big_snapshot import synthetic

    snap = synthetic(events=60_000, depth=24)
    pickled = len(pickle.dumps(snap, protocol=4))
    trace = snap["device_traces"][0]
    assert len(trace) == 60_000 and pickled > 5 * MIB
    r = analysis.analyze(snap, max_entries=200_000)
    assert r["totals"]["segments"] == len(snap["segments"]) == 120  # the totals count every segment
    assert len(r["segments"]) == min(120, analysis.MAX_LISTED_SEGMENTS)
    assert max(len(s["layout"]) for s in r["segments"]) == analysis.MAX_LAYOUT_RUNS  # the 1,024-block segment
    tl = r["timeline"]
    assert tl["events"] == 60_000 and len(tl["index"]) <= analysis.MAX_TIMELINE_POINTS
    # the peak survives the downsampling: walk the whole history here, the slow way
    level = r["totals"]["requested"] - sum(analysis.ALLOCATED_DELTA.get(e["action"], 0) * e["size"] for e in trace)
    peak = level
    for e in trace:
        level += analysis.ALLOCATED_DELTA.get(e["action"], 0) * e["size"]
        peak = max(peak, level)
    assert tl["peak_allocated"] == peak == max(tl["allocated"])
    assert len(json.dumps(r)) < pickled / 10


def test_a_segment_of_many_blocks_is_listed_in_a_bounded_layout(tmp_path):
    b = Builder()
    b.segment([block(2048, "active_allocated" if k % 2 == 0 else "inactive") for k in range(1024)], pool="small")
    b.segment(
        [block(2048, "active_allocated" if k % 2 == 0 else "inactive") for k in range(analysis.MAX_LAYOUT_RUNS)], pool="small"
    )
    result = analysis.analyze(b.snapshot())
    many, exact = sorted(result["segments"], key=lambda s: -s["total"])
    assert len(many["layout"]) == analysis.MAX_LAYOUT_RUNS
    *drawn, rest = many["layout"]
    assert rest == [(analysis.MAX_LAYOUT_RUNS - 1) * 2048, 2 * MIB - (analysis.MAX_LAYOUT_RUNS - 1) * 2048, analysis.MIXED]
    assert [run[2] for run in drawn[:4]] == ["live", "free", "live", "free"]
    assert all(a[0] + a[1] == b[0] for a, b in zip(many["layout"], many["layout"][1:], strict=False))
    assert many["free"] == 512 * 2048 and many["largest_free"] == 2048  # the figures still count every block
    # exactly as many runs as listed: nothing summarised
    assert len(exact["layout"]) == analysis.MAX_LAYOUT_RUNS and analysis.MIXED not in {run[2] for run in exact["layout"]}
    assert [p.name for p in present.draw(result, tmp_path)] == ["segments.png", "timeline.png"]


def test_the_shared_pickle_keeps_torchs_shared_frames(tmp_path):
    from oomlab.bench.big_snapshot import SCRIPT, synthetic

    snap = synthetic(events=20_000, depth=24)
    as_torch_writes_it = len(pickle.dumps(snap, protocol=4))
    path = probe.write_snapshot_pickle(snap, tmp_path / "snapshot.pickle", root="/home/learner/project")
    assert path.stat().st_size < 1.02 * as_torch_writes_it  # not one copy of each frame per event
    shared = analysis.load_snapshot(path)
    trace = shared["device_traces"][0]
    script_frames = {id(f) for e in trace for f in e["frames"] if f["filename"] == "train.py"}
    assert 0 < len(script_frames) <= 50  # the synthetic script's 50 lines, each one frame shared by many events
    live = next(b for seg in shared["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
    assert any(e["frames"] is live["frames"] for e in trace), "a block shares its stack with its alloc event"
    assert SCRIPT in {f["filename"] for e in snap["device_traces"][0] for f in e["frames"]}, "the run's snapshot keeps its names"


def test_file_names_come_back_when_writing_fails(tmp_path, train_py):
    snap = fragmented(train_py)
    before = filenames(snap)
    with pytest.raises(RuntimeError), analysis.shareable(snap, str(tmp_path)):
        assert str(train_py) not in filenames(snap)
        raise RuntimeError("disk full")
    assert filenames(snap) == before


def test_downsample_reads_points_as_they_come():
    def points():
        for i in range(10_001):
            yield i, (900 if i == 4321 else i % 7), i % 5, i * 10

    index, alloc, res, times = analysis.downsample(points(), 10_001, 100)
    assert len(index) == 100 and max(alloc) == 900 and max(res) == 4
    assert 4321 in index and times[index.index(4321)] == 43210
    assert analysis.downsample(iter([]), 0, 100) == ([], [], [], [])


def test_the_big_snapshot_bench_runs_end_to_end_on_a_small_one(tmp_path):
    from oomlab.bench import big_snapshot

    report = big_snapshot.measure(events=20_000, depth=16, source="synthetic", keep=tmp_path)
    assert report["source"] == "synthetic" and report["events"] == 20_000
    assert report["pickle_bytes"] == (tmp_path / "snapshot.pickle").stat().st_size
    # the probe's dump of it: shorter file names, every shared frame still written once
    assert 0.8 * report["pickle_bytes"] < report["dumped_bytes"] < 1.02 * report["pickle_bytes"]
    steps = [report["rss_after"][k] for k in ("imports", "load", "analyze", "render", "draw", "dump")]
    assert steps == sorted(steps) and report["peak_rss_bytes"] == steps[-1]
    assert report["timeline_points"] <= analysis.MAX_TIMELINE_POINTS and report["kind"] == "fragmentation"
    assert sorted(p.name for p in (tmp_path / "pictures").glob("*.png")) == ["segments.png", "timeline.png"]
    json.dumps(report)


# --------------------------------------------------------------------------- on a GPU

GPU_SCRIPT = textwrap.dedent(
    """\
    import torch
    keep = []
    for _ in range(28):
        big = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
        del big
        keep.append(torch.empty(20 << 20, dtype=torch.uint8, device="cuda"))  # lands in the freed 32 MiB block
    torch.empty(200 << 20, dtype=torch.uint8, device="cuda")  # 336 MiB free, but in 12 MiB pieces
    """
)
GPU_DRIVER = textwrap.dedent(
    """\
    import pathlib, runpy, sys, torch
    from oomlab.tools.snapshot.probe import Probe
    script, out = sys.argv[1], pathlib.Path(sys.argv[2])
    budget = 1 << 30
    torch.cuda.set_per_process_memory_fraction(budget / torch.cuda.get_device_properties(0).total_memory)
    torch.cuda.mem_get_info()  # makes the CUDA context before the script, as the measuring child does
    probe = Probe(torch, out, {"budget_bytes": budget, "script": script})
    probe.start()
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as exc:
        probe.finish(exc, None)
    else:
        probe.finish(None, {})
    """
)


GRAPHS_SCRIPT = textwrap.dedent(
    """\
    import torch
    layer = torch.nn.Linear(1024, 1024, device="cuda")
    graphs = []
    with torch.no_grad():
        for rows in range(256, 4096, 256):  # a CUDA graph recorded for every batch size, each in its own pool
            x = torch.randn(rows, 1024, device="cuda")
            layer(x)  # warm up before capturing, as torch.cuda.graph asks
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                y = layer(x).relu()
            graphs.append((graph, x, y))
    torch.empty(1 << 30, dtype=torch.uint8, device="cuda")  # more than the 1 GiB budget leaves
    """
)


def probed_on_the_gpu(tmp_path: Path, name: str, source: str) -> dict:
    """The probe's result for ``source`` run as ``name`` on the GPU under a 1 GiB budget (GPU_DRIVER)."""
    script = tmp_path / name
    script.write_text(source)
    driver = tmp_path / "driver.py"
    driver.write_text(GPU_DRIVER)
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(driver), str(script), str(tmp_path / "out")],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "out" / "snapshot.json").read_text())


@pytest.mark.gpu
def test_probe_names_the_pools_of_real_cuda_graphs(tmp_path):
    result = probed_on_the_gpu(tmp_path, "graphs.py", GRAPHS_SCRIPT)
    totals = result["totals"]
    assert totals["private_pools"] == 15, totals  # torch.cuda.graph gives each capture a pool of its own
    assert totals["in_private_pools"] > 0.5 * totals["reserved"]
    assert result["kind"] == "graph-pools", result["headline"]


@pytest.mark.gpu
def test_probe_on_a_real_oom(tmp_path):
    result = probed_on_the_gpu(tmp_path, "frag.py", GPU_SCRIPT)
    assert (tmp_path / "out" / "snapshot.pickle").read_bytes()[:2] == b"\x80\x04"
    stats = result["allocator_stats"]
    assert result["totals"]["reserved"] == stats["reserved"]
    assert result["totals"]["allocated"] == stats["allocated"]
    assert result["totals"]["non_releasable"] == stats["inactive_split"]
    assert result["kind"] == "fragmentation", result["headline"]
    assert result["oom"]["failed_request"] == 200 * MIB and not result["oom"]["fits_in_a_free_block"]
    assert result["pinned_groups"][0]["site"]["label"] == "frag.py:6"
    assert result["timeline"]["allocated"][-1] == result["totals"]["requested"]
    driver = result["driver"]  # the driver's figure where nvidia-ml-py is installed, else why not
    if driver["available"]:
        assert driver["reserved"] == result["totals"]["reserved"] and driver["context_source"] == "start"
        assert driver["context"] > 100 * MIB, "a CUDA context costs hundreds of MiB"
        assert driver["summary"].startswith("The driver says this process uses")
    else:
        assert "unavailable" in driver["summary"] and driver["reason"]
