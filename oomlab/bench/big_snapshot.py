"""The snapshot tool on a big snapshot: its own time and memory on a pickle of a few hundred MB.

``python -m oomlab.bench.big_snapshot`` prints one JSON object. :func:`measure`
makes the snapshot, then reads it the way ``oomlab snapshot FILE.pickle`` does,
in a fresh process, and times each phase:

- ``load_s``: :func:`~oomlab.tools.snapshot.analysis.load_snapshot`, unpickling it;
- ``analyze_s``: :func:`~oomlab.tools.snapshot.analysis.analyze`;
- ``render_s`` and ``draw_s``: the terminal report and the two pictures;
- ``dump_s``: :func:`~oomlab.tools.snapshot.probe.write_snapshot_pickle`, the
  shareable copy the probe writes inside the measured process.

``rss_after`` is that process's peak resident memory (``ru_maxrss``, a
high-water mark) after each phase, so each phase's cost is the step from the
one before; ``rss_after["imports"]`` is what Python, rich and matplotlib cost
before any snapshot. ``result_json_bytes`` and ``timeline_points`` show that
the result stays small however big the snapshot is.

The snapshot is made one of two ways (``source``):

- ``synthetic``, anywhere: :func:`synthetic` builds one shaped like torch's
  (frames shared between events, a block sharing its stack with its "alloc"
  event, Python stacks ``depth`` frames deep, thousands of segments, a few cut
  into hundreds of blocks), deterministic for a given size, and pickles it
  as ``torch.cuda.memory._dump_snapshot`` does;
- ``cuda``, on a GPU: a workload allocates and frees tensors from a recursive
  Python call ``depth`` frames deep with the history recorded (Python stacks,
  a ring buffer as large as ``events``), and the probe's own
  :func:`~oomlab.tools.snapshot.probe.write_snapshot_pickle` dumps it;
  ``snapshot_s`` and ``write_s`` time the probe's side there.

A benchmark, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import io
import json
import pickle
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from oomlab.units import MIB

__all__ = ["DEFAULT_EVENTS", "measure", "synthetic"]

DEFAULT_EVENTS = 2_400_000  # about 300 MB pickled, synthetic, at the default depth
DEFAULT_DEPTH = 32
SCRIPT = "/home/learner/project/train.py"
LIBRARY = "/opt/venv/lib/python3.12/site-packages/torch"
LIBRARY_FILES = ("nn/modules/module.py", "nn/modules/linear.py", "nn/modules/container.py", "nn/functional.py", "optim/adamw.py")
OUTER = (("<frozen runpy>", 88, "_run_code"), ("<frozen runpy>", 286, "run_path"), ("/opt/oomlab/measure/child.py", 98, "run"))


# --------------------------------------------------------------------------- a synthetic snapshot


def synthetic(events: int = DEFAULT_EVENTS, depth: int = DEFAULT_DEPTH, seed: int = 0) -> dict:
    """A snapshot of ``events`` history entries, shaped like ``torch.cuda.memory._snapshot()``'s.

    One segment per 500 events (at least 40): most are large segments of two
    to four blocks, some live and some free; one in four is a 2 MiB small-pool
    segment of 64 blocks, and one in a hundred is cut into 1,024 blocks of
    2 KiB, live and free in turn. The history allocates each segment and its
    live blocks, then pairs of allocations and frees that leave nothing
    behind, and ends on an "oom". The same ``events``, ``depth`` and ``seed``
    give the same snapshot.
    """
    rng = random.Random(seed)
    pool = [
        {"filename": f"{LIBRARY}/{LIBRARY_FILES[i % len(LIBRARY_FILES)]}", "line": 100 + i, "name": f"forward_{i % 97}"}
        for i in range(2000)
    ]
    script_frames = [{"filename": SCRIPT, "line": line, "name": "<module>"} for line in range(10, 60)]
    outer = [{"filename": f, "line": line, "name": name} for f, line, name in OUTER]
    inner_depth = max(0, depth - 1 - len(outer))
    paths = [rng.sample(pool, inner_depth) for _ in range(5000)]  # the library calls an allocation comes through
    clock = 1_796_019_987_000_000
    trace: list[dict] = []

    def stack() -> list[dict]:
        # torch builds each distinct frame once and a new list per event: the same here.
        return [*paths[rng.randrange(len(paths))], script_frames[rng.randrange(len(script_frames))], *outer]

    def event(action: str, size: int, addr: int, frames: list) -> None:
        nonlocal clock
        clock += rng.randint(1, 40)
        where = "device_free" if action == "oom" else "addr"
        trace.append(
            {
                "action": action,
                where: addr,
                "size": size,
                "stream": 0,
                "time_us": clock,
                "compile_context": "N/A",
                "user_metadata": "",
                "frames": frames,
            }
        )

    segments = []
    address = 0x7F0000000000
    for n in range(max(40, events // 500)):
        if n % 100 == 99:
            sizes, pool_name = [2048] * 1024, "small"
        elif n % 4 == 3:
            sizes, pool_name = [32 * 1024] * 64, "small"
        else:
            sizes, pool_name = [rng.choice((2, 4, 8, 12, 20)) * MIB for _ in range(rng.randint(2, 4))], "large"
        total = sum(sizes)
        event("segment_alloc", total, address, stack())
        blocks, offset = [], address
        for k, size in enumerate(sizes):
            live = k % 2 == 0
            frames = stack() if live else []
            if live:
                event("alloc", size, offset, frames)  # the block and its event share one stack, as in torch
            state = "active_allocated" if live else "inactive"
            blocks.append({"address": offset, "size": size, "requested_size": size, "state": state, "frames": frames})
            offset += size
        allocated = sum(b["size"] for b in blocks if b["state"] != "inactive")
        segments.append(
            {
                "device": 0,
                "address": address,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "requested_size": allocated,
                "stream": 0,
                "segment_type": pool_name,
                "segment_pool_id": (0, 0),
                "is_expandable": False,
                "frames": [],
                "blocks": blocks,
            }
        )
        address += total + 64 * MIB
    while len(trace) < events - 1:
        size = rng.choice((4096, 65536, MIB, 4 * MIB))
        frames = stack()
        for action in ("alloc", "free_requested", "free_completed"):
            event(action, size, 0x1000, frames)
    del trace[max(0, events - 1) :]
    event("oom", 64 * MIB, 0, stack())
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {}, "external_annotations": []}


def build(path: Path, events: int, depth: int) -> dict:
    """Write :func:`synthetic`'s snapshot to ``path`` as torch's ``_dump_snapshot`` does (pickle protocol 4)."""
    started = time.perf_counter()
    snapshot = synthetic(events, depth)
    with open(path, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    return {"source": "synthetic", "build_s": round(time.perf_counter() - started, 2)}


# --------------------------------------------------------------------------- a recorded snapshot


def record(path: Path, events: int, depth: int) -> dict:
    """Record a workload's history on the GPU and dump it as the probe does."""
    import torch

    from oomlab.tools.snapshot.probe import write_snapshot_pickle

    torch.cuda.memory._record_memory_history(max_entries=events, stacks="python")
    rng = random.Random(0)
    kept: list = []

    def nested(level: int):
        if level:
            return nested(level - 1)
        size = rng.choice((4096, 65536, MIB, 3 * MIB))
        tensor = torch.empty(size, dtype=torch.uint8, device="cuda")
        if rng.random() < 0.02:
            kept.append(tensor)  # a few stay alive, so segments end up shared by live and free blocks
            if len(kept) > 2000:
                kept.pop(rng.randrange(len(kept)))
        return tensor

    started = time.perf_counter()
    for _ in range(events // 3 + 1):  # an allocation and its free: three events
        nested(max(0, depth - 4))
    torch.cuda.synchronize()
    recorded = time.perf_counter()
    snapshot = torch.cuda.memory._snapshot()
    snapped = time.perf_counter()
    write_snapshot_pickle(snapshot, path)
    written = time.perf_counter()
    torch.cuda.memory._record_memory_history(enabled=None)
    return {
        "source": "cuda",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "record_s": round(recorded - started, 2),
        "snapshot_s": round(snapped - recorded, 2),
        "write_s": round(written - snapped, 2),
    }


# --------------------------------------------------------------------------- reading it, as the tool does


def _peak_rss() -> int:
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def read(path: Path, out_dir: Path) -> dict:
    """Load, analyze, render, draw and dump ``path`` in this process; each phase's seconds and the peak memory after it."""
    from rich.console import Console

    from oomlab.tools.base import pyplot
    from oomlab.tools.snapshot import analysis, present, probe

    pyplot()  # matplotlib's import is the imports' cost, not the drawing's
    rss, seconds = {"imports": _peak_rss()}, {}

    def phase(name: str, work):
        started = time.perf_counter()
        value = work()
        seconds[f"{name}_s"] = round(time.perf_counter() - started, 2)
        rss[name] = _peak_rss()
        return value

    snapshot = phase("load", lambda: analysis.load_snapshot(path))
    result = phase("analyze", lambda: analysis.analyze(snapshot, script=SCRIPT))
    console = Console(file=io.StringIO(), width=160)
    phase("render", lambda: [console.print(part) for part in present.render(result)])
    phase("draw", lambda: present.draw(result, out_dir))
    copy = out_dir / "shareable.pickle"
    phase("dump", lambda: probe.write_snapshot_pickle(snapshot, copy))
    return {
        **seconds,
        "rss_after": rss,
        "peak_rss_bytes": max(rss.values()),
        "events": len(analysis.device_trace(snapshot)),
        "segments": len(snapshot["segments"]),
        "blocks": sum(len(s["blocks"]) for s in snapshot["segments"]),
        "dumped_bytes": copy.stat().st_size,
        "result_json_bytes": len(json.dumps(result, default=str)),
        "timeline_points": len(result["timeline"]["index"]),
        "segments_listed": len(result["segments"]),
        "kind": result["kind"],
    }


def _child(*args: str) -> dict:
    """Run this module in a fresh process and return the JSON object it prints last."""
    done = subprocess.run([sys.executable, "-m", "oomlab.bench.big_snapshot", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(args)}` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(events: int = DEFAULT_EVENTS, depth: int = DEFAULT_DEPTH, source: str = "auto", keep: Path | None = None) -> dict:
    """Make a snapshot of ``events`` history entries (``source``: ``auto``, ``synthetic`` or ``cuda``) and time the tool on it.

    ``auto`` records on CUDA where torch sees a GPU, else builds a synthetic
    snapshot. Each step runs in a process of its own, so that the reading
    process's memory is the tool's alone. ``keep`` names a folder for the
    snapshot and pictures (default: a temporary one, removed after).
    """
    if source == "auto":
        import torch

        source = "cuda" if torch.cuda.is_available() else "synthetic"
    folder = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="oomlab-big-snapshot-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "snapshot.pickle"
    try:
        made = _child("--make", source, "--events", str(events), "--depth", str(depth), "--path", str(path))
        report = {"events_asked": events, "depth": depth, **made, "pickle_bytes": path.stat().st_size}
        report.update(_child("--read", str(path), "--out", str(folder / "pictures")))
        return report
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m oomlab.bench.big_snapshot", description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=DEFAULT_EVENTS, help="history entries in the snapshot")
    parser.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help="frames in each event's stack")
    parser.add_argument("--source", choices=("auto", "synthetic", "cuda"), default="auto")
    parser.add_argument("--keep", type=Path, help="keep the snapshot and pictures in this folder")
    parser.add_argument("--make", choices=("synthetic", "cuda"), help=argparse.SUPPRESS)  # the steps' own processes
    parser.add_argument("--path", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--read", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.make:
        made = (build if args.make == "synthetic" else record)(args.path, args.events, args.depth)
        print(json.dumps(made))
    elif args.read:
        print(json.dumps(read(args.read, args.out)))
    else:
        print(json.dumps(measure(args.events, args.depth, args.source, args.keep), indent=1))


if __name__ == "__main__":
    main()
