"""What the OOM hook costs before any OOM: ``python -m oomlab.bench.oom_hook`` prints one JSON object.

Two real training loops on CUDA, each a few hundred optimizer steps from a
fixed seed: a small transformer language model (embedding, six encoder
layers, a vocabulary head, cross-entropy) whose steps keep the GPU busy, and
a small MLP whose steps are so short that any cost per allocation shows.
Each loop runs in three variants, interleaved ``repeat`` times so that a
drift of the machine is shared out:

- ``plain``: the loop alone;
- ``history_off``: inside ``oom_report(record_history=False)``, so what remains
  is the holders' step hook (``watch_steps``) and its one walk after step 1;
- ``history_on``: inside ``oom_report()`` as shipped: allocation history with
  Python stacks and a bounded ring buffer (``max_entries``).

Every step ends with ``torch.cuda.synchronize()`` and is timed whole on the
host. A host-side cost (the history's stack per allocation, a step hook) shows
in the step time only where the host sets the pace, as in the MLP; where the GPU
does, as in the transformer, the host runs ahead of it within the step and the
cost hides behind the GPU's work, as it would in training. Per variant the
result gives the median step, the first step (where the holders' baseline walk
happens), entering and leaving the hook, the peak GPU memory, allocations per
step, and how much the host's resident memory grew during the run (the
history's ring buffer lives there). The ``overhead`` fractions compare median
steps with ``plain``; ``history_gpu_bytes`` is what recording adds to the peaks
on the GPU.

Last, ``at_oom`` times the report itself: a request far larger than the GPU
inside the hook, after a full run with history on, and the size of what it wrote.

A benchmark, not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from oomlab.errors import OomLabError
from oomlab.oom_hook import DEFAULT_MAX_ENTRIES, oom_report

__all__ = ["VARIANTS", "measure"]

VARIANTS = ("plain", "history_off", "history_on")
STEPS = 300
WARMUP_STEPS = 20  # before the first timed run: cuBLAS handles, kernels, the allocator's first segments


def _transformer(torch):
    """A small language model step: 6 encoder layers of width 512 over 32 sequences of 256 tokens."""
    nn, F = torch.nn, torch.nn.functional
    vocab, width, batch, length = 8192, 512, 32, 256

    class LanguageModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            layer = nn.TransformerEncoderLayer(width, nhead=8, dim_feedforward=4 * width, batch_first=True, dropout=0.0)
            self.encoder = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            return self.head(self.encoder(self.embed(tokens)))

    model = LanguageModel().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    def step():
        tokens = torch.randint(0, vocab, (batch, length + 1), device="cuda")
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def _mlp(torch):
    """A small MLP step: short kernels, so the step is mostly the host launching them and allocating."""
    nn, F = torch.nn, torch.nn.functional
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        x = torch.randn(512, 256, device="cuda")
        y = torch.randint(0, 10, (512,), device="cuda")
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


LOOPS = {"transformer": _transformer, "mlp": _mlp}


def _resident_bytes() -> int | None:
    """This process's resident host memory now (Linux), or None where /proc cannot say."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _hook(variant: str, folder: Path, max_entries: int):
    if variant == "plain":
        return None
    return oom_report(folder, record_history=variant == "history_on", max_entries=max_entries)


def _run(torch, build, variant: str, steps: int, folder: Path, max_entries: int) -> dict:
    """One run of ``steps`` timed steps of a freshly seeded loop, in ``variant``."""
    torch.manual_seed(0)
    step = build(torch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    allocations_before = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
    resident_before = _resident_bytes()
    hook = _hook(variant, folder, max_entries)
    entered = time.perf_counter()
    if hook is not None:
        hook.__enter__()
    enter_s = time.perf_counter() - entered
    times = []
    try:
        for _ in range(steps):
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        resident_after = _resident_bytes()
    finally:
        left = time.perf_counter()
        if hook is not None:
            hook.__exit__(None, None, None)
        exit_s = time.perf_counter() - left
    stats = torch.cuda.memory_stats()
    del step
    torch.cuda.empty_cache()
    return {
        "times": times,
        "enter_s": enter_s,
        "exit_s": exit_s,
        "peak_allocated": stats["allocated_bytes.all.peak"],
        "peak_reserved": stats["reserved_bytes.all.peak"],
        "allocations_per_step": (stats.get("allocation.all.allocated", 0) - allocations_before) / steps,
        "host_growth": None if resident_before is None or resident_after is None else resident_after - resident_before,
    }


def _summary(runs: list[dict]) -> dict:
    """One variant over its runs: medians, in milliseconds and bytes."""

    def ms(seconds: float) -> float:
        return round(1000 * seconds, 3)

    steps = [t for r in runs for t in r["times"][1:]]  # the first step of a run is reported on its own
    growth = [r["host_growth"] for r in runs if r["host_growth"] is not None]
    return {
        "median_step_ms": ms(statistics.median(steps)),
        "p90_step_ms": ms(statistics.quantiles(steps, n=10)[-1]),
        "first_step_ms": ms(statistics.median(r["times"][0] for r in runs)),
        "enter_ms": ms(statistics.median(r["enter_s"] for r in runs)),
        "exit_ms": ms(statistics.median(r["exit_s"] for r in runs)),
        "peak_allocated": max(r["peak_allocated"] for r in runs),
        "peak_reserved": max(r["peak_reserved"] for r in runs),
        "allocations_per_step": round(statistics.median(r["allocations_per_step"] for r in runs), 1),
        "host_growth_bytes": int(statistics.median(growth)) if growth else None,
    }


def _at_oom(torch, build, steps: int, folder: Path, max_entries: int) -> dict:
    """The report's own cost: an impossible request inside the hook, after ``steps`` steps with history on."""
    torch.manual_seed(0)
    step = build(torch)
    impossible = 2 * torch.cuda.get_device_properties(0).total_memory
    hook = oom_report(folder, max_entries=max_entries)
    raised = None
    try:
        with hook:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            started = time.perf_counter()
            torch.empty(impossible, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as err:
        raised = err
    report_s = time.perf_counter() - started
    del step
    torch.cuda.empty_cache()
    written = hook.last_report
    sizes = {p.relative_to(written).as_posix(): p.stat().st_size for p in written.rglob("*") if p.is_file()} if written else {}
    return {
        "report_s": round(report_s, 3),
        "oom_propagated": raised is not None and getattr(raised, "oomlab_report", None) == written,
        "files": sorted(sizes),
        "snapshot_bytes": sizes.get("cuda0/snapshot.pickle"),
        "report_bytes": sum(sizes.values()),
    }


def measure(repeat: int = 3, steps: int = STEPS, max_entries: int = DEFAULT_MAX_ENTRIES) -> dict:
    """Time each loop plain and inside the hook (history off, history on): see the module's docstring."""
    import torch

    if not torch.cuda.is_available():
        raise OomLabError("The OOM hook's benchmark needs a CUDA GPU, and torch sees none.", "Run it on a GPU machine.")
    folder = Path(tempfile.mkdtemp(prefix="oomlab-bench-oom-hook-"))
    try:
        result: dict = {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "repeat": repeat,
            "steps": steps,
            "max_entries": max_entries,
            "stacks": "python",
            "loops": {},
        }
        for name, build in LOOPS.items():
            warm = build(torch)
            for _ in range(WARMUP_STEPS):
                warm()
            del warm
            runs: dict[str, list] = {v: [] for v in VARIANTS}
            for _ in range(repeat):
                for variant in VARIANTS:
                    runs[variant].append(_run(torch, build, variant, steps, folder / "reports", max_entries))
            summary = {v: _summary(r) for v, r in runs.items()}
            plain = summary["plain"]["median_step_ms"]
            result["loops"][name] = {
                **summary,
                "overhead": {v: round(summary[v]["median_step_ms"] / plain - 1, 4) for v in VARIANTS[1:]},
                "history_gpu_bytes": {
                    "peak_allocated": summary["history_on"]["peak_allocated"] - summary["history_off"]["peak_allocated"],
                    "peak_reserved": summary["history_on"]["peak_reserved"] - summary["history_off"]["peak_reserved"],
                },
            }
        result["at_oom"] = _at_oom(torch, LOOPS["transformer"], steps, folder / "at-oom", max_entries)
        result["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m oomlab.bench.oom_hook", description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each variant (default 3)")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"timed optimizer steps per run (default {STEPS})")
    parser.add_argument("--max-entries", type=int, default=DEFAULT_MAX_ENTRIES, help="the history's ring buffer")
    args = parser.parse_args()
    print(json.dumps(measure(args.repeat, args.steps, args.max_entries), indent=1))


if __name__ == "__main__":
    main()
