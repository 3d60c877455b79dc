"""How much of a training step's GPU memory the profiler's memory model names.

``torch.profiler`` with ``profile_memory=True`` records every allocation; its memory
model (``torch.profiler._memory_profiler.MemoryProfile``, a private API) then tries to
name each tensor: parameter, gradient, optimizer state, activation, temporary, input or
autograd detail. This probe profiles three training steps of a small MLP on the GPU, the
forward passes marked with ``record_function``, and counts the bytes allocated on the
GPU that the model named, in the forward passes and in the whole run.

Run by ``oomlab dev facts`` in a fresh process; prints one JSON object.
"""

import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, record_function

# PYTORCH_CUDA_ALLOC_CONF for this probe: the defaults.
ALLOC_CONF = ""

DEVICE, STEPS, FORWARD = "cuda", 3, "oomlab::forward"


def main() -> None:
    from torch._C._profiler import _EventType
    from torch.profiler import _memory_profiler as mp

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 10)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 512, device=DEVICE), torch.randint(10, (256,), device=DEVICE)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=activities, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        for _ in range(STEPS):
            with record_function(FORWARD):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    memory = mp.MemoryProfile(prof.profiler.kineto_results)
    named: dict = {}  # a tensor's category: that of its earliest version that has one
    for (key, _version), category in sorted(memory._category_snapshot().items(), key=lambda kv: kv[0][1]):
        if category is not None:
            named.setdefault(key, category.name.lower())
    events = list(memory._op_tree.dfs())
    forward = [(e.start_time_ns, e.end_time_ns) for e in events if e.name == FORWARD]
    totals = {"forward": {}, "all": {}}
    for e in events:
        if e.typed[0] != _EventType.Allocation:
            continue
        fields = e.typed[1]
        if fields.alloc_size <= 0 or fields.device.type != DEVICE:
            continue
        key = mp.TensorKey.from_allocation(fields)
        category = (named.get(key) if key is not None else None) or "unnamed"
        scopes = ["all"] + (["forward"] if any(a <= e.start_time_ns <= b for a, b in forward) else [])
        for scope in scopes:
            totals[scope][category] = totals[scope].get(category, 0) + fields.alloc_size
    facts: dict = {"steps": STEPS, "forward_passes_seen": len(forward)}
    for scope, by_category in totals.items():
        total = sum(by_category.values())
        unnamed = by_category.get("unnamed", 0)
        facts[scope] = {
            "allocated_bytes": total,
            "named_bytes": total - unnamed,
            "unnamed_bytes": unnamed,
            "named_fraction": (total - unnamed) / total if total else None,
            "by_category_bytes": dict(sorted(by_category.items())),
        }
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
